"""Requests do not grow with the partition count: start-up, show, keyset --where, add one.

Roots are built with benchmarks/scale.py's fast builder, at 100 and 10,000 partitions (the
real corpus has ~10,900; about a minute on 2 cores); ``SHARDLAKE_SCALE_TEST=1`` adds 1,000.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import shardlake
from shardlake import open_store
from shardlake.format.documents import PartitionEntry
from shardlake.meta.commits import read_state
from shardlake.meta.publish import VersionBody, publish_version
from shardlake.meta.versions import load_version
from shardlake.store.layers import RequestCounter
from shardlake.torch import ShardDataset

_spec = importlib.util.spec_from_file_location(
    "scale_bench", Path(__file__).resolve().parents[2] / "benchmarks" / "scale.py"
)
assert _spec is not None and _spec.loader is not None
scale = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scale)

SIZES = [100, 10_000] + ([1000] if os.environ.get("SHARDLAKE_SCALE_TEST") else [])
# Loader start-up: commit listing, highest commit, record, partitions table, one segment.
STARTUP_REQUESTS = 5


def _take(counter: RequestCounter) -> dict[str, int]:
    out = dict(counter.requests)
    counter.requests.clear()
    return out


def _requests(url: str) -> dict[str, Any]:
    """Requests of loader start-up, show, keyset create --where and adding one partition."""
    counter = RequestCounter()
    store = open_store(url).with_layers(counter)
    ShardDataset(store, "v1", batch_size=1, num_workers=0)
    startup = _take(counter)
    record = shardlake.open(store).dataset("v1").version.record  # what `show` prints
    assert record.partitions
    show = _take(counter)
    shardlake.open(store).keysets.create("turns", version="v1", where="scenario = 'turn'")
    keyset = _take(counter)
    version = load_version(store, "v1")
    entry = scale.partition(store, "added", 3, scale.encoded_sample())
    _take(counter)
    parts = [*version.entries, PartitionEntry.from_json(entry, "added")]
    body = VersionBody.successor(version.header_doc, tag="v2", base="v1", partitions=parts)
    publish_version(store, body, read_state(store))
    return {"startup": startup, "show": show, "keyset": keyset, "add_one": _take(counter)}


def test_request_counts_do_not_grow_with_partitions(tmp_path: Path) -> None:
    seen = {}
    for n in SIZES:
        url = str(tmp_path / f"n{n}")
        scale.build_root(url, n, 3)
        seen[n] = _requests(url)
    first = seen[SIZES[0]]
    assert sum(first["startup"].values()) == STARTUP_REQUESTS, first["startup"]
    for n in SIZES[1:]:
        assert seen[n] == first, (n, seen[n], first)


def test_64_ranks_each_pay_the_same_constant_start_up(tmp_path: Path) -> None:
    """64 ranks (simulated in one process) open one catalog: each issues the same few GETs of
    the same immutable objects, and together they cover every sample (docs/format.md 9.5)."""
    url = str(tmp_path / "root")
    scale.build_root(url, 100, 3)
    per_rank, keys = [], set()
    for rank in range(64):
        counter = RequestCounter()  # each rank opens its own store
        store = open_store(url).with_layers(counter)
        ds = ShardDataset(store, "v1", batch_size=1, num_workers=0, rank=rank, world_size=64)
        per_rank.append(_take(counter))
        plan = ds.plan(ds.layout(0))  # this rank's slots
        keys.update(ds.table.keys[int(r)] for batch in plan.rank_batches(rank) for r in batch)
    assert all(calls == per_rank[0] for calls in per_rank)
    assert sum(per_rank[0].values()) == STARTUP_REQUESTS
    assert len(keys) == 300
