"""The node-local catalog cache: 8 ranks of one node read the catalog objects from the store
once; a corrupted cached copy is discarded and read again; eviction keeps it bounded."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardlake
import shardlake.meta.catalog as catalog_mod
from shardlake import open_store
from shardlake.errors import UsageError
from shardlake.read.catalog_cache import ARRAYS_SUFFIX, LAYOUT, CatalogCache, catalog_cache
from shardlake.store.layers import RequestCounter, read_request_log
from shardlake.torch import ShardDataset

_spec = importlib.util.spec_from_file_location(
    "scale_bench", Path(__file__).resolve().parents[2] / "benchmarks" / "scale.py"
)
assert _spec is not None and _spec.loader is not None
scale = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scale)

RANKS = 8


@pytest.fixture
def root(tmp_path: Path) -> str:
    url = str(tmp_path / "root")
    scale.build_root(url, 20, 3)
    return url


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "node-cache"
    monkeypatch.setenv("SHARDLAKE_CATALOG_CACHE", str(path))
    return path


def _catalog_reads(log: Path) -> Counter[str]:
    return Counter(r["key"] for r in read_request_log(str(log)) if r["key"].startswith("catalog/"))


def _ranks(url: str, log: Path) -> list[ShardDataset]:
    out = []
    for rank in range(RANKS):
        store = open_store(url).with_layers(RequestCounter(str(log)))  # one store per rank
        out.append(ShardDataset(store, "v1", batch_size=1, rank=rank, world_size=RANKS))
    return out


def _keys(ds: ShardDataset) -> list[str]:
    return list(ds.table.keys)


def test_eight_ranks_read_each_catalog_object_once(
    root: str, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "requests.jsonl"
    ranks = _ranks(root, log)
    reads = _catalog_reads(log)
    assert len(reads) == 2  # the partitions table and the one segment
    assert set(reads.values()) == {1}, reads
    # The set-up: 2 requests fewer for ranks 2..8 (counted before the keys, which a rank reads
    # back from the catalog only when asked for them).
    pids = Counter(r["pid"] for r in read_request_log(str(log)))
    assert len(pids) == 1 and sum(pids.values()) == 5 + 3 * (RANKS - 1)
    # The same rows as without the cache.
    monkeypatch.setenv("SHARDLAKE_CATALOG_CACHE", "off")
    plain = ShardDataset(root, "v1", batch_size=1)
    assert all(_keys(ds) == _keys(plain) for ds in ranks)
    assert all(ds.selection_digest == plain.selection_digest for ds in ranks)
    assert sorted(p.name for p in (cache_dir / LAYOUT).iterdir() if len(p.name) == 64) == sorted(
        k.rsplit("/", 1)[1].removesuffix(".parquet") for k in reads
    )


def test_large_segments_are_cached_whole(
    root: str, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment above the whole-read size is read by column ranges without the cache; with it,
    once whole, so another projection (``where=`` reads every column) is served from disk."""
    monkeypatch.setattr(catalog_mod, "WHOLE_READ_BYTES", 0)
    log = tmp_path / "requests.jsonl"
    _ranks(root, log)
    store = open_store(root).with_layers(RequestCounter(str(log)))
    turns = ShardDataset(store, "v1", batch_size=1, where="scenario = 'turn'")
    assert len(turns.table) == 20
    reads = [r for r in read_request_log(str(log)) if r["key"].startswith("catalog/")]
    assert [r["op"] for r in reads] == ["read", "read"], reads  # whole reads, no ranges
    assert len({r["key"] for r in reads}) == 2


def test_tools_read_the_stores_own_copy(root: str, cache_dir: Path, tmp_path: Path) -> None:
    """Only the loader reads through the cache: keyset --where (like verify and scrub) reads
    the store, so a bad object at rest is never hidden by a good cached copy."""
    ShardDataset(root, "v1", batch_size=1)
    log = tmp_path / "requests.jsonl"
    store = open_store(root).with_layers(RequestCounter(str(log)))
    shardlake.open(store).keysets.create("turns", version="v1", where="scenario = 'turn'")
    assert len(_catalog_reads(log)) == 2


