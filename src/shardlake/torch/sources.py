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
import functools
import gc
import hashlib
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
import pyarrow as pa

from ..errors import SelectionError, UsageError
from ..meta.catalog_objects import node_catalog_cache
from ..meta.keysets import load_keyset_object
from ..query.dataset import Dataset, keyset_version
from ..query.selection import keyset_selection
from ..read.catalog_cache import catalog_cache
from ..root.door import HoldsStore, StoreLike, as_store, store_like
from ..store import Store
from .columns import SourceColumns, compact_crc, compact_int, index_dtype, partition_breaks
from .heap import trim_heap
from .reader import RowTable
from .source_rows import NARROW_COLUMNS as NARROW_COLUMNS  # where the catalog read is
from .source_rows import checked_keys, keyset_keys, read_rows
from .source_stores import SourceStores
from .strings import LazyStrings, StringColumn, key_digest

__all__ = [
    "MixMember",
    "combine",
    "compact_int",
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

    ``url`` is a :data:`~shardlake.StoreLike` (a URL or path opened with ``storage_options``,
    an opened :class:`~shardlake.Store` or a :class:`~shardlake.Root`; storage options with an
    opened one are refused), opened through :func:`shardlake.as_store`.
    """

    url: StoreLike
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
        checked = store_like(self.url, self.storage_options, name=f"{type(self).__name__}(url)")
        if not isinstance(self.url, str):  # a Root: its store; a path object: its text
            object.__setattr__(self, "url", checked)
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
        url = self.url.url if isinstance(self.url, Store | HoldsStore) else os.fspath(self.url)
        return f"{url}@{self.version or (self.keyset and 'keyset ' + self.keyset) or 'latest'}"


@dataclass
class SourceRows:
    """One source resolved: its store, version, selection and loader columns. ``table`` (the
    selected manifest rows) is ``None`` when the columns came from the node-local catalog
    cache; :meth:`key_column` then reads the keys back from the catalog."""

    source: MixMember
    store: Store
    version_tag: str
    version_hash: str
    selection: dict[str, Any]
    columns: SourceColumns
    table: pa.Table | None
    shard_key: Any  # (partition, shard) -> shard key in its store
    read_keys: Any = None  # () -> the key column, where ``table`` is None
    # What the selection is in the node-local cache's names ("all", "keyset/<sha256>"); None:
    # a where or keys (not cached).
    cached_as: str | None = None
    digest_ahead: Future[str] | None = None  # the selection digest, being computed

    @property
    def rows(self) -> int:
        return len(self.columns)

    def key_column(self) -> pa.ChunkedArray:
        if self.table is not None:
            return self.table.column("key")
        return cast(pa.ChunkedArray, self.read_keys())


# The cached loader columns of a whole version: a function of the version's content alone.
COLUMNS_ENTRY = "loader-columns/1"


def select_rows(
    source: MixMember, meta_columns: Sequence[str] = (), *, cached: bool = False
) -> SourceRows:
    """Resolve ``source``: open its version and select its manifest rows (the table set-up).
    The catalog is read through the node-local catalog cache: the ranks of a node read it
    from the store once. ``cached=True``: a whole version's loader columns come from the
    cache's derived files (built by the node's first rank, mapped by the others), and its
    manifest rows are not decoded at all."""
    with node_catalog_cache():
        return _select_rows(source, meta_columns, cached)


def _select_rows(source: MixMember, meta_columns: Sequence[str], cached: bool) -> SourceRows:
    store = as_store(source.url, source.storage_options, name="MixMember(url)")
    # A keyset's object is read once; its keys are decoded only where its rows are selected.
    held = None if source.keyset is None else load_keyset_object(store, source.keyset)
    if held is None:
        ds = Dataset.open(store, source.version)
        selected = ds.select(where=source.where, keys=source.keys)
    else:
        ds = Dataset(store, keyset_version(store, source.version, held.head))
        selected = keyset_selection(ds, held)
    wanted = list(dict.fromkeys([*READER_COLUMNS, *meta_columns]))
    everything = source.where is None and source.keyset is None and source.keys is None
    # A whole version's columns are a function of the version; a keyset's, of the version and
    # the keyset object's bytes (a name bound again is another object, never a stale entry).
    cached_as = "all" if everything else None if held is None else f"keyset/{held.sha256}"
    cache = catalog_cache() if cached and cached_as and not meta_columns else None
    read: list[pa.Table] = []
    ahead: list[Future[str]] = []

    def rows() -> pa.Table:
        if not read:
            read.append(read_rows(ds, selected, source.where, wanted, meta_columns, everything))
            if cache is not None:  # a node's first rank: its digest is not cached either
                ahead.append(_digest_ahead(read[0]))
        return read[0]

    def make() -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
        return SourceColumns.from_table(rows()).to_cache()

    if cache is not None:
        what = f"{COLUMNS_ENTRY}|{ds.version.hash}|{cached_as}|{','.join(READER_COLUMNS)}"
        columns = SourceColumns.from_cache(*cache.fetch_arrays(what, make))
    else:
        columns = SourceColumns.from_table(rows())
    table = read[0] if read else None
    keys = checked_keys if held is None else functools.partial(keyset_keys, held)
    return SourceRows(
        source,
        ds.store,
        ds.version.tag,
        ds.version.hash,
        selected.describe(),
        columns,
        table,
        ds.shard_key,
        read_keys=functools.partial(keys, ds, columns),
        cached_as=cached_as,
        digest_ahead=ahead[0] if ahead else None,
    )


def _digest_ahead(table: pa.Table) -> Future[str]:
    """The selection digest of ``table``'s keys, computed on a thread of its own while the
    loader columns are built and written (sha256, the key comparisons and the framing copies
    release the GIL): a cold first rank's two largest set-up costs overlap."""
    future: Future[str] = Future()

    def run() -> None:
        try:
            breaks = partition_breaks(table.column("partition"))
            future.set_result(key_digest(table.column("key"), breaks))
        except BaseException as exc:  # handed to whoever asks for the digest
            future.set_exception(exc)

    threading.Thread(target=run, name="shardlake-digest", daemon=True).start()
    return future


