"""A keyset's row-table columns as a node-local derived file (issue #47): a node's first rank
selects the keyset's rows from the catalog, its other ranks map them without decoding the
catalog; keyed by the keyset object's sha256, so a name bound again is never served stale, and
a damaged file is rebuilt."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardlake
from shardlake.meta.catalog import Catalog
from shardlake.read.catalog_cache import ARRAYS_SUFFIX, LAYOUT, CatalogCache
from shardlake.testing import synth_corpus
from shardlake.torch import ShardDataset

COLUMNS = ("shard", "offset", "size", "raw_size", "crc32")


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("keyset-cache")
    synth_corpus(tmp / "src", 4, 8, seed=5, neighbors=2, lanes=4)
    url = str(tmp / "root")
    root = shardlake.open(url)
    root.pack(tmp / "src", tag="v1")
    root.keysets.create("low", where="member < 5")
    keys = root.dataset("v1").keys()
    # A key list's order is kept (not the manifest's): every third key, backwards.
    root.keysets.create("listed", keys=keys[::-3])
    return url


@pytest.fixture
def root(packed: str, tmp_path: Path) -> str:
    """A copy of the packed root (a test may bind a keyset name again)."""
    return str(shutil.copytree(packed, tmp_path / "root"))


def _open(root: str, keyset: str) -> ShardDataset:
    return ShardDataset(root, keyset=keyset, batch_size=4, include_index=True, num_workers=2)


def _batches(ds: ShardDataset) -> list[dict[str, Any]]:
    return [dict(b) for b in ds.loader()]


def _same(ds: ShardDataset, ref: ShardDataset) -> None:
    for c in COLUMNS:
        a, b = getattr(ds.table, c), getattr(ref.table, c)
        assert a.dtype == b.dtype and np.array_equal(a, b), c
    assert list(ds.table.shard_keys) == list(ref.table.shard_keys)
    assert np.array_equal(ds.partition_of, ref.partition_of)
    assert ds.partition_names == ref.partition_names
    assert ds.run_record() == ref.run_record()  # the selection digest among them
    got, want = _batches(ds), _batches(ref)
    assert len(got) == len(want)
    for b, r in zip(got, want, strict=True):
        assert b.keys() == r.keys()
        for k in r:
            assert (b[k] == r[k]).all(), k
    assert ds.keys_of(range(ds.samples)) == ref.keys_of(range(ref.samples))


def _keyset_files(cache: Path) -> list[Path]:
    """The cache's derived-arrays files of keyset selections (named in their header)."""
    found = sorted((cache / LAYOUT).glob(f"*{ARRAYS_SUFFIX}"))
    return [p for p in found if b"|keyset/" in p.read_bytes()[:4096]]


def _catalog_reads(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    real = Catalog.rows

    def spy(catalog: Catalog, *args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(catalog, *args, **kwargs)

    monkeypatch.setattr(Catalog, "rows", spy)
    return calls


@pytest.mark.parametrize("keyset", ["low", "listed"])
def test_a_warm_rank_maps_a_keysets_columns_without_decoding_the_catalog(
    packed: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keyset: str
) -> None:
    reference = _open(packed, keyset)  # the cache off (tests/conftest.py)
    made = shardlake.open(packed).keysets.get(keyset)
    # Its rows in the keyset's own order (a key list's order is kept).
    assert reference.keys_of(range(reference.samples)) == made.keys
    cache = tmp_path / "cache"
    monkeypatch.setenv("SHARDLAKE_CATALOG_CACHE", str(cache))
    cold = _open(packed, keyset)
    assert len(_keyset_files(cache)) == 1
    reads = _catalog_reads(monkeypatch)
    warm = _open(packed, keyset)
    next(iter(warm.loader()))
    assert reads == []  # neither the catalog decoded nor the keys joined
    monkeypatch.undo()
    _same(cold, reference)
    _same(warm, reference)


def test_a_keyset_name_bound_again_is_never_served_from_the_old_entry(
    root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("SHARDLAKE_CATALOG_CACHE", str(cache))
    before = _open(root, "low")
    keysets = shardlake.open(root).keysets
    keysets.delete("low")
    keysets.create("low", where="member >= 5")
    after = _open(root, "low")
    assert len(_keyset_files(cache)) == 2  # its own entry, the old one untouched
    assert after.run_record()["sources"] != before.run_record()["sources"]
    monkeypatch.setenv("SHARDLAKE_CATALOG_CACHE", "off")
    _same(after, _open(root, "low"))


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_keyset_columns_file_is_rebuilt_not_trusted(
    packed: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    reference = _open(packed, "listed")
    cache = tmp_path / "cache"
    monkeypatch.setenv("SHARDLAKE_CATALOG_CACHE", str(cache))
    _open(packed, "listed")
    (path,) = _keyset_files(cache)
    data = path.read_bytes()
    path.write_bytes(
        data[:-64] if damage == "truncate" else data[:-3] + bytes(b ^ 0x40 for b in data[-3:])
    )
    discarded: list[Path] = []
    real = CatalogCache._discard

    def spy(found_in: CatalogCache, found: Path) -> None:
        discarded.append(found)
        real(found_in, found)

    monkeypatch.setattr(CatalogCache, "_discard", spy)
    rebuilt = _open(packed, "listed")
    assert discarded == [path]
    assert path.read_bytes() == data  # published again, whole
    _same(rebuilt, reference)