def test_a_corrupted_cached_copy_is_discarded_and_read_again(
    root: str, cache_dir: Path, tmp_path: Path
) -> None:
    first = ShardDataset(root, "v1", batch_size=1)
    files = [p for p in (cache_dir / LAYOUT).iterdir() if len(p.name) == 64]
    assert len(files) == 2
    for path in files:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    log = tmp_path / "requests.jsonl"
    store = open_store(root).with_layers(RequestCounter(str(log)))
    again = ShardDataset(store, "v1", batch_size=1)
    assert _keys(again) == _keys(first)
    assert set(_catalog_reads(log).values()) == {1} and len(_catalog_reads(log)) == 2
    for path in files:  # re-published intact
        assert hashlib.sha256(path.read_bytes()).hexdigest() == path.name


_RANK_SCRIPT = """
import json, sys
from shardlake.meta.catalog import catalog_rows
from shardlake.meta.catalog_objects import node_catalog_cache
from shardlake.meta.versions import load_version
from shardlake.store import open_store
from shardlake.store.layers import RequestCounter
store = open_store(sys.argv[1]).with_layers(RequestCounter(sys.argv[2]))
with node_catalog_cache():  # as a rank's loader reads it
    rows = catalog_rows(store, load_version(store, "v1"), ["key"])
print(json.dumps(rows.num_rows))
"""


def test_two_processes_read_the_catalog_once(root: str, cache_dir: Path, tmp_path: Path) -> None:
    """Two rank processes started together: one reads each object, the other waits for its
    copy (the per-object lock)."""
    log = tmp_path / "requests.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK_SCRIPT, root, str(log)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert [json.loads(o) for o in outs] == [60, 60]
    reads = _catalog_reads(log)
    assert len(reads) == 2 and set(reads.values()) == {1}, reads


