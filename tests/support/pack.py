"""Helpers shared by the pack tests (``from support.pack import ...``); their own check is in
``tests/pack/test_pack_roundtrip.py``."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from shardlake import Store
from shardlake.format.codec import Decoder, payload_checksum
from shardlake.format.tar import iter_members
from shardlake.meta.commits import read_state
from shardlake.meta.versions import StoredVersion, load_version, load_version_by_hash
from shardlake.read.manifests import read_manifest
from shardlake.store import Request
from shardlake.testing import write_npz


def make_source(
    root: Path, samples: dict[str, dict[str, Any]], sidecars: dict[str, Any] | None = None
) -> Path:
    """Write ``{relkey: arrays}`` as npz files (and ``{relkey: doc}`` sidecars) under ``root``."""
    for key, arrays in samples.items():
        path = root / f"{key}.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_npz(path, arrays)
    for key, doc in (sidecars or {}).items():
        path = root / f"{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc))
    return root


def small_frame(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    return {
        "a": rng.normal(size=(3, 4)).astype(np.float32),
        "b": np.arange(i, i + 5, dtype=np.int64),
        "flag": np.array([i % 2 == 0]),
    }


def read_all(store: Store, version: StoredVersion) -> dict[str, dict[str, Any]]:
    """Every sample of ``version`` decoded from its shard bytes (checksums checked)."""
    decoder = Decoder()
    out: dict[str, dict[str, Any]] = {}
    for part in version.entries:
        table, meta = read_manifest(store, part.manifest)
        assert meta.data_rev == part.data_rev and meta.partition_id == part.id
        shards = {i: store.read(s.key) for i, s in enumerate(part.shards)}
        for row in table.to_pylist():
            payload = shards[row["shard"]][row["offset"] : row["offset"] + row["size"]]
            assert payload_checksum(payload) == row["crc32"], f"{row['key']}: checksum mismatch"
            assert row["key"] not in out, f"duplicate key {row['key']}"
            out[row["key"]] = decoder.decode(payload)
    return out


def snapshot(store: Store) -> dict[str, bytes]:
    return {key: store.read(key) for key in store.list() if not key.startswith("_shardlake/")}


def assert_consistent(store: Store) -> None:
    """Every live version loads, its manifests parse, its shards exist with the recorded sizes
    and members, and ``latest`` names a live version."""
    state = read_state(store)
    if state.latest is not None:
        assert state.latest in state.versions
        load_version(store, "latest", state)
    for tag, version_hash in state.versions.items():
        version = load_version_by_hash(store, tag, version_hash)
        for part in version.entries:
            table, _ = read_manifest(store, part.manifest)
            assert table.num_rows == part.samples
            for shard in part.shards:
                data = store.read(shard.key)
                assert len(data) == shard.size
                assert len(list(iter_members(data))) == shard.members


class KeyLog:
    """A store layer counting (operation, key) of every request (the publish tests)."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()

    def __call__(self, request: Request, send: Callable[[], Any]) -> Any:
        self.calls[(request.op, request.key)] += 1
        return send()

    def state_reads(self) -> dict[str, int]:
        """Root marker reads, commit-log listings, commit record reads."""
        calls = self.calls
        return {
            "marker": calls[("read", "shardlake.json")],
            "list_commits": calls[("list", "commits/")],
            "read_commits": sum(
                n for (op, k), n in calls.items() if op == "read" and "commits/" in k
            ),
        }
