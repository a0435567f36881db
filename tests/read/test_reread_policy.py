"""One re-read policy for every payload read: the store's ``retry.integrity_rereads``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from support.torch import assert_batch_equal

from shardlake import open_store
from shardlake.errors import IntegrityError
from shardlake.testing.faults import FaultInjector, FaultPlan
from shardlake.torch import ReadOptions, ShardDataset

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def root(packed_root: Callable[..., tuple[Path, Path]]) -> Path:
    return packed_root([12, 12], name="reread", shard_size=10_000_000)[1]


def _epoch(root: Path, injector: FaultInjector, rereads: int | None = None) -> list[dict]:
    store = open_store(str(root))
    if rereads is not None:
        store = store.with_retry(replace(store.retry, integrity_rereads=rereads))
    ds = ShardDataset(
        store.with_layers(injector),
        batch_size=4,
        include_key=True,
        shuffle=False,
        read_options=ReadOptions(inflight=1),
    )
    return list(ds.loader(num_workers=0))


def test_four_flipped_ranged_reads_in_an_epoch_complete_bit_exact(root: Path) -> None:
    clean = list(
        ShardDataset(str(root), batch_size=4, include_key=True, shuffle=False).loader(num_workers=0)
    )
    # Two shards, the first two reads of each flipped: a payload's first read and its first
    # re-read both arrive damaged, twice in the epoch (4 flipped ranged reads).
    injector = FaultInjector(FaultPlan(flip_reads=2))
    got = _epoch(root, injector)
    assert injector.injected["flip"] == 4
    assert len(got) == len(clean)
    for a, b in zip(got, clean, strict=True):
        assert a["__key__"] == b["__key__"]
        assert_batch_equal(a, {k: v for k, v in b.items() if k != "__key__"})


def test_rereads_follow_the_store_retry_policy(root: Path) -> None:
    with pytest.raises(IntegrityError, match="on 2 reads"):
        _epoch(root, FaultInjector(FaultPlan(flip_reads=2)), rereads=1)
