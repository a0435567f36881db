"""The loader's row-table columns as a node-local derived file (issue #31): built by the first
rank of a node, memory-mapped by the others, bit-identical to building them, and never trusted
when torn or edited."""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardlake
from shardlake.read.catalog_cache import ARRAYS_SUFFIX, LAYOUT, CatalogCache
from shardlake.testing import synth_corpus
from shardlake.torch import ShardDataset

COLUMNS = ("shard", "offset", "size", "raw_size", "crc32")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("derived")
    synth_corpus(tmp / "src", 4, 8, seed=3, neighbors=2, lanes=4)
    url = str(tmp / "root")
    shardlake.open(url).pack(tmp / "src", tag="v1")
    return url


def _run(root: str, engine: str) -> tuple[ShardDataset, list[dict[str, Any]]]:
    ds = ShardDataset(
        root, batch_size=4, include_index=True, num_workers=2, engine=engine, rank=1, world_size=2
    )
    return ds, [dict(b) for b in ds.loader()]


def _same(got: tuple[ShardDataset, list[dict[str, Any]]], want: tuple[ShardDataset, Any]) -> None:
    (ds, batches), (ref, ref_batches) = got, want
    for c in COLUMNS:
        a, b = getattr(ds.table, c), getattr(ref.table, c)
        assert a.dtype == b.dtype and np.array_equal(a, b), c
    assert list(ds.table.shard_keys) == list(ref.table.shard_keys)
    assert ds.partition_of.dtype == ref.partition_of.dtype
    assert np.array_equal(ds.partition_of, ref.partition_of)
    assert ds.partition_names == ref.partition_names
    assert ds.run_record() == ref.run_record()
    assert len(batches) == len(ref_batches)
    for b, r in zip(batches, ref_batches, strict=True):
        assert b.keys() == r.keys()
        for k in r:
            assert (b[k] == r[k]).all(), k
    rows = batches[0]["__index__"]
    assert ds.keys_of(rows) == ref.keys_of(rows)  # keys read back, same order


def _mapped(ds: ShardDataset) -> bool:
    base = ds.table.offset.base
    return isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)


def _arrays_files(cache: Path, entry: str = "loader-columns/1") -> list[Path]:
    """The derived-arrays files of ``entry`` (named in their header)."""
    found = sorted((cache / LAYOUT).glob(f"*{ARRAYS_SUFFIX}"))
    return [p for p in found if entry.encode() in p.read_bytes()[:4096]]


@pytest.mark.parametrize("engine", ["threads", "processes"])
def test_second_rank_maps_the_first_ranks_columns_bit_for_bit(
    root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    reference = _run(root, engine)  # the cache off (tests/conftest.py): built from the catalog
    assert not _mapped(reference[0])
    monkeypatch.setenv("SHARDLAKE_CATALOG_CACHE", str(tmp_path / "cache"))
    cold = _run(root, engine)
    # The first rank maps the file it wrote (its pages shared with the node's other ranks).
    assert _mapped(cold[0]) and len(_arrays_files(tmp_path / "cache")) == 1
    warm = _run(root, engine)
    assert _mapped(warm[0])
    _same(cold, reference)
    _same(warm, reference)


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "header"])
def test_a_torn_or_edited_columns_file_is_rebuilt_not_trusted(
    root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    reference = _run(root, "threads")
    cache = tmp_path / "cache"
    monkeypatch.setenv("SHARDLAKE_CATALOG_CACHE", str(cache))
    _run(root, "threads")
    (path,) = _arrays_files(cache)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-3] ^= 0x40  # a data byte: the size and header still check out
    elif damage == "truncate":
        data = data[: len(data) - 64]
    elif damage == "empty":
        data = bytearray()
    else:
        data[20:30] = b"x" * 10  # the header's JSON
    path.write_bytes(bytes(data))
    discarded: list[Path] = []
    real = CatalogCache._discard

    def spy(cache: CatalogCache, found: Path) -> None:
        discarded.append(found)
        real(cache, found)

    monkeypatch.setattr(CatalogCache, "_discard", spy)
    rebuilt = _run(root, "threads")
    assert discarded == [path]  # found out and deleted, not used
    _same(rebuilt, reference)
    assert path.read_bytes() != bytes(data)  # published again, whole
    again = _run(root, "threads")
    assert _mapped(again[0])
    _same(again, reference)


