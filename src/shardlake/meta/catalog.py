"""Reading and writing a version's catalog (encoding: :mod:`shardlake.format.catalog`).

Readers get a version's rows with :func:`catalog_rows` (column projection, partition pruning):
a constant number of requests whatever the partition count - the partitions table and each live
segment once (at most ``MAX_LIVE_SEGMENTS + 1`` objects, whole or by ranged reads of the column
chunks wanted). Publishing calls :func:`publish_catalog`, which writes one segment for the
partitions whose rows it does not find in the base's catalog and reuses the base's segments for
the rest. A format-1 version has no catalog in its record: ``shardlake catalog`` attaches one
(:func:`attach_catalog`); without it the catalog is built in memory from the manifests on first
use (one read per partition, once per process).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import AlreadyExistsError, FormatError, IntegrityError, KeyNotFoundError
from ..format.catalog import (
    MAX_LIVE_SEGMENTS,
    SEGMENT_MAX_ROWS,
    CatalogRef,
    ObjectRef,
    attached_catalog_key,
    coalesce,
    column_ranges,
    decode_segment,
    encode_partitions,
    encode_segment,
    partitions_key,
    row_groups_for,
    segment_key,
)
from ..format.documents import PartitionEntry
from ..format.manifest import CORE_SCHEMA, entry_mismatches
from ..read.manifests import read_entry_manifest
from ..store import Store
from .catalog_objects import _cache, read_object, read_partitions, write_object

if TYPE_CHECKING:
    from .versions import StoredVersion


__all__ = [
    "Catalog",
    "CatalogInfo",
    "attach_catalogs",
    "catalog_mismatch",
    "catalog_rows",
    "load_catalog",
    "publish_catalog",
    "rows_by_partition",
]


# Segments up to this size are read whole (one GET); larger ones by the column chunks wanted
# when those are less than half the object.
WHOLE_READ_BYTES = 8 * 2**20
RANGE_GAP_BYTES = 2**20
# Ranged reads only when the wanted column chunks are at most this fraction of the segment.
RANGED_MAX_FRACTION = 0.5
_MANIFEST_READERS = 16
_BUILT_CACHE = 4  # in-memory catalogs of format-1 versions kept per process


def _open_segment(
    store: Store,
    ref: ObjectRef,
    columns: Sequence[str] | None,
    pids: Sequence[str],
    **options: Any,
) -> Callable[[], pq.ParquetFile]:
    """What opens the segment as a parquet file, its bytes read into memory once: whole
    (digest-checked) or, when a projection or pruning leaves less than half of a large one,
    only its footer and wanted column chunks (parquet page checksums guard those). Empty
    ``pids``: every row group is wanted. With the catalog cache on, always whole: one
    node-wide read serves every later projection from disk. ``options``: parquet reader
    options (e.g. ``read_dictionary``)."""
    where = store.key_url(ref.key)
    if ref.size <= WHOLE_READ_BYTES or _cache() is not None:
        return _opener(read_object(store, ref, "segment"), **options)
    tail = min(ref.size, 2**16)
    buf = bytearray(ref.size)  # sparse: only the ranges read are filled
    buf[ref.size - tail :] = store.read_range(ref.key, ref.size - tail, ref.size)
    footer = int.from_bytes(buf[-8:-4], "little") + 8
    if footer > tail:
        buf[ref.size - footer :] = store.read_range(ref.key, ref.size - footer, ref.size)
    meta = pq.ParquetFile(pa.BufferReader(pa.py_buffer(buf))).metadata
    groups = row_groups_for(meta, pids or None)
    ranges = coalesce(column_ranges(meta, groups, columns), RANGE_GAP_BYTES)
    if sum(e - s for s, e in ranges) > RANGED_MAX_FRACTION * ref.size:
        return _opener(read_object(store, ref, "segment"), **options)
    for (start, end), data in zip(
        ranges, store.read_ranges([(ref.key, s, e) for s, e in ranges]), strict=True
    ):
        if len(data) != end - start:
            raise IntegrityError(f"{where}: short read of bytes {start}-{end}")
        buf[start:end] = data
    return _opener(pa.py_buffer(buf), metadata=meta, page_checksum_verification=True, **options)


def _opener(data: bytes | pa.Buffer, **options: Any) -> Callable[[], pq.ParquetFile]:
    """A parquet reader over ``data`` per call (one per decoding thread)."""
    buffer = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    return lambda: pq.ParquetFile(pa.BufferReader(buffer), **options)


@dataclass
class Catalog:
    """A version's rows: ``entries`` (partition entries, each naming its ``segment``) over the
    ``ref``'s segments, or a table ``built`` in memory from the manifests (format 1)."""

    store: Store
    label: str  # "version 'v1'", for messages
    entries: Sequence[PartitionEntry]
    ref: CatalogRef | None = None
    built: pa.Table | None = field(default=None, repr=False)

    def rows(
        self,
        columns: Sequence[str] | None = None,
        pids: Sequence[str] | None = None,
        *,
        partition_codes: bool = False,
        narrow: Sequence[str] = (),
    ) -> pa.Table:
        """Rows of ``pids`` (all partitions when ``None``) in partition-id order, then manifest
        order; only ``columns`` (those the catalog has; all when ``None``). ``partition_codes``:
        segments' ``partition`` column comes dictionary-encoded (as parquet stores it: no
        string a row; a table built from manifests keeps plain strings). ``narrow``: these
        integer columns as int32 or uint32 in each row group whose values fit (same values:
        see :func:`~shardlake.format.catalog.decode_segment`)."""
        wanted = sorted(set(pids if pids is not None else (e.id for e in self.entries)))
        if self.built is not None:
            table = self.built
            if pids is not None:
                table = table.filter(pc.is_in(table.column("partition"), pa.array(wanted)))
            cols = None if columns is None else [c for c in columns if c in table.column_names]
            return table if cols is None else table.select(cols)
        if self.ref is None:
            raise FormatError(f"{self.store.url}: {self.label} has no catalog")
        by_segment: dict[str, list[str]] = {}
        segment_of = {e.id: e.segment for e in self.entries}
        for pid in wanted:
            digest = segment_of.get(pid)  # None: a partition without rows (or not in it)
            if digest:
                by_segment.setdefault(digest, []).append(pid)
        samples = {e.id: e.samples for e in self.entries}
        # The partition column is read even when not asked for: rows of several segments are
        # put in one order by it (partition, then manifest order), whatever columns are wanted.
        read = None if columns is None else list(dict.fromkeys([*columns, "partition"]))
        options = {"read_dictionary": ["partition"]} if partition_codes else {}
        tables = []
        # Segments in the order of their first partition (each one's rows are sorted by
        # partition): when their partitions do not interleave, as a publish in parts writes
        # them, the concatenation is already in order and no row is moved.
        groups = sorted(by_segment.items(), key=lambda item: item[1][0])
        for digest, seg_pids in groups:
            ref = self.ref.segment(digest, self.label)
            every_row = sum(samples[p] for p in seg_pids) == ref.rows
            source = _open_segment(self.store, ref, read, [] if every_row else seg_pids, **options)
            url = self.store.key_url(ref.key)
            tables.append(decode_segment(source, url, read, seg_pids, every_row, narrow))
        apart = all(a[1][-1] < b[1][0] for a, b in zip(groups, groups[1:], strict=False))
        table = _ordered(tables, read, sort=not apart)
        if columns is None:
            return table
        return table.select([c for c in columns if c in table.column_names])