def load_keys(sources: Sequence[MixMember]) -> StringColumn:
    """The sample keys of resolved ``sources`` (each pinned to its version), in table order:
    what :class:`~shardlake.torch.strings.LazyStrings` reads back when asked for a key."""
    return StringColumn.concat(
        [StringColumn.from_arrow(select_rows(s).key_column()) for s in sources]
    )


def selection_key_digest(rows: SourceRows) -> str:
    """:func:`~shardlake.torch.strings.key_digest` of the source's selected keys. A whole
    version's is a function of the version alone, so it is kept in the node-local catalog cache
    (keyed by the version hash and row count): the other ranks of a node skip the sort and
    hashing of every key. So is a keyset's, of the version and the keyset object (its sha256).
    Other selections are computed each time."""
    cache = catalog_cache() if rows.cached_as else None

    def digest() -> str:
        if rows.digest_ahead is not None:
            return rows.digest_ahead.result()
        partition = rows.columns.partition  # rows of one partition are one sorted run
        breaks = np.flatnonzero(partition[1:] != partition[:-1]) + 1
        return key_digest(rows.key_column(), breaks)

    if cache is None:
        return digest()
    what = f"selection-digest|{rows.version_hash}|{rows.cached_as}|{rows.rows}"
    found = cache.fetch_derived(what, digest)
    if rows.digest_ahead is not None:  # cached after all: no thread outlives the set-up
        rows.digest_ahead.exception()  # (DataLoader workers may be forked next)
    return found


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


def _joined(parts: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    """One array of ``parts`` (one part is kept as it is: a mapped cache file stays mapped)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def combine(
    resolved: Sequence[SourceRows], meta_columns: Sequence[str], *, include_key: bool = True
) -> Combined:
    """One row table over all sources (a single source keeps its own store and shard keys).

    Integer columns are int32 where their values fit (CRC-32s uint32), indices the smallest
    signed type: at 1M samples and more the table is most of a loader's memory. Without
    ``include_key`` the table's keys are a :class:`LazyStrings` that reads them back from the
    catalog (pinned to the resolved versions) the first time something asks."""
    mixed = len(resolved) > 1
    shard_keys: list[str] = []
    columns: dict[str, list[np.ndarray[Any, Any]]] = {
        c: [] for c in ("shard", "offset", "size", "raw_size", "crc32")
    }
    partition_of: list[np.ndarray[Any, Any]] = []
    part_names: list[str] = []
    meta: dict[str, list[Any]] = {c: [] for c in meta_columns}
    for index, src in enumerate(resolved):
        cols = src.columns
        columns["shard"].append(cols.shard + len(shard_keys) if shard_keys else cols.shard)
        prefix = f"{index}:" if mixed else ""
        shard_keys.extend(prefix + src.shard_key(pid, s) for pid, s in cols.pairs)
        for c in ("offset", "size", "raw_size", "crc32"):
            columns[c].append(getattr(cols, c))
        partition_of.append(
            cols.partition.astype(np.int64) + len(part_names) if part_names else cols.partition
        )
        part_names.extend(f"{src.source.label}/{p}" if mixed else p for p in cols.partition_names)
        if meta_columns:
            table = src.table if src.table is not None else pa.table({})
            for c in meta_columns:
                meta[c].extend(table.column(c).to_pylist())
    merged = {c: _joined(v) for c, v in columns.items()}
    sizes = [r.rows for r in resolved]
    keys: Sequence[str]
    if include_key:
        keys = StringColumn.concat([StringColumn.from_arrow(r.key_column()) for r in resolved])
    else:
        pinned = [
            replace(r.source, version=r.version_tag, weight=None, repeat=None, choose=None)
            for r in resolved
        ]
        keys = LazyStrings(sum(sizes), functools.partial(load_keys, pinned))
    crc = merged.pop("crc32")
    table = RowTable(
        shard=compact_int(merged.pop("shard")),
        offset=compact_int(merged.pop("offset"), max(r.columns.offset_end for r in resolved)),
        size=compact_int(merged.pop("size")),
        raw_size=compact_int(merged.pop("raw_size")),
        crc32=crc if crc.dtype == np.uint32 else compact_crc(crc.astype(np.int64)),
        keys=keys,
        shard_keys=shard_keys,
    )
    which = np.arange(len(resolved), dtype=index_dtype(len(resolved)))
    # One source: a read-only view of one 0 (no byte a row: 100 MB at 100M samples).
    source_of = np.repeat(which, sizes) if mixed else np.broadcast_to(which, (sizes[0],))
    store: Any = SourceStores([r.store for r in resolved]) if mixed else resolved[0].store
    return Combined(
        table,
        store,
        source_of,
        _joined(partition_of).astype(index_dtype(len(part_names)), copy=False),
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
    samples ~200 MB of PSS). The set-up's objects are young (it ran with the collector paused),
    so collecting the young generations frees its cycles; a full collection would scan every
    object of the process too, torch's included (~80 ms of every start-up, however small)."""
    gc.collect(1)
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
