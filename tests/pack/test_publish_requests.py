"""Publishing an incremental pack checks only the objects new relative to the base."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from support.pack import KeyLog, make_source, small_frame

import shardlake
from shardlake.errors import ConflictError
from shardlake.meta.commits import read_state
from shardlake.meta.publish import VersionBody, publish_version
from shardlake.meta.state import RootState
from shardlake.store import open_store


def _partitions(src: Path, names: list[str]) -> None:
    make_source(src, {f"{n}/f{i}": small_frame(i) for n in names for i in range(2)})


def test_incremental_publish_lists_only_new_revisions(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _partitions(src, [f"log{i}" for i in range(6)])
    store = open_store(str(tmp_path / "root"))
    shardlake.open(store).pack(src, tag="v1", workers=0)
    _partitions(src, ["log_new"])
    log = KeyLog()
    version = (
        shardlake.open(store.with_layers(log)).pack(src, tag="v2", base="v1", workers=0).record
    )
    calls = log.calls
    assert version.partition_count == 7
    listed = sorted(key for op, key in calls if op == "list")
    assert "data/" not in listed
    new = next(p for p in version.record.partitions if p.path == "log_new")
    assert [k for k in listed if k.startswith("data/")] == [new.manifest.rsplit("/", 1)[0] + "/"]


def test_publish_refuses_a_missing_new_object(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _partitions(src, ["a", "b"])
    store = open_store(str(tmp_path / "root"))
    v1 = shardlake.open(store).pack(src, tag="v1", workers=0).record
    entry = v1.entries[0]
    gone = replace(entry, manifest=entry.manifest.replace("manifest-", "manifest-gone"))
    body = VersionBody("v2", "v1", (gone,))
    state: RootState = read_state(store)
    with pytest.raises(ConflictError, match="manifest-gone"):
        publish_version(store, body, state)