def _ordered(
    tables: list[pa.Table], columns: Sequence[str] | None, *, sort: bool = True
) -> pa.Table:
    if not tables:
        schema = (
            CORE_SCHEMA
            if columns is None
            else pa.schema([f for f in CORE_SCHEMA if f.name in columns])
        )
        return schema.empty_table()
    try:
        table = pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise FormatError(f"catalog segments have conflicting column types ({exc})") from exc
    if sort and len(tables) > 1 and "partition" in table.column_names:
        table = _by_partition(table)
    return table


def _by_partition(table: pa.Table) -> pa.Table:
    """``table`` stably sorted by partition id (byte order). Segments and manifests hold each
    partition's rows together, so whole runs are put in order as slices: no per-row string
    sort and take (5M rows of 2,000 partitions in two segments: 0.6-2.7 s instead of 3-7 s)."""
    n = table.num_rows
    if n < 2:
        return table
    column = table.column("partition")
    flat = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    changed = pc.fill_null(pc.not_equal(flat.slice(1), flat.slice(0, n - 1)), True)
    starts = np.concatenate([[0], np.flatnonzero(changed.to_numpy(zero_copy_only=False)) + 1])
    ends = np.append(starts[1:], n)
    pids = [p or "" for p in flat.take(pa.array(starts)).to_pylist()]
    order = sorted(range(len(starts)), key=lambda i: (pids[i].encode(), i))
    if order == list(range(len(starts))):
        return table
    pieces = [table.slice(int(starts[i]), int(ends[i] - starts[i])) for i in order]
    out = pa.concat_tables(pieces)
    return out.combine_chunks() if len(pieces) > 64 else out


