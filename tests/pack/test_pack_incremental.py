"""Incremental packs: reuse, rebuild, drop, sidecar-only changes, scoped packs, refusals."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.pack import assert_consistent, make_source, read_all, small_frame, write_npz

import shardlake
import shardlake.pack.build as build_mod
from shardlake import open_store
from shardlake.errors import SourceError, UsageError
from shardlake.meta.versions import load_version

PARTS = ("logA", "logB", "logC")


def corpus(root: Path, n: int = 3) -> Path:
    samples = {
        f"{p}/{p}_{i}": small_frame(10 * j + i) for j, p in enumerate(PARTS) for i in range(n)
    }
    sidecars = {k: {"is_skipped": False, "timestamp": 1000 + idx} for idx, k in enumerate(samples)}
    return make_source(root, samples, sidecars)


class ShardWriterSpy:
    """Counts shard members written; with ``forbid`` every write fails the test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, forbid: bool = False) -> None:
        self.added: list[str] = []
        real = build_mod.ShardWriter
        spy = self

        class Spy(real):  # type: ignore[misc, valid-type]
            def add(self, key: str, payload: bytes) -> tuple[int, int]:
                if forbid:
                    raise AssertionError(
                        f"shard writer used for {key}: the reuse short-circuit broke"
                    )
                spy.added.append(key)
                return super().add(key, payload)

        monkeypatch.setattr(build_mod, "ShardWriter", Spy)