def test_selections_and_meta_columns_build_their_own_columns(
    root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDLAKE_CATALOG_CACHE", str(tmp_path / "cache"))
    ShardDataset(root, batch_size=2, where="member < 3", num_workers=0)
    ShardDataset(root, batch_size=2, meta_columns=["member"], num_workers=0)
    assert _arrays_files(tmp_path / "cache") == []  # only a whole version's are kept
    # Their plans are kept, each under its own selection digest.
    assert len(_arrays_files(tmp_path / "cache", "loader-plan/1")) == 2


def _plan_mapped(ds: ShardDataset) -> bool:
    """The rank's plan arrays are pages of the cached file, not copies (its emits' chunk
    numbers too, which are uint16)."""
    plan = ds.plan(ds.layout(2))
    slot = plan.slot(ds.rank, 0)
    rows, emits = plan.slot_rows[slot], plan.slot_emit_chunk[slot]
    bases = [rows.base, emits.base]
    mapped = all(isinstance(b, memoryview) and isinstance(b.obj, mmap.mmap) for b in bases)
    return mapped and emits.dtype == np.uint16


@pytest.mark.parametrize("engine", ["threads", "processes"])
def test_other_ranks_epochs_and_resumes_read_the_cached_plan_exactly(
    root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    def loader(rank: int) -> Any:
        ds = ShardDataset(
            root, batch_size=4, include_key=True, num_workers=2, engine=engine, rank=rank,
            world_size=2,
        )  # fmt: skip
        return ds, ds.loader()

    def keys(batches: Any) -> list[list[str]]:
        return [list(b["__key__"]) for b in batches]

    want = {}
    for rank in (0, 1):
        ds, ld = loader(rank)
        want[rank] = keys(ld)
        ld.set_epoch(1)
        want[rank, 1] = keys(ld)
    monkeypatch.setenv("SHARDLAKE_CATALOG_CACHE", str(tmp_path / "cache"))
    first, _ = loader(1)  # the node's first rank: computes and writes the whole plan
    assert _plan_mapped(first)  # and maps it back
    for rank in (0, 1):
        ds, ld = loader(rank)
        assert _plan_mapped(ds)  # the other rank too: the file holds every slot
        assert keys(ld) == want[rank]
        ld.set_epoch(1)
        assert keys(ld) == want[rank, 1]
        # A resume after one batch of epoch 1, from the cached plan.
        ds, ld = loader(rank)
        ld.set_epoch(1)
        it = iter(ld)
        got = keys([next(it)])
        state = ld.state_dict()
        del it
        ds, again = loader(rank)
        again.load_state_dict(state)
        assert got + keys(again) == want[rank, 1]


@pytest.mark.parametrize("engine", ["threads", "processes"])
def test_an_exact_batchs_valid_mask_is_the_callers_to_write(
    root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """``__valid__`` of an exact pass is the caller's tensor: masking it in place must touch
    neither the plan mapped from the node-local cache (read-only: the thread engine crashed
    the process) nor what the next pass yields."""
    monkeypatch.setenv("SHARDLAKE_CATALOG_CACHE", str(tmp_path / "cache"))
    passes = []
    for _ in range(3):  # the first builds and maps the cached plan, the others map it
        ds = ShardDataset(
            root, batch_size=3, exact=True, num_workers=2, engine=engine, rank=1, world_size=2
        )
        masks = []
        for batch in ds.loader():
            masks.append(batch["__valid__"].clone())
            batch["__valid__"].fill_(False)
        passes.append(masks)
    assert not all(bool(m.all()) for m in passes[0])  # some padding, marked
    for masks in passes[1:]:
        assert len(masks) == len(passes[0])
        assert all(bool((a == b).all()) for a, b in zip(masks, passes[0], strict=True))