_built: OrderedDict[tuple[str, str], pa.Table] = OrderedDict()
_built_lock = threading.Lock()


def _manifest_tables(store: Store, entries: Sequence[PartitionEntry], label: str) -> list[pa.Table]:
    """Each entry's manifest rows (in ``entries``' order), read concurrently and checked
    against the entry."""

    def one(entry: PartitionEntry) -> pa.Table:
        table, meta = read_entry_manifest(store, entry)
        problems = entry_mismatches(entry, table, meta)
        if problems:
            raise FormatError(f"{store.key_url(entry.manifest)}: {label}: " + "; ".join(problems))
        return table.replace_schema_metadata(None)

    with ThreadPoolExecutor(max_workers=_MANIFEST_READERS) as pool:
        return list(pool.map(one, entries))


def _manifest_rows(store: Store, entries: Sequence[PartitionEntry], label: str) -> pa.Table:
    """Every entry's manifest rows, in partition order."""
    tables = _manifest_tables(store, sorted(entries, key=lambda e: e.id), label)
    return _ordered(tables, None) if len(tables) != 1 else tables[0]


def _attached(store: Store, version: StoredVersion) -> CatalogRef | None:
    """The catalog ``shardlake catalog`` attached to a format-1 version, if any and matching."""
    key = attached_catalog_key(version.tag, version.hash)
    try:
        doc = json.loads(store.read(key))
    except KeyNotFoundError:
        return None
    except ValueError as exc:
        raise FormatError(f"{store.key_url(key)}: not valid JSON ({exc})") from exc
    if not isinstance(doc, Mapping) or doc.get("version") != version.hash:
        raise FormatError(f"{store.key_url(key)}: not the catalog of version {version.hash}")
    return CatalogRef.from_json(doc.get("catalog"), store.key_url(key))


def _matching(store: Store, ref: CatalogRef, version: StoredVersion) -> tuple[PartitionEntry, ...]:
    """The attached catalog's entries, refused unless they name the version's manifests."""
    where = store.key_url(ref.partitions.key)
    entries = tuple(
        PartitionEntry.from_json(e, where)
        for e in read_partitions(store, ref.partitions, f"version {version.tag!r}")
    )
    want = {e.id: (e.manifest, e.manifest_sha256) for e in version.entries}
    got = {e.id: (e.manifest, e.manifest_sha256) for e in entries}
    mismatch = [pid for pid in want if got.get(pid, (None, None))[0] != want[pid][0]] + [
        pid for pid, (_, sha) in want.items() if sha and got.get(pid, (None, None))[1] != sha
    ]
    if mismatch or set(got) != set(want):
        raise FormatError(
            f"{store.key_url(ref.partitions.key)}: attached catalog does not match version "
            f"{version.tag!r} (partition {sorted(set(mismatch) | (set(got) ^ set(want)))[0]})"
        )
    return entries


def load_catalog(store: Store, version: StoredVersion, *, build: bool = True) -> Catalog:
    """The catalog of ``version``: its own, an attached one, or one built from its manifests
    (``build=False``: an empty-handed one, naming only the partitions, instead)."""
    label = f"version {version.tag!r}"
    ref = version.header.catalog
    if ref is not None:
        return Catalog(store, label, version.entries, ref)
    attached = _attached(store, version)
    if attached is not None:
        return Catalog(store, label, _matching(store, attached, version), attached)
    if not build:
        return Catalog(store, label, version.entries)
    cache_key = (store.url, version.hash)
    with _built_lock:
        table = _built.get(cache_key)
    if table is None:
        table = _manifest_rows(store, version.entries, label)
        with _built_lock:
            _built[cache_key] = table
            while len(_built) > _BUILT_CACHE:
                _built.popitem(last=False)
    return Catalog(store, label, version.entries, None, table)


def catalog_rows(
    store: Store,
    version: StoredVersion,
    columns: Sequence[str] | None = None,
    pids: Sequence[str] | None = None,
) -> pa.Table:
    """``version``'s rows (``columns`` of them; all when ``None``), optionally only ``pids``'s.
    Filtering by SQL is the query layer's (:func:`shardlake.query.sql.select`)."""
    return load_catalog(store, version).rows(columns, pids)


def _reusable(entry: PartitionEntry, base: PartitionEntry | None) -> bool:
    """Whether the base catalog's rows of ``entry``'s partition are this entry's rows."""
    return (
        base is not None
        and bool(base.segment)
        and base.manifest == entry.manifest
        and base.manifest_sha256 == entry.manifest_sha256
    )


