"""What a loader reads: its sources (root, version, selection, weight) and their row table.

One :class:`MixMember` is a selection of one version of one root. A loader over several sources
(:meth:`ShardDataset.mix <shardlake.torch.ShardDataset.mix>`) concatenates their selected manifest
rows into one :class:`~shardlake.torch.reader.RowTable`; shards of different stores are read
through :class:`SourceStores`, which routes each shard key to its own store. How many samples of
each source an epoch takes (``weight``, ``repeat``, ``choose``) and which ones is decided per
epoch by :func:`epoch_rows`, seeded, so a rerun is identical.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import SelectionError, UsageError
from ..meta.catalog import node_catalog_cache
from ..query.dataset import Dataset
from ..read.catalog_cache import catalog_cache
from ..store import Store, open_store
from ..store.url import location
from .heap import trim_heap
from .reader import RowTable
from .strings import StringColumn, key_digest

__all__ = [
    "MixMember",
    "combine",
    "epoch_counts",
    "epoch_rows",
    "load_keys",
    "paused_gc",
    "release_set_up_memory",
    "select_rows",
    "selection_key_digest",
]

# The manifest columns the loader reads (a subset of format.manifest.CORE_COLUMNS).
READER_COLUMNS = ["key", "partition", "shard", "offset", "size", "raw_size", "crc32"]
IntArray = np.ndarray[Any, np.dtype[np.int64]]
INT32_MAX = 2**31 - 1


def compact_int(values: np.ndarray[Any, Any], upper: int | None = None) -> np.ndarray[Any, Any]:
    """``values`` (non-negative) as int32 when they, and ``upper`` (a bound derived values must
    stay under, e.g. offset + size), fit; else int64. Halves the row table's resident bytes."""
    top = max(int(values.max()) if len(values) else 0, upper or 0)
    low = int(values.min()) if len(values) else 0
    dtype = np.int32 if low >= 0 and top <= INT32_MAX else np.int64
    return values.astype(dtype, copy=False)


