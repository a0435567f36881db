"""Reads keep shardlake's own read policy on every client (issue #43): through obstore, a
sparse keyset read fetches the spans the loader's ``coalesce`` planned (unselected bytes within
``max_skim_fraction``), not the ranges obstore would merge on its own (up to 1 MiB apart).
Bytes are counted on the wire, by a proxy between the client and SeaweedFS."""

from __future__ import annotations

import hashlib
import warnings
from typing import Any

import numpy as np
import pytest

import shardlake
from shardlake import WriteOptions, open_store
from shardlake.store import ReadClientWarning
from shardlake.testing.fixtures import new_location, shared_servers
from shardlake.testing.proxy import FaultProxy
from shardlake.torch import ShardDataset

pytestmark = pytest.mark.timeout(300)

SAMPLES = 400  # ~20 KB each, 2 partitions, 2 MiB shards: selected samples ~200 KB apart


def _picked(key: str) -> bool:
    return hashlib.sha256(key.encode()).digest()[0] < 26  # ~10%


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
def test_a_sparse_keyset_read_fetches_its_planned_spans(client: str) -> None:
    location = new_location("seaweedfs", "policy", shared_servers())
    root = shardlake.open(location.url, **location.storage_options)
    rng = np.random.default_rng(7)
    with root.writer("v1", options=WriteOptions(shard_size=2 * 2**20)) as w:
        for i in range(SAMPLES):
            w.write(f"log{i % 2}/s{i:04d}", {"x": rng.normal(size=5000).astype(np.float32)})
    every = root.dataset("v1").keys()
    keys = [k for k in every if _picked(k)]
    assert SAMPLES * 0.05 < len(keys) < SAMPLES * 0.15
    root.keysets.create("tenth", version="v1", keys=keys)
    selected = sum(root.dataset("v1").select(keys=keys).rows(["size"]).column("size").to_pylist())

    with FaultProxy(shared_servers().get("seaweedfs").endpoint_url, rate=0) as proxy:
        options: dict[str, Any] = proxy.storage_options(location.storage_options)
        store = open_store(location.url, {**options, "read_client": client})
        ds = ShardDataset(store, keyset="tenth", batch_size=1, include_key=True, num_workers=0)
        first = len(proxy.served)  # count the payload reads, not opening the version
        with warnings.catch_warnings():
            warnings.simplefilter("error", ReadClientWarning)  # no silent fsspec fall-back
            # One epoch's reads: no prefetch of the next one in its tail.
            seen = [k for batch in ds.loader(prefetch_next_epoch=False) for k in batch["__key__"]]
        reads = [r for r in proxy.served[first:] if r[0] == "GET" and "/shard-" in r[1]]
    assert sorted(seen) == sorted(keys)
    backend: Any = store.backend
    if client == "obstore":
        assert backend.fast_reads is not None and backend.fast_reads._served > 0
    fetched = sum(n for *_, n in reads)
    assert all(r[2] for r in reads)  # every shard read ranged
    assert selected <= fetched <= 1.3 * selected, (fetched / selected, len(reads))