def publish_catalog(
    store: Store,
    entries: Sequence[PartitionEntry],
    base: Catalog | None,
    fresh: Mapping[str, pa.Table],
    *,
    avoid: Collection[str] = (),
    segment_rows: int | None = None,
) -> tuple[CatalogRef, list[PartitionEntry]]:
    """Write the catalog of a version of ``entries`` (manifest digests set); return its
    reference and the entries with ``segment`` set.

    Rows of partitions the ``base`` catalog holds at the same manifest are reused; the others
    come from ``fresh`` (manifest tables publish already read) or their manifests, and go into
    new segments of at most ``segment_rows`` rows each (default :data:`SEGMENT_MAX_ROWS`; whole
    partitions, in id order), each written before the next one's rows are read. Above
    :data:`MAX_LIVE_SEGMENTS`, the live segments with the fewest live rows, among those at most
    half full, are merged into the new ones. Segments whose sha256 is in ``avoid`` are not
    reused (forget: they hold forgotten rows); the rows of unchanged partitions there are
    copied into the new segments.
    """
    segment_rows = SEGMENT_MAX_ROWS if segment_rows is None else segment_rows
    base_by_id = {e.id: e for e in base.entries} if base is not None and base.ref else {}
    segment_of: dict[str, str | None] = {}  # partition id -> segment holding its rows
    new = []
    moved = []
    for entry in entries:
        old = base_by_id.get(entry.id)
        if _reusable(entry, old) and old is not None and old.segment in avoid:
            moved.append(entry)
        elif _reusable(entry, old):
            segment_of[entry.id] = old.segment if old is not None else None
        elif entry.manifest:
            new.append(entry)
        else:
            segment_of[entry.id] = None  # no manifest, no rows
    live: dict[str, ObjectRef] = {}
    if base is not None and base.ref is not None:
        used = {s for s in segment_of.values() if s}
        live = {r.sha256: r for r in base.ref.segments if r.sha256 in used}
    new.sort(key=lambda e: e.id)
    # Copied rows are read one base segment at a time: grouped by it, then in id order.
    base_segment = {e.id: e.segment or "" for e in base_by_id.values()}
    moved.sort(key=lambda e: (base_segment.get(e.id, ""), e.id))
    # Above the bound, merge the segments with the fewest live rows, among those at most half
    # full: a full segment is never rewritten, so a merge costs at most the small ones.
    live_rows: Counter[str] = Counter()
    for entry in entries:
        digest = segment_of.get(entry.id)
        if digest:
            live_rows[digest] += entry.samples
    small = sorted((n, d) for d, n in live_rows.items() if 2 * n <= segment_rows and d in live)
    while small and len(live) + len(_packs([*new, *moved], segment_rows)) > MAX_LIVE_SEGMENTS:
        gone = small.pop(0)[1]
        del live[gone]
        moved.extend(e for e in entries if segment_of.get(e.id) == gone)
        moved.sort(key=lambda e: (base_segment.get(e.id, ""), e.id))
    # One segment per pack, written before the next pack's rows are read. New partitions come
    # first, so a pack holds new rows (from fresh or manifests), then copied ones.
    copied = _base_rows(base, moved, base_segment) if moved and base is not None else iter(())
    new_ids = {e.id for e in new}
    for pack in _packs([*new, *moved], segment_rows):
        tables = [t for _e, t in _fresh_rows(store, [e for e in pack if e.id in new_ids], fresh)]
        tables += [t for _pid, t in itertools.islice(copied, len(pack) - len(tables))]
        ref = _write_segment(store, [e.id for e in pack], tables)
        live[ref.sha256] = ref
        segment_of.update((e.id, ref.sha256) for e in pack)
    out = [replace(e, segment=segment_of.get(e.id)) for e in entries]
    table = encode_partitions([e.to_json() for e in out])
    parts = write_object(store, partitions_key, table, len(out))
    return CatalogRef(parts, tuple(sorted(live.values(), key=lambda r: r.sha256))), out


def _packs(entries: Sequence[PartitionEntry], segment_rows: int) -> list[list[PartitionEntry]]:
    """``entries``, in order, gathered into segments of at most ``segment_rows`` rows (whole
    partitions; a larger partition alone)."""
    packs: list[list[PartitionEntry]] = []
    rows = 0
    for entry in entries:
        if packs and rows + entry.samples <= segment_rows:
            packs[-1].append(entry)
            rows += entry.samples
        else:
            packs.append([entry])
            rows = entry.samples
    return packs