def test_unchanged_partitions_are_reused_without_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = corpus(tmp_path / "src")
    store = open_store(str(tmp_path / "root"))
    v1 = shardlake.open(store).pack(src, tag="v1", executor="inline").record
    ShardWriterSpy(monkeypatch, forbid=True)

    # Not even the npz reader may run for a reused partition.
    def no_read(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a reused partition was built")

    monkeypatch.setattr(build_mod, "build_partition", no_read)
    monkeypatch.setattr("shardlake.pack.packer.build_partition", no_read)
    report = shardlake.open(store).pack(src, tag="v2", base="v1", executor="inline")
    assert sorted(report.reused) == list(PARTS) and not report.built
    v2 = report.record
    assert [p for p in v2.entries] == [p for p in v1.entries]
    assert v2.doc["base"] == "v1"


def test_changed_partition_rebuilt_vanished_dropped_new_added(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = corpus(tmp_path / "src")
    store = open_store(str(tmp_path / "root"))
    v1 = shardlake.open(store).pack(src, tag="v1", executor="inline").record
    spy = ShardWriterSpy(monkeypatch)
    # logA: one frame changes; logB vanishes; logD is new; logC untouched.
    make_source(src, {"logA/logA_0": {"a": np.zeros(2, np.float32)}})
    shutil.rmtree(src / "logB")
    make_source(src, {"logD/logD_0": small_frame(99)})
    report = shardlake.open(store).pack(src, tag="v2", base="v1", executor="inline")
    assert sorted(report.built) == ["logA", "logD"]
    assert report.reused == ["logC"] and report.dropped == ["logB"]
    assert sorted(spy.added) == ["logA/logA_0", "logA/logA_1", "logA/logA_2", "logD/logD_0"]
    got = read_all(store, report.record)
    assert sorted({k.split("/")[0] for k in got}) == ["logA", "logC", "logD"]
    assert got["logA/logA_0"]["a"].tolist() == [0.0, 0.0]
    old = {p.path: p for p in v1.entries}
    new = {p.path: p for p in report.record.entries}
    assert new["logC"] == old["logC"] and new["logA"].data_rev != old["logA"].data_rev
    assert read_all(store, load_version(store, "v1"))["logA/logA_0"]["b"].size == 5  # v1 intact
    assert_consistent(store)


def test_sidecar_only_change_writes_manifest_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = corpus(tmp_path / "src")
    store = open_store(str(tmp_path / "root"))
    v1 = shardlake.open(store).pack(src, tag="v1", executor="inline").record
    before = set(store.list("data/"))
    ShardWriterSpy(monkeypatch, forbid=True)
    (src / "logB/logB_1.json").write_text(
        json.dumps({"is_skipped": False, "timestamp": 5, "note": "x"})
    )
    report = shardlake.open(store).pack(src, tag="v2", base="v1", executor="inline")
    assert report.manifest_only == ["logB"] and sorted(report.reused) == ["logA", "logC"]
    new_keys = set(store.list("data/")) - before
    assert len(new_keys) == 1 and new_keys.pop().endswith(".parquet")  # no shard written
    old = {p.path: p for p in v1.entries}["logB"]
    new = {p.path: p for p in report.record.entries}["logB"]
    assert new.data_rev == old.data_rev and new.shards == old.shards
    assert new.meta_rev != old.meta_rev
    from shardlake.read.manifests import read_manifest

    table, _ = read_manifest(store, new.manifest)
    rows = {r["key"]: r for r in table.to_pylist()}
    assert rows["logB/logB_1"]["note"] == "x" and rows["logB/logB_1"]["timestamp"] == 5
    assert read_all(store, report.record).keys() == read_all(store, v1).keys()


def test_touching_files_rebuilds_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new mtime changes the stat fingerprint, but identical content means the same revision."""
    src = corpus(tmp_path / "src")
    store = open_store(str(tmp_path / "root"))
    shardlake.open(store).pack(src, tag="v1", executor="inline")
    ShardWriterSpy(monkeypatch, forbid=True)
    os.utime(src / "logA/logA_0.npz", ns=(1, 1))
    report = shardlake.open(store).pack(src, tag="v2", base="v1", executor="inline")
    assert report.resumed == ["logA"] and not report.built and not report.manifest_only


def test_failed_pack_resumes_from_finished_revisions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = corpus(tmp_path / "src")
    (src / "logC/logC_1.npz").write_bytes(b"garbage")
    store = open_store(str(tmp_path / "root"))
    from shardlake.errors import PackWorkerError

    with pytest.raises(PackWorkerError, match="logC"):
        shardlake.open(store).pack(src, tag="v1", executor="inline")
    make_source(src, {"logC/logC_1": small_frame(21)})
    spy = ShardWriterSpy(monkeypatch)
    report = shardlake.open(store).pack(src, tag="v1", executor="inline")
    assert sorted(report.resumed) == ["logA", "logB"] and report.built == ["logC"]
    assert all(k.startswith("logC/") for k in spy.added)


def test_scoped_packs_carry_other_partitions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = corpus(tmp_path / "src")
    store = open_store(str(tmp_path / "root"))
    v1 = shardlake.open(store).pack(src, tag="v1", executor="inline").record
    make_source(src, {"logA/logA_0": small_frame(500), "logB/logB_0": small_frame(501)})
    listing = tmp_path / "paths.txt"
    listing.write_text("# changed\nlogA/logA_0.npz\n./logA/logA_1.npz\n")
    report = shardlake.open(store).pack(
        src, tag="v2", base="v1", path_list=listing, executor="inline"
    )
    assert report.built == ["logA"] and sorted(report.carried) == ["logB", "logC"]
    got = read_all(store, report.record)
    assert sorted(k for k in got if k.startswith("logA")) == ["logA/logA_0", "logA/logA_1"]
    assert got["logB/logB_0"]["b"].tolist() == small_frame(10)["b"].tolist()  # carried as in v1
    old = {p.path: p for p in v1.entries}
    report = shardlake.open(store).pack(
        src, tag="v3", base="v2", partitions=["logB"], executor="inline"
    )
    assert report.built == ["logB"] and sorted(report.carried) == ["logA", "logC"]
    new = {p.path: p for p in report.record.entries}
    assert new["logC"] == old["logC"]
    with pytest.raises(UsageError, match="no partition"):
        shardlake.open(store).pack(src, tag="v4", base="v3", partitions=["nope"], executor="inline")
    assert_consistent(store)


def test_changed_rule_or_location_refused_with_both_remedies(tmp_path: Path) -> None:
    src = corpus(tmp_path / "src")
    store = open_store(str(tmp_path / "root"))
    shardlake.open(store).pack(src, tag="v1", executor="inline")
    moved = tmp_path / "moved"
    shutil.copytree(src, moved)
    for kwargs, what in (
        ({"source": moved}, "source location changed"),
        ({"source": src, "partition_regex": r"^(?P<partition>log[AB])"}, "partition rule changed"),
    ):
        source = kwargs.pop("source")
        with pytest.raises(UsageError, match=what) as info:
            shardlake.open(store).pack(source, tag="v2", base="v1", executor="inline", **kwargs)
        assert info.value.options == ("replace_all", "source_namespace")
    # The remedies work: relocation with the base's namespace; or a full rebuild.
    v2 = (
        shardlake.open(store)
        .pack(moved, tag="v2", base="v1", executor="inline", source_namespace=str(src.resolve()))
        .record
    )
    assert v2.samples == 9
    report = shardlake.open(store).pack(
        moved, tag="v3", base="v2", executor="inline", replace_all=True
    )
    assert not report.reused and report.record.doc["source_namespace"] == str(moved)


def test_require_sidecars(tmp_path: Path) -> None:
    src = corpus(tmp_path / "src")
    (src / "logB/logB_2.json").unlink()
    store = open_store(str(tmp_path / "root"))
    with pytest.raises(SourceError, match=r"logB_2\.npz: no sidecar"):
        shardlake.open(store).pack(src, tag="v1", executor="inline", require_sidecars=True)
    assert store.list("data/") == []  # refused before building anything
    version = shardlake.open(store).pack(src, tag="v1", executor="inline").record
    from shardlake.read.manifests import read_manifest

    part = {p.path: p for p in version.entries}["logB"]
    table, _ = read_manifest(store, part.manifest)
    flags = {r["key"]: r["has_sidecar"] for r in table.to_pylist()}
    assert flags == {"logB/logB_0": True, "logB/logB_1": True, "logB/logB_2": False}


def test_partition_depth_and_regex(tmp_path: Path) -> None:
    src = make_source(
        tmp_path / "src",
        {"city/a/s0": small_frame(0), "city/a/s1": small_frame(1), "city/b/s0": small_frame(2)},
    )
    store = open_store(str(tmp_path / "root"))
    v1 = shardlake.open(store).pack(src, tag="v1", executor="inline", partition_depth=2).record
    assert sorted(p.path for p in v1.entries) == ["city/a", "city/b"]
    assert v1.doc["partition_rule"] == {"depth": 2}
    v2 = (
        shardlake.open(store)
        .pack(src, tag="v2", executor="inline", partition_regex=r"^(?P<partition>[^/]+)/")
        .record
    )
    assert [p.path for p in v2.entries] == ["city"]
    # An incremental pack inherits the base's rule when none is given.
    v3 = shardlake.open(store).pack(src, tag="v3", base="v1", executor="inline").record
    assert v3.doc["partition_rule"] == {"depth": 2}
    with pytest.raises(UsageError, match="named group"):
        shardlake.open(store).pack(src, tag="v4", executor="inline", partition_regex=r"^([^/]+)/")


def test_revision_holding_only_a_removal_manifest_is_rebuilt(tmp_path: Path) -> None:
    """`remove` leaves a subset manifest beside the shards; once gc took the full manifest, a
    fresh pack of the same content must rebuild the revision, not trip over the subset."""

    src = corpus(tmp_path / "src")
    store = open_store(str(tmp_path / "root"))
    v1 = shardlake.open(store).pack(src, tag="v1", executor="inline").record
    shardlake.open(store).remove("v2", base="v1", keys=["logA/logA_0"])
    for entry in v1.entries:  # what gc does once v1 is retired
        store.delete(entry.manifest)
    v3 = shardlake.open(store).pack(src, tag="v3", executor="inline").record
    assert v3.samples == v1.samples
    assert sorted(read_all(store, v3)) == sorted(read_all(store, v1))
    assert_consistent(store)


@pytest.mark.parametrize("edit", ["none", "unrelated file", "other partition"])
def test_pack_base_over_a_removal_mirrors_the_source_whatever_else_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: str
) -> None:
    """`pack --base` over a `remove`-made version holds what the source tree holds: a removed
    sample whose file is still there comes back, with or without unrelated edits (issue #43),
    and `verify --source` passes. The partition is rebuilt from its existing revision."""
    from shardlake.cli.main import main

    src = corpus(tmp_path / "src")
    root = str(tmp_path / "root")
    r = shardlake.open(root)
    v1 = r.pack(src, tag="v1", executor="inline").record
    r.remove("v2", base="v1", keys=["logA/logA_0"])
    if edit == "unrelated file":
        write_npz(src / "logA" / "logA_1.npz", small_frame(99))
    elif edit == "other partition":
        write_npz(src / "logB" / "logB_1.npz", small_frame(98))
    report = r.pack(src, tag="v3", base="v2", executor="inline")
    keys = r.dataset("v3").keys()
    assert "logA/logA_0" in keys
    assert report.version.samples == v1.samples
    assert main(["verify", root, "--source", str(src), "--version", "v3"]) == 0
    capsys.readouterr()
    if edit != "unrelated file":  # logA's files are unchanged: its revision is v1's again
        logA = {e.path: e for e in v1.entries}["logA"]
        assert {e.path: e for e in r.dataset("v3").entries}["logA"].manifest == logA.manifest