def test_off_and_default_locations(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for off in ("", "off", "OFF"):
        monkeypatch.setenv("SHARDLAKE_CATALOG_CACHE", off)
        assert catalog_cache() is None
    monkeypatch.delenv("SHARDLAKE_CATALOG_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cache = catalog_cache()
    assert cache is not None and cache.root == tmp_path / "xdg/shardlake/catalog" / LAYOUT
    monkeypatch.setenv("SHARDLAKE_CATALOG_CACHE_BYTES", "lots")
    with pytest.raises(UsageError, match="SHARDLAKE_CATALOG_CACHE_BYTES"):
        catalog_cache()


def test_eviction_keeps_the_cache_within_its_budget(tmp_path: Path) -> None:
    cache = CatalogCache(tmp_path, max_bytes=250)
    blobs = [bytes([i]) * 100 for i in range(4)]
    digests = [hashlib.sha256(b).hexdigest() for b in blobs]
    for i, (digest, blob) in enumerate(zip(digests, blobs, strict=True)):
        os.utime(tmp_path, None)
        assert cache.fetch(digest, len(blob), lambda b=blob: b) == blob
        for path in cache.root.iterdir():  # distinct, increasing ages
            if len(path.name) == 64 and path.name != digest:
                st = path.stat()
                os.utime(path, (st.st_atime, st.st_mtime - 10 * (i + 1)))
    kept = {p.name for p in cache.root.iterdir() if len(p.name) == 64}
    assert kept == set(digests[2:])  # the two most recent fit in 250 bytes
    assert cache.get(digests[3], 100) == blobs[3]
    assert cache.get(digests[3], 99) is None  # a wrong size is a failed check: discarded
    assert cache.discarded == 1 and not (cache.root / digests[3]).exists()
    with pytest.raises(UsageError):
        cache.put(digests[0], b"not these bytes")


def test_derived_values_are_checked_and_computed_once(tmp_path: Path) -> None:
    cache = CatalogCache(tmp_path)
    calls: list[int] = []

    def compute() -> str:
        calls.append(1)
        return "ab" * 16

    assert cache.fetch_derived("digest|v|all|3", compute) == "ab" * 16
    assert cache.fetch_derived("digest|v|all|3", compute) == "ab" * 16
    assert len(calls) == 1 and cache.hits == 1
    assert cache.get_derived("digest|v|all|4") is None  # another description: another entry
    (path,) = [p for p in cache.root.iterdir() if p.name.endswith(".derived")]
    assert [e[0] for e in cache.entries()] == [path]  # counted by the eviction budget
    doc = json.loads(path.read_bytes())
    path.write_text(json.dumps({**doc, "value": "cd" * 16}))  # an edit the check catches
    assert cache.get_derived("digest|v|all|3") is None
    assert cache.discarded == 1 and not path.exists()


def test_ranks_reuse_the_whole_versions_selection_digest(
    root: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardlake.torch.sources as sources_mod

    calls: list[int] = []
    real = sources_mod.key_digest

    def counted(keys: object, breaks: object = None) -> str:
        calls.append(1)
        return real(keys, breaks)  # type: ignore[arg-type]

    monkeypatch.setattr(sources_mod, "key_digest", counted)
    first = ShardDataset(root, "v1", batch_size=1)
    second = ShardDataset(root, "v1", batch_size=1, rank=1, world_size=2)
    assert len(calls) == 1 and first.selection_digest == second.selection_digest
    turns = ShardDataset(root, "v1", batch_size=1, where="scenario = 'turn'")
    assert len(calls) == 2 and turns.selection_digest != first.selection_digest
    monkeypatch.setenv("SHARDLAKE_CATALOG_CACHE", "off")
    plain = ShardDataset(root, "v1", batch_size=1)
    assert plain.selection_digest == first.selection_digest and len(calls) == 3


def _resident_kb(path: Path) -> int:
    """Resident KB of this process's mappings of ``path`` (Linux ``/proc/self/smaps``)."""
    total, mine = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5:
            mine = len(fields) >= 6 and fields[-1] == str(path)
        elif mine and fields[0] == "Rss:":
            total += int(fields[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux's smaps")
def test_checking_mapped_arrays_leaves_their_pages_unmapped(tmp_path: Path) -> None:
    cache = CatalogCache(tmp_path)
    unread = np.arange(2_000_000, dtype=np.int32)  # 8 MB this process never reads
    cache.put_arrays("columns/1", {"n": 1}, {"unread": unread, "small": np.arange(4)})
    (path,) = tmp_path.rglob(f"*{ARRAYS_SUFFIX}")
    found = cache.get_arrays("columns/1")  # sha256 checked
    assert found is not None and found[0] == {"n": 1}
    # The check read the file, not the mapping: the 8 MB column is mapped but not resident
    # here (it would count in this process's PSS, and every rank's).
    assert _resident_kb(path) < 1024
    assert np.array_equal(found[1]["unread"], unread)
    assert _resident_kb(path) >= 7 * 1024


# --- derived arrays checked once per node ------------------------------------------------------


def _count_hashes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Calls to the arrays files' data hash from now on (their sizes in bytes)."""
    import shardlake.read.catalog_cache as cache_mod

    calls: list[int] = []
    real = cache_mod._file_sha256

    def counted(fh: Any, start: int) -> str:
        calls.append(os.fstat(fh.fileno()).st_size - start)
        return real(fh, start)

    monkeypatch.setattr(cache_mod, "_file_sha256", counted)
    return calls


def _arrays_entry(cache: CatalogCache, what: str, n: int = 1000) -> tuple[Path, Path]:
    cache.put_arrays(what, {"n": n}, {"a": np.arange(n, dtype=np.int64)})
    (path,) = [p for p in cache.root.glob(f"*{ARRAYS_SUFFIX}") if what.encode() in p.read_bytes()]
    return path, path.with_name(path.name + ".checked")


def _read(cache_dir: Path, what: str) -> Any:
    found = CatalogCache(cache_dir).get_arrays(what)  # another rank: its own cache object
    return None if found is None else found[1]["a"].tolist()


def test_ranks_map_checked_arrays_without_hashing_them(
    root: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm rank maps the node's derived files (row-table columns, plan) without hashing
    their data again: the node's first rank wrote them, stamped as checked."""
    calls = _count_hashes(monkeypatch)
    first = ShardDataset(root, "v1", batch_size=1)
    made = len(calls)
    again = [ShardDataset(root, "v1", batch_size=1) for _ in range(2)]
    assert len(calls) == made, calls  # neither later rank hashed
    assert all(_keys(ds) == _keys(first) for ds in again)
    stamps = list((cache_dir / LAYOUT).glob("*.arrays.checked"))
    assert len(stamps) == len(list((cache_dir / LAYOUT).glob("*.arrays"))) >= 2


def test_an_unstamped_file_is_hashed_once_per_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, stamp = _arrays_entry(CatalogCache(tmp_path), "columns/1")
    stamp.unlink()  # e.g. a file of an older release, or a cache the maker could not stamp
    calls = _count_hashes(monkeypatch)
    before = path.stat()
    assert [_read(tmp_path, "columns/1") for _ in range(3)] == [list(range(1000))] * 3
    assert len(calls) == 1 and stamp.exists()
    # A hit refreshes the stamp for the eviction order, never the file (its ctime is checked).
    after = path.stat()
    assert (after.st_mtime_ns, after.st_ctime_ns) == (before.st_mtime_ns, before.st_ctime_ns)


@pytest.mark.parametrize("how", ["flip", "truncate", "replace"])
def test_a_changed_file_is_hashed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """An edit in place with the mtime put back (the ctime still moves), a truncation, a copy
    with its times put under the same name: the stamp no longer matches."""
    cache = CatalogCache(tmp_path)
    path, stamp = _arrays_entry(cache, "columns/1")
    st = path.stat()
    calls = _count_hashes(monkeypatch)
    if how == "flip":
        with open(path, "r+b") as fh:
            fh.seek(-8, os.SEEK_END)
            byte = fh.read(1)
            fh.seek(-8, os.SEEK_END)
            fh.write(bytes([byte[0] ^ 0x01]))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif how == "truncate":
        os.truncate(path, st.st_size - 64)
    else:
        twin = tmp_path / "twin"
        shutil.copy2(path, twin)  # the same bytes and mtime, another inode
        os.replace(twin, path)
    got = CatalogCache(tmp_path)
    found = got.get_arrays("columns/1")
    if how == "replace":
        assert found is not None and len(calls) == 1  # hashed, good, stamped again
        assert _read(tmp_path, "columns/1") == list(range(1000)) and len(calls) == 1
        return
    assert found is None and got.discarded == 1
    assert len(calls) == (how == "flip")  # a truncation fails the size check first
    assert not path.exists() and not stamp.exists()  # deleted with its stamp
    remade = got.fetch_arrays("columns/1", lambda: ({"n": 1}, {"a": np.ones(3)}))
    assert remade[0] == {"n": 1} and stamp.exists()


@pytest.mark.parametrize("how", ["other", "torn", "forged", "racy", "garbage"])
def test_a_stamp_not_of_this_file_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    cache = CatalogCache(tmp_path)
    path, stamp = _arrays_entry(cache, "columns/1")
    other, other_stamp = _arrays_entry(cache, "columns/2", 10)
    doc = json.loads(stamp.read_text())
    if how == "other":
        shutil.copy(other_stamp, stamp)
    elif how == "torn":
        stamp.write_bytes(stamp.read_bytes()[:40])
    elif how == "forged":  # another data digest (as for another file's content)
        stamp.write_text(json.dumps({**doc, "data_sha256": "0" * 64}))
    elif how == "racy":  # written within the file's ctime tick: a later edit could keep it
        ctime = path.stat().st_ctime_ns
        os.utime(stamp, ns=(ctime, ctime))
    else:
        stamp.write_bytes(b"\0" * 100)
    calls = _count_hashes(monkeypatch)
    assert _read(tmp_path, "columns/1") == list(range(1000))
    assert len(calls) == 1  # hashed: the stamp vouched for nothing
    assert json.loads(stamp.read_text()) == doc  # stamped again, by the reader that hashed
    assert _read(tmp_path, "columns/1") == list(range(1000)) and len(calls) == 1


def test_stamps_count_and_go_with_their_file(tmp_path: Path) -> None:
    cache = CatalogCache(tmp_path)
    path, stamp = _arrays_entry(cache, "columns/1|v=aaaa")
    listed = {p: size for p, size, _m in cache.entries()}
    assert listed == {path: path.stat().st_size + stamp.stat().st_size}  # never an entry itself
    assert cache.drop([], ["aaaa"]) == 1  # a forget: the file and its stamp
    assert not path.exists() and not stamp.exists()
    # Eviction: the older file goes with its stamp; a stamp whose file is gone goes too.
    path, stamp = _arrays_entry(cache, "columns/1")
    orphan = tmp_path / LAYOUT / ("ab" * 32 + ".arrays.checked")
    orphan.write_text("{}")
    for p in (path, stamp, orphan):
        os.utime(p, (1, 1))
    cache.max_bytes = path.stat().st_size  # room for the newer file alone
    newer, newer_stamp = _arrays_entry(cache, "columns/2")
    assert not path.exists() and not stamp.exists() and not orphan.exists()
    assert newer.exists() and newer_stamp.exists()
