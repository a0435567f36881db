"""The epoch cache: second epoch from local files, tiny budgets, sharing, crashes, corruption."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from support.torch import assert_batch_equal

from shardlake import open_store
from shardlake.read.cache import LAYOUT, CacheBudgetWarning, EpochCache
from shardlake.tools.bench.measure import CountingStore, read_counts
from shardlake.torch import ShardDataset

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("loader_engine")]


@pytest.fixture(scope="module")
def corpus(packed_root: Callable[..., tuple[Path, Path]]) -> tuple[Path, Path]:
    return packed_root([20, 20], name="cache", shard_size=300_000)


def epoch(ds: ShardDataset, n: int, workers: int = 0) -> list[dict[str, Any]]:
    ds.set_epoch(n)
    return list(ds.loader(num_workers=workers))


def same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a["__key__"] == b["__key__"]
        assert_batch_equal(a, {k: v for k, v in b.items() if k != "__key__"})


def entries(cache_dir: Path) -> list[Path]:
    return [p for p in (cache_dir / LAYOUT).glob("*/*") if ".tmp." not in p.name]


def counted(root: Path, log: Path, cache_dir: Path, budget: int, **kw: Any) -> ShardDataset:
    store = CountingStore.wrap(open_store(str(root)), str(log))
    return ShardDataset(
        store, batch_size=4, include_key=True, cache_dir=cache_dir, cache_bytes=budget, **kw
    )


def test_second_epoch_is_served_by_the_cache(corpus: tuple[Path, Path], tmp_path: Path) -> None:
    _, root = corpus
    plain = ShardDataset(str(root), batch_size=4, include_key=True)
    log = tmp_path / "gets.log"
    ds = counted(root, log, tmp_path / "c", 1 << 30)
    same(epoch(ds, 0, workers=2), epoch(plain, 0, workers=2))
    first_gets, first_bytes = read_counts(str(log))
    assert first_bytes >= int(ds.table.size.sum())
    assert sum(p.stat().st_size for p in entries(tmp_path / "c")) == int(ds.table.size.sum())
    same(epoch(ds, 1, workers=2), epoch(plain, 1, workers=2))
    assert read_counts(str(log)) == (first_gets, first_bytes)  # nothing fetched again


def test_tiny_budget_refetches_warns_and_keeps_needed_entries(
    corpus: tuple[Path, Path], tmp_path: Path
) -> None:
    _, root = corpus
    plain = ShardDataset(str(root), batch_size=4, include_key=True)
    cache_dir = tmp_path / "c"
    # An earlier selection (the second half) filled the cache.
    half = plain.table.keys[len(plain.table) // 2 :]
    other = counted(root, tmp_path / "a.log", cache_dir, 1 << 30, keys=half)
    epoch(other, 0)
    stale = {p.name for p in entries(cache_dir)}
    budget = int(plain.table.size[:6].sum())  # room for about six payloads
    log = tmp_path / "gets.log"
    ds = counted(root, log, cache_dir, budget, keys=plain.table.keys[: len(plain.table) // 2])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        same(
            epoch(ds, 0),
            epoch(ShardDataset(str(root), batch_size=4, include_key=True, keys=ds.table.keys), 0),
        )
    assert [w.category for w in caught].count(CacheBudgetWarning) == 1
    kept = entries(cache_dir)
    assert 0 < sum(p.stat().st_size for p in kept) <= budget
    assert not stale & {p.name for p in kept}  # the other selection's entries were evicted
    cached = {p.name for p in kept}
    # Next epoch: the cached entries stay (nothing needed is evicted), the rest is re-fetched.
    gets_before, _ = read_counts(str(log))
    epoch(ds, 1)
    assert {p.name for p in entries(cache_dir)} == cached
    gets_after, _ = read_counts(str(log))
    assert gets_after - gets_before > 0
    assert EpochCache(cache_dir, budget).usage() == sum(p.stat().st_size for p in kept)


def _share(root: str, cache_dir: str, out: str) -> None:
    ds = ShardDataset(
        root, batch_size=4, include_key=True, cache_dir=cache_dir, cache_bytes=1 << 30
    )
    torch.save([b["__key__"] for b in epoch(ds, 0)], out)


def test_two_processes_share_one_cache(corpus: tuple[Path, Path], tmp_path: Path) -> None:
    _, root = corpus
    cache_dir = tmp_path / "c"
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_share, args=(str(root), str(cache_dir), str(tmp_path / f"{i}.pt")))
        for i in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=100)
        assert p.exitcode == 0
    plain = epoch(ShardDataset(str(root), batch_size=4, include_key=True), 0)
    for i in range(2):
        assert torch.load(tmp_path / f"{i}.pt") == [b["__key__"] for b in plain]
    ds = ShardDataset(str(root), batch_size=4, include_key=True)
    total = int(ds.table.size.sum())
    files = entries(cache_dir)
    assert len(files) == len(ds.table) and sum(p.stat().st_size for p in files) == total
    assert not list((cache_dir / LAYOUT).glob("*/*.tmp.*"))
    cache = EpochCache(cache_dir, 1 << 30)
    assert int((cache_dir / LAYOUT / "usage").read_text()) == cache.usage() == total
    for p in files:  # every entry is whole and checks out
        off, size, crc = (int(x, 16) for x in p.name.split("-"))
        row = next(
            i
            for i in range(len(ds.table))
            if int(ds.table.offset[i]) == off
            and int(ds.table.size[i]) == size
            and int(ds.table.crc32[i]) == crc
        )
        assert cache.get(ds.table.shard_keys[int(ds.table.shard[row])], off, size, crc) is not None


def _killed_writer(cache_dir: str) -> None:
    def die(*_: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    os.replace = die  # type: ignore[assignment]  # killed between writing and publishing
    EpochCache(cache_dir, 1 << 20).put("data/x", 0, 5, 0x3610A686, b"hello")


def test_killed_writer_leaves_nothing_visible(tmp_path: Path) -> None:
    cache_dir = tmp_path / "c"
    p = mp.get_context("fork").Process(target=_killed_writer, args=(str(cache_dir),))
    p.start()
    p.join(timeout=60)
    assert p.exitcode == -signal.SIGKILL
    temps = list((cache_dir / LAYOUT).glob("*/*.tmp.*"))
    assert len(temps) == 1 and temps[0].read_bytes() == b"hello"
    cache = EpochCache(cache_dir, 1 << 20)
    assert cache.get("data/x", 0, 5, 0x3610A686) is None  # never half-published
    assert cache.usage() == 0 and not temps[0].exists()  # the dead writer's temp is removed
    assert cache.put("data/x", 0, 5, 0x3610A686, b"hello")
    assert cache.get("data/x", 0, 5, 0x3610A686) == b"hello" and cache.usage() == 5


def test_corrupted_cache_file_is_refetched_never_used(
    corpus: tuple[Path, Path], tmp_path: Path
) -> None:
    _, root = corpus
    plain = ShardDataset(str(root), batch_size=4, include_key=True)
    log = tmp_path / "gets.log"
    cache_dir = tmp_path / "c"
    ds = counted(root, log, cache_dir, 1 << 30)
    epoch(ds, 0)
    victim = sorted(entries(cache_dir))[3]
    good = victim.read_bytes()
    data = bytearray(good)
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    gets, fetched = read_counts(str(log))
    same(epoch(ds, 1), epoch(plain, 1))
    gets2, fetched2 = read_counts(str(log))
    assert gets2 == gets + 1 and fetched2 - fetched == len(good)  # that payload, from the store
    assert victim.read_bytes() == good  # and the cache holds the good copy again