def _compact_crc(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """CRC-32s as uint32 (a value outside it, never a valid CRC, keeps int64 and mismatches)."""
    if len(values) and (int(values.min()) < 0 or int(values.max()) > 0xFFFFFFFF):
        return values
    return values.astype(np.uint32)


def index_dtype(count: int) -> type[np.signedinteger[Any]]:
    """The smallest signed dtype holding indices ``0 .. count - 1``."""
    for dtype in (np.int8, np.int16, np.int32):
        if count <= np.iinfo(dtype).max + 1:
            return dtype
    return np.int64


@dataclass(frozen=True)
class MixMember:
    """One input of a mix: a selection of one version of one root, and its share of an epoch.

    Selection: at most one of ``keyset``, ``where`` and ``keys`` (none selects everything).
    Share, at most one of: ``weight`` (relative proportion of the epoch's samples; weights of
    the mix are normalised), ``repeat`` (an absolute count of ``repeat`` x the selection size,
    e.g. 2 or 0.5) and ``choose`` (an absolute count of samples). None of them means
    ``repeat=1``. An epoch takes ``floor(count / size)`` full passes of the source plus a seeded
    random subset (without replacement) for the rest, so repeats are explicit and no sample is
    taken twice more often than the count requires.
    """

    url: str | Store
    version: str | None = None  # None: the keyset's own version, else latest
    keyset: str | None = None
    where: str | None = None
    keys: Sequence[str] | None = None
    weight: float | None = None
    repeat: float | None = None
    choose: int | None = None
    name: str | None = None
    storage_options: dict[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.keyset, self.where, self.keys)) > 1:
            raise SelectionError("pass at most one of keyset=, where= and keys=")
        if sum(x is not None for x in (self.weight, self.repeat, self.choose)) > 1:
            raise UsageError(f"source {self.label}: pass at most one of weight=, repeat=, choose=")
        for name in ("weight", "repeat", "choose"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise UsageError(f"source {self.label}: {name}={value!r} must be >= 0")

    @property
    def label(self) -> str:
        if self.name is not None:
            return self.name
        url = self.url if isinstance(self.url, str) else self.url.url
        return f"{url}@{self.version or (self.keyset and 'keyset ' + self.keyset) or 'latest'}"


@dataclass
class SourceRows:
    """One source resolved: its store, version and selected manifest rows."""

    source: MixMember
    store: Store
    version_tag: str
    version_hash: str
    selection: dict[str, Any]
    table: pa.Table
    shard_key: Any  # (partition, shard) -> shard key in its store


def select_rows(source: MixMember, meta_columns: Sequence[str] = ()) -> SourceRows:
    """Resolve ``source``: open its version and select its manifest rows (the table set-up).
    The catalog is read through the node-local catalog cache: the ranks of a node read it
    from the store once."""
    with node_catalog_cache():
        return _select_rows(source, meta_columns)


def _select_rows(source: MixMember, meta_columns: Sequence[str]) -> SourceRows:
    store = source.url if isinstance(source.url, Store) else location(source.url)
    ds = Dataset.open(open_store(store, source.storage_options), source.version, source.keyset)
    wanted = list(dict.fromkeys([*READER_COLUMNS, *meta_columns]))
    selected = ds.select(where=source.where, keyset=source.keyset, keys=source.keys)
    table: pa.Table | None = None
    if source.where is None and source.keyset is None and source.keys is None:
        # Everything: only the loader's columns are decoded (a catalog segment's other columns,
        # e.g. 64-character source digests, are most of its bytes), and nothing is filtered.
        table = ds.manifests(wanted)
        columns = table.column_names
        if len(columns) < len(wanted) or table.num_rows == 0:
            table = None  # the messages below (an unknown column, an empty version)
    if table is None:
        columns = ds.manifests().column_names
        missing = [c for c in meta_columns if c not in columns]
        if missing:
            raise SelectionError(
                f"unknown meta_columns {', '.join(missing)}; manifest columns: {', '.join(columns)}"
            )
        table = selected.rows(None if source.where else [c for c in wanted if c in columns])
    selection = selected.describe()
    return SourceRows(
        source, ds.store, ds.version.tag, ds.version.hash, selection, table, ds.shard_key
    )


def load_keys(sources: Sequence[MixMember]) -> StringColumn:
    """The sample keys of resolved ``sources`` (each pinned to its version), in table order:
    what :class:`~shardlake.torch.strings.LazyStrings` reads back when asked for a key."""
    return StringColumn.concat(
        [StringColumn.from_arrow(select_rows(s).table.column("key")) for s in sources]
    )


def selection_key_digest(rows: SourceRows) -> str:
    """:func:`~shardlake.torch.strings.key_digest` of the source's selected keys. A whole
    version's is a function of the version alone, so it is kept in the node-local catalog cache
    (keyed by the version hash and row count): the other ranks of a node skip the sort and
    hashing of every key. Other selections are computed each time."""
    keys = rows.table.column("key")
    cache = catalog_cache() if rows.selection == {"all": True} else None
    if cache is None:
        return key_digest(keys)
    what = f"selection-digest|{rows.version_hash}|all|{rows.table.num_rows}"
    return cache.fetch_derived(what, lambda: key_digest(keys))


class SourceStores:
    """The stores of a mix behind the two calls a slot reader makes.

    Shard keys of the combined table are ``"<source index>:<key>"``; each read is routed to its
    source's store (ranges keep their order).
    """

    def __init__(self, stores: Sequence[Store]) -> None:
        self.stores = list(stores)

    @property
    def url(self) -> str:
        return " + ".join(s.url for s in self.stores)

    def _split(self, key: str) -> tuple[Store, str]:
        index, _, inner = key.partition(":")
        return self.stores[int(index)], inner

    def key_url(self, key: str) -> str:
        store, inner = self._split(key)
        return store.key_url(inner)

    def read_ranges(
        self, ranges: Sequence[tuple[str, int, int]], *, views: bool = False
    ) -> list[bytes | memoryview]:
        by_store: dict[int, list[int]] = {}
        for i, (key, _s, _e) in enumerate(ranges):
            by_store.setdefault(int(key.partition(":")[0]), []).append(i)
        out: list[bytes | memoryview] = [b""] * len(ranges)
        for index, members in by_store.items():
            parts = [(ranges[i][0].partition(":")[2], ranges[i][1], ranges[i][2]) for i in members]
            got = self.stores[index].read_ranges(parts, views=views)
            for i, data in zip(members, got, strict=True):
                out[i] = data
        return out


@dataclass
class Combined:
    """The sources' rows as one table: row ``i`` belongs to source ``source_of[i]``."""

    table: RowTable
    store: Any  # a Store, or SourceStores for a mix
    source_of: IntArray
    partition_of: IntArray
    partition_names: list[str]
    meta: dict[str, list[Any]]
    sizes: list[int]


def _shard_index(pids: pa.ChunkedArray, shards: IntArray) -> tuple[IntArray, list[tuple[str, int]]]:
    """Per row, the index of its (partition, shard) pair, numbered by first appearance; and
    the pairs in that order. Vectorised: no per-row Python objects."""
    codes = pids.dictionary_encode().combine_chunks() if len(pids) else None
    if codes is None:
        return np.zeros(0, dtype=np.int64), []
    part = codes.indices.to_numpy().astype(np.int64)
    pair = part * (int(shards.max()) + 1) + shards
    changes = np.flatnonzero(pair[1:] != pair[:-1]) + 1
    starts = np.concatenate([[0], changes])
    if len(np.unique(pair[starts])) == len(starts):
        # Each pair in one run (catalog rows come grouped by partition, then by shard): the
        # runs are the pairs in first-appearance order, numbered without a sort of every row.
        run = np.zeros(len(pair), dtype=np.int64)
        run[changes] = 1
        names = codes.dictionary.to_pylist()
        firsts = zip(part[starts].tolist(), shards[starts].tolist(), strict=True)
        return np.cumsum(run), [(names[p], s) for p, s in firsts]
    _u, first, inverse = np.unique(pair, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    names = codes.dictionary.to_pylist()
    order = np.sort(first)
    return rank[inverse.reshape(-1)], [(names[part[i]], int(shards[i])) for i in order]


def _partition_index(pids: pa.ChunkedArray) -> tuple[IntArray, list[str]]:
    """Per row, the index of its partition among the sorted partition ids; and those ids."""
    names = sorted(pc.unique(pids).to_pylist()) if len(pids) else []
    index = pc.index_in(pids, value_set=pa.array(names, pa.string()))
    return index.to_numpy().astype(np.int64), names


def combine(resolved: Sequence[SourceRows], meta_columns: Sequence[str]) -> Combined:
    """One row table over all sources (a single source keeps its own store and shard keys).

    Integer columns are int32 where their values fit (CRC-32s uint32), indices the smallest
    signed type: at 1M samples and more the table is most of a loader's memory."""
    mixed = len(resolved) > 1
    keys: list[StringColumn] = []
    shard_keys: list[str] = []
    columns: dict[str, list[IntArray]] = {
        c: [] for c in ("shard", "offset", "size", "raw_size", "crc32")
    }
    partition_of: list[IntArray] = []
    part_names: list[str] = []
    meta: dict[str, list[Any]] = {c: [] for c in meta_columns}
    for index, src in enumerate(resolved):
        t = src.table
        pids = t.column("partition")
        shard_idx, pairs = _shard_index(pids, t.column("shard").to_numpy().astype(np.int64))
        columns["shard"].append(shard_idx + len(shard_keys))
        prefix = f"{index}:" if mixed else ""
        shard_keys.extend(prefix + src.shard_key(pid, s) for pid, s in pairs)
        for c in ("offset", "size", "raw_size", "crc32"):
            columns[c].append(t.column(c).to_numpy().astype(np.int64))
        keys.append(StringColumn.from_arrow(t.column("key")))
        part_index, names = _partition_index(pids)
        partition_of.append(part_index + len(part_names))
        part_names.extend(f"{src.source.label}/{p}" if mixed else p for p in names)
        for c in meta_columns:
            meta[c].extend(t.column(c).to_pylist())
    merged = {c: np.concatenate(v) for c, v in columns.items()}
    ends = merged["offset"] + merged["size"]
    table = RowTable(
        shard=compact_int(merged.pop("shard")),
        offset=compact_int(merged.pop("offset"), int(ends.max()) if len(ends) else 0),
        size=compact_int(merged.pop("size")),
        raw_size=compact_int(merged.pop("raw_size")),
        crc32=_compact_crc(merged.pop("crc32")),
        keys=StringColumn.concat(keys),
        shard_keys=shard_keys,
    )
    del ends
    sizes = [r.table.num_rows for r in resolved]
    source_of = np.repeat(
        np.arange(len(resolved), dtype=index_dtype(len(resolved))), np.asarray(sizes, np.int64)
    )
    store: Any = SourceStores([r.store for r in resolved]) if mixed else resolved[0].store
    return Combined(
        table,
        store,
        source_of,
        np.concatenate(partition_of).astype(index_dtype(len(part_names))),
        part_names,
        meta,
        sizes,
    )


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector off for a block: the table set-up allocates tuples and
    lists by the ten thousand, and each collection they trigger scans every object of the
    process (torch's included; ~0.3 s of a 1M-sample set-up). :func:`release_set_up_memory`
    collects once afterwards."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def release_set_up_memory() -> None:
    """Hand the memory the table set-up freed (the catalog's Arrow tables, sort buffers) back
    to the OS, so DataLoader workers forked afterwards do not carry the dead pages (at 1M
    samples ~200 MB of PSS)."""
    gc.collect()
    trim_heap()


def epoch_counts(
    sources: Sequence[MixMember], sizes: Sequence[int], epoch_size: int | None
) -> list[int]:
    """Samples each source contributes to every epoch."""
    counts = [0] * len(sources)
    weighted = [i for i, s in enumerate(sources) if s.weight is not None]
    for i, s in enumerate(sources):
        if s.choose is not None:
            counts[i] = int(s.choose)
        elif s.weight is None:
            counts[i] = round((1.0 if s.repeat is None else s.repeat) * sizes[i])
    if weighted:
        total = sum(sizes) if epoch_size is None else int(epoch_size)
        budget = max(0, total - sum(counts))
        weights = np.array([sources[i].weight for i in weighted], dtype=np.float64)
        if weights.sum() <= 0:
            raise UsageError("the weights of a mix must not all be 0")
        exact = weights / weights.sum() * budget
        share = np.floor(exact).astype(np.int64)
        # Largest remainder: the rounding never changes the total.
        for j in np.argsort(-(exact - share), kind="stable")[: budget - int(share.sum())]:
            share[j] += 1
        for i, c in zip(weighted, share.tolist(), strict=True):
            counts[i] = c
    if sum(counts) == 0:
        raise UsageError("the mix takes no samples per epoch; give a source a weight or count")
    return counts


def epoch_rows(counts: Sequence[int], sizes: Sequence[int], seed: int, epoch: int) -> IntArray:
    """The combined-table rows of one epoch (a row repeats when its source is up-sampled)."""
    parts: list[IntArray] = []
    base = 0
    for index, (count, size) in enumerate(zip(counts, sizes, strict=True)):
        full, rest = divmod(count, size)
        parts.extend([np.arange(base, base + size, dtype=np.int64)] * full)
        if rest:
            text = f"shardlake.mix/1|{seed}|{epoch}|{index}".encode()
            digest = hashlib.sha256(text).digest()
            rng = np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "little")))
            parts.append(base + np.sort(rng.choice(size, size=rest, replace=False)))
        base += size
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
