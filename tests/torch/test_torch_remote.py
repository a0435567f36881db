"""The loader straight from S3 (moto server) and GCS (fake-gcs-server) on 127.0.0.1."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from support.torch import assert_batch_equal, make_root

from shardlake import open_store
from shardlake.testing import RequestCounter
from shardlake.testing.fixtures import new_location, shared_servers
from shardlake.torch import ShardDataset

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("loader_engine")]

BATCH = 8


@pytest.fixture(scope="module")
def local_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Frames of ~60 KB: the per-member tar header (512 B) stays a small share of the bytes.
    return make_root(
        tmp_path_factory.mktemp("remote"), [5, 30, 21], lanes=60, shard_size=1_500_000
    )[1]


@pytest.mark.parametrize("kind", ["seaweedfs", "gcs", "azure"])
def test_remote_batches_equal_local_and_bytes_fetched_match_selection(
    kind: str, local_root: Path, tmp_path: Path
) -> None:
    location = new_location(kind, "loader", shared_servers())
    local = open_store(str(local_root))
    remote = location.open()
    for key in local.list():
        local.copy_to(remote, key)

    want = list(ShardDataset(str(local_root), batch_size=BATCH, include_key=True).loader())

    log = tmp_path / "requests.jsonl"
    store = remote.with_layers(RequestCounter(str(log)))
    ds = ShardDataset(store, batch_size=BATCH, include_key=True)
    assert ds.version_hash == ShardDataset(str(local_root), batch_size=BATCH).version_hash
    log.unlink(missing_ok=True)  # count the loader's reads, not opening the version
    got = list(ds.loader(num_workers=2, prefetch_next_epoch=False))  # this epoch's reads only
    assert [b["__key__"] for b in got] == [b["__key__"] for b in want]
    for a, b in zip(got, want, strict=True):
        assert_batch_equal(a, {k: v for k, v in b.items() if k != "__key__"})

    # Bytes fetched (from the request log of every worker process) vs the selected members.
    seen = Counter(k for b in got for k in b["__key__"])
    size_of = dict(zip(ds.table.keys, ds.table.size.tolist(), strict=True))
    member_bytes = sum(size_of[k] * n for k, n in seen.items())
    records = [json.loads(line) for line in log.read_text().splitlines()]
    reads = [r for r in records if r["ok"] and r["op"].startswith("read_range")]
    # Each worker process reads its own slots; the thread engine reads in this process.
    assert len({r["pid"] for r in reads}) == (2 if ds.engine == "processes" else 1)
    fetched = sum(r["bytes"] for r in reads)
    assert member_bytes <= fetched <= 1.10 * member_bytes, (fetched, member_bytes)