def _write_segment(store: Store, pids: list[str], tables: list[pa.Table]) -> ObjectRef:
    """One segment of the rows ``tables`` (those of ``pids``, in that order)."""
    rows = _ordered(tables, None) if len(tables) != 1 else tables[0]
    ordered = pids == sorted(pids)  # pieces already in partition order: no sort
    return write_object(store, segment_key, encode_segment(rows, ordered=ordered), rows.num_rows)


def _fresh_rows(
    store: Store, entries: Sequence[PartitionEntry], fresh: Mapping[str, pa.Table]
) -> Iterator[tuple[PartitionEntry, pa.Table]]:
    """Each entry's rows, in order: from ``fresh`` or its manifest (the unread ones read
    concurrently; a caller passes a segment's worth)."""
    unread = [e for e in entries if e.id not in fresh]
    read = dict(
        zip((e.id for e in unread), _manifest_tables(store, unread, "publish"), strict=True)
    )
    for entry in entries:
        table = fresh[entry.id] if entry.id in fresh else read.pop(entry.id)
        yield entry, table.replace_schema_metadata(None)


def _base_rows(
    base: Catalog, entries: Sequence[PartitionEntry], base_segment: Mapping[str, str]
) -> Iterator[tuple[str, pa.Table]]:
    """The base catalog's rows of ``entries`` (grouped by ``base_segment``, the base segment
    holding each), read one base segment at a time."""
    for _digest, group in itertools.groupby(entries, key=lambda e: base_segment.get(e.id, "")):
        pids = [e.id for e in group]
        table = base.rows(None, pids)
        parts = rows_by_partition(table)
        for pid in pids:
            yield pid, parts.get(pid, table.slice(0, 0))


@dataclass(frozen=True)
class CatalogInfo:
    """Where a version's catalog lives: ``"in record"`` (format 2) or ``"attached"``."""

    tag: str
    hash: str
    catalog: str
    segments: int
    rows: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def attach_catalogs(store: Store, versions: Sequence[StoredVersion]) -> list[CatalogInfo]:
    """:func:`attach_catalog` for each version; what each one's catalog now is."""
    out = []
    for version in versions:
        native = version.header.catalog is not None
        ref = attach_catalog(store, version)
        rows = sum(s.rows for s in ref.segments)
        where = "in record" if native else "attached"
        out.append(CatalogInfo(version.tag, version.hash, where, len(ref.segments), rows))
    return out


def attach_catalog(store: Store, version: StoredVersion) -> CatalogRef:
    """Write a catalog for a format-1 ``version`` (``shardlake catalog``); later readers of the
    version find it instead of reading every manifest. Idempotent."""
    if version.header.catalog is not None:
        return version.header.catalog
    existing = _attached(store, version)
    if existing is not None:
        return existing
    ref, _entries = publish_catalog(store, version.entries, None, {})
    doc = {
        "format": "shardlake.attached-catalog/1",
        "version": version.hash,
        "catalog": ref.to_json(),
    }
    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    with contextlib.suppress(AlreadyExistsError):  # a concurrent attach: equivalent content
        store.create(attached_catalog_key(version.tag, version.hash), data)
    return ref


def rows_by_partition(table: pa.Table) -> dict[str, pa.Table]:
    """Zero-copy slices of catalog rows (ordered by partition, as readers return them) per
    partition id."""
    if table.num_rows == 0:
        return {}
    codes = table.column("partition").combine_chunks().dictionary_encode()
    index = codes.indices.to_numpy(zero_copy_only=False)
    names = codes.dictionary.to_pylist()
    starts = [0, *(int(i) + 1 for i in np.flatnonzero(index[1:] != index[:-1]))]
    ends = [*starts[1:], table.num_rows]
    return {names[index[s]]: table.slice(s, e - s) for s, e in zip(starts, ends, strict=True)}


def catalog_mismatch(catalog_part: pa.Table | None, manifest: pa.Table) -> str | None:
    """Why a partition's catalog rows are not its manifest's (core columns), or ``None``."""
    if catalog_part is None:
        return "the version's catalog holds no rows of this partition"
    cols = [c for c in CORE_SCHEMA.names if c in manifest.column_names]
    got = catalog_part.select(cols).cast(manifest.select(cols).schema)
    if got.num_rows != manifest.num_rows or not got.equals(manifest.select(cols)):
        return f"the version's catalog rows ({got.num_rows}) differ from the manifest's"
    return None
