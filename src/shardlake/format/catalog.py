"""The per-version catalog, encoded and decoded: a partitions table and row segments. Pure: no I/O.

A version (format 2) references by digest one *partitions table* (parquet, one row per live
partition: its revision, manifest digest, shards and the segment that holds its rows) and a short
list of *segments* (parquet, the manifest rows of the partitions one publish built, sorted by
partition so row-group statistics prune by partition). Segments are log-structured: an
incremental publish writes one new segment for the partitions it changed and reuses the base's
segments for the rest; a partition's rows are read only from the segment the partitions table
names for it (older segments may still hold rows of replaced revisions). Every object is
content-addressed (``catalog/.../<sha256>.parquet``) and checked against the digest its reference
records. See docs/format.md, "Catalog".
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import FormatError, IntegrityError
from ..progress.bar import plural

__all__ = [
    "MAX_LIVE_SEGMENTS",
    "PARALLEL_ROW_GROUPS",
    "SEGMENT_MAX_ROWS",
    "SEGMENT_ROW_GROUP",
    "CatalogRef",
    "ObjectRef",
    "attached_catalog_key",
    "coalesce",
    "column_ranges",
    "decode_partitions",
    "decode_segment",
    "encode_partitions",
    "encode_segment",
    "partitions_key",
    "row_groups_for",
    "segment_key",
    "sha256_hex",
]

CATALOG_DIR = "catalog"
# Rows per row group of a segment: small enough that one partition's query prunes most of a
# large segment, large enough that a full scan is a few column chunks.
SEGMENT_ROW_GROUP = 65_536
# A publish writes its rows as segments of at most this many rows (whole partitions; one larger
# partition is a segment of its own), so the rows it holds in memory at once stay bounded: a
# 100M-sample version is ~12 segments, each encoded and written before the next is read.
SEGMENT_MAX_ROWS = 128 * SEGMENT_ROW_GROUP
# An incremental publish merges segments when a version would reference more than this many.
MAX_LIVE_SEGMENTS = 32
# A segment of at least this many row groups is decoded on up to DECODE_THREADS threads.
PARALLEL_ROW_GROUPS = 8
DECODE_THREADS = 4

_SHARD = pa.struct([("key", pa.string()), ("size", pa.int64()), ("members", pa.int64())])
PARTITIONS_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("path", pa.string()),
        ("data_rev", pa.string()),
        ("meta_rev", pa.string()),
        ("manifest_rev", pa.string()),
        ("manifest", pa.string()),
        ("manifest_sha256", pa.string()),
        ("manifest_size", pa.int64()),
        ("samples", pa.int64()),
        ("skipped", pa.int64()),
        ("payload_bytes", pa.int64()),
        ("source_fingerprint", pa.string()),
        ("npz_fingerprint", pa.string()),
        ("shards", pa.list_(_SHARD)),
        ("segment", pa.string()),  # sha256 of the segment holding this partition's rows
    ]
)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def segment_key(sha256: str) -> str:
    return f"{CATALOG_DIR}/segments/{sha256}.parquet"


def partitions_key(sha256: str) -> str:
    return f"{CATALOG_DIR}/partitions/{sha256}.parquet"


def attached_catalog_key(tag: str, version_hash: str) -> str:
    """Where ``shardlake catalog`` stores the catalog reference of a format-1 version."""
    return f"{CATALOG_DIR}/versions/{tag}/{version_hash}.json"


@dataclass(frozen=True)
class ObjectRef:
    """A catalog object: its key, sha256 and byte size (so it is read without a size probe)."""

    key: str
    sha256: str
    size: int
    rows: int

    @classmethod
    def from_json(cls, doc: Any, where: str) -> ObjectRef:
        if not isinstance(doc, Mapping):
            raise FormatError(f"{where}: a catalog object reference must be a JSON object")
        try:
            ref = cls(str(doc["key"]), str(doc["sha256"]), int(doc["size"]), int(doc["rows"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"{where}: invalid catalog object reference ({exc})") from exc
        if ref.size < 0 or ref.rows < 0 or len(ref.sha256) != 64:
            raise FormatError(f"{where}: invalid catalog object reference {dict(doc)}")
        return ref

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "sha256": self.sha256, "size": self.size, "rows": self.rows}

    def check(self, data: bytes, where: str) -> None:
        """Refuse bytes that are not this object (a flipped byte, a truncated read)."""
        if len(data) != self.size or sha256_hex(data) != self.sha256:
            raise IntegrityError(
                f"{where}: catalog object does not match its recorded sha256 "
                f"{self.sha256[:12]}... / {plural(self.size, 'byte')} (read {plural(len(data), 'byte')})"
            )


@dataclass(frozen=True)
class CatalogRef:
    """What a version record says about its catalog: the partitions table and live segments."""

    partitions: ObjectRef
    segments: tuple[ObjectRef, ...]

    @classmethod
    def from_json(cls, doc: Any, where: str) -> CatalogRef:
        if not isinstance(doc, Mapping) or not isinstance(doc.get("segments"), list):
            raise FormatError(f"{where}: 'catalog' must be an object with a 'segments' list")
        here = f"{where} catalog"
        segments = tuple(ObjectRef.from_json(s, here) for s in doc["segments"])
        if len({s.sha256 for s in segments}) != len(segments):
            raise FormatError(f"{here}: a segment is listed twice")
        return cls(ObjectRef.from_json(doc.get("partitions"), here), segments)

    def to_json(self) -> dict[str, Any]:
        return {
            "partitions": self.partitions.to_json(),
            "segments": [s.to_json() for s in self.segments],
        }

    def segment(self, sha256: str, where: str) -> ObjectRef:
        for ref in self.segments:
            if ref.sha256 == sha256:
                return ref
        raise FormatError(f"{where}: partitions table names segment {sha256[:12]}..., not listed")


def _parquet_bytes(table: pa.Table, row_group_size: int | None = None) -> bytes:
    # Page checksums guard the pages a ranged read fetches (the digest covers whole reads).
    sink = io.BytesIO()
    pq.write_table(
        table,
        sink,
        compression="zstd",
        row_group_size=row_group_size,
        write_page_checksum=True,
    )
    return sink.getvalue()


def encode_partitions(entries: Sequence[Mapping[str, Any]]) -> bytes:
    """The partitions table of ``entries`` (each with ``segment`` set), sorted by id."""
    rows = sorted(entries, key=lambda e: str(e["id"]))
    columns = {
        name: [_partition_value(entry, name) for entry in rows] for name in PARTITIONS_SCHEMA.names
    }
    return _parquet_bytes(pa.table(columns, schema=PARTITIONS_SCHEMA))


def _partition_value(entry: Mapping[str, Any], name: str) -> Any:
    if name == "shards":
        return [{k: s[k] for k in ("key", "size", "members")} for s in entry["shards"]]
    if name in ("skipped", "payload_bytes"):
        return int(entry.get(name, 0))
    return entry.get(name)


def decode_partitions(data: bytes, where: str) -> list[dict[str, Any]]:
    """Partition entries (version-entry dicts plus ``segment``) from a partitions table."""
    try:
        table = pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)
    except (pa.ArrowInvalid, OSError) as exc:
        raise FormatError(f"{where}: partitions table is not readable parquet ({exc})") from exc
    missing = [n for n in PARTITIONS_SCHEMA.names if n not in table.column_names]
    if missing:
        raise FormatError(f"{where}: partitions table lacks column(s) {', '.join(missing)}")
    # Column by column (to_pydict), then zipped into rows: ~10x faster than to_pylist.
    names = PARTITIONS_SCHEMA.names
    columns = table.select(names).to_pydict()
    entries: list[dict[str, Any]] = [
        dict(zip(names, row, strict=True)) for row in zip(*(columns[n] for n in names), strict=True)
    ]
    for entry in entries:
        for name in ("manifest_sha256", "manifest_size", "source_fingerprint", "npz_fingerprint"):
            if entry[name] is None:
                del entry[name]
    return entries


def encode_segment(table: pa.Table, *, ordered: bool = False) -> bytes:
    """A segment: manifest rows sorted by partition (stable), in row groups of SEGMENT_ROW_GROUP.
    ``ordered``: the caller built ``table`` in that order already (no sort, no copy)."""
    table = table.replace_schema_metadata(None)
    if not ordered:
        table = table.take(pc.sort_indices(table.column("partition")))
    return _parquet_bytes(table, SEGMENT_ROW_GROUP)


def row_groups_for(meta: pq.FileMetaData, pids: Sequence[str] | None) -> list[int]:
    """Row groups of a segment that may hold rows of ``pids`` (all when ``None``)."""
    groups = list(range(meta.num_row_groups))
    if pids is None:
        return groups
    column = meta.schema.names.index("partition")
    wanted = sorted(pids)
    keep = []
    for g in groups:
        stats = meta.row_group(g).column(column).statistics
        if stats is None or not stats.has_min_max:
            keep.append(g)
            continue
        lo, hi = stats.min, stats.max
        if any(lo <= p <= hi for p in wanted):
            keep.append(g)
    return keep


def decode_segment(
    open_file: Callable[[], pq.ParquetFile],
    where: str,
    columns: Sequence[str] | None,
    pids: Sequence[str],
    every_row: bool = False,
    narrow: Sequence[str] = (),
) -> pa.Table:
    """The rows of ``pids`` in a segment, with ``columns`` (all when ``None``) present in it.

    ``open_file`` opens the segment (a reader over bytes in memory); it is called once per
    decoding thread. ``every_row``: the caller knows the segment holds only rows of ``pids``
    (their sample counts add up to its rows), so no row group is skipped and no row filtered.
    ``narrow``: integer columns given as int32 (or uint32) in each row group whose values fit,
    so a large segment's int64 columns are never all in memory at once (the values are the
    same; a row group whose values do not fit keeps int64, and the chunks then differ).
    """
    try:
        source = open_file()
        names = source.schema_arrow.names
        wanted = None if columns is None else [c for c in columns if c in names]
        read = None if wanted is None else list(dict.fromkeys([*wanted, "partition"]))
        groups = row_groups_for(source.metadata, None if every_row else pids)
        table = _read_row_groups(open_file, source, groups, read, narrow)
    except (pa.ArrowInvalid, OSError) as exc:
        raise FormatError(f"{where}: catalog segment is not readable parquet ({exc})") from exc
    if not every_row:
        mask = pc.is_in(table.column("partition"), value_set=pa.array(list(pids), pa.string()))
        table = table.filter(mask)
    return table if wanted is None else table.select(wanted)


def _read_row_groups(
    open_file: Callable[[], pq.ParquetFile],
    first: pq.ParquetFile,
    groups: list[int],
    columns: list[str] | None,
    narrow: Sequence[str] = (),
) -> pa.Table:
    """``groups`` of a segment in order, a large one split into contiguous runs decoded on
    threads of this call, each with its own reader: as fast as Arrow's CPU pool (at 5M rows
    0.25 s instead of 0.5-1.4 s on one thread), but the threads end with the call, so what
    they allocated goes back with the table (the pool's idle threads kept ~20 MB of it).
    ``narrow``: see :func:`decode_segment` (then read one row group at a time)."""

    def read(reader: pq.ParquetFile, run: list[int]) -> pa.Table:
        if not narrow:
            return reader.read_row_groups(run, columns=columns, use_threads=False)
        return _concat(
            [
                _narrowed(reader.read_row_group(g, columns=columns, use_threads=False), narrow)
                for g in run
            ],
            reader.schema_arrow,
            columns,
        )

    workers = min(DECODE_THREADS, os.cpu_count() or 1, len(groups) // (PARALLEL_ROW_GROUPS // 2))
    if len(groups) < PARALLEL_ROW_GROUPS or workers < 2:
        return read(first, groups)
    size = -(-len(groups) // workers)
    runs = [groups[i : i + size] for i in range(0, len(groups), size)]
    readers = [first, *(open_file() for _ in runs[1:])]
    with ThreadPoolExecutor(len(runs), thread_name_prefix="shardlake-segment") as pool:
        tables = list(pool.map(read, readers, runs))
    return _concat(tables, first.schema_arrow, columns)


def _concat(tables: list[pa.Table], schema: pa.Schema, columns: list[str] | None) -> pa.Table:
    """Row groups' tables as one (a column narrowed in some of them is int64 in all)."""
    if not tables:
        names = schema.names if columns is None else columns
        return pa.schema([schema.field(n) for n in names]).empty_table()
    return pa.concat_tables(tables, promote_options="permissive")


def _narrowed(table: pa.Table, names: Sequence[str]) -> pa.Table:
    """``table`` with its int64 columns among ``names`` as int32, else uint32, where every
    value fits (the values are unchanged)."""
    for name in names:
        i = table.schema.get_field_index(name)
        if i < 0 or table.schema.field(i).type != pa.int64() or table.num_rows == 0:
            continue
        column = table.column(i)
        if column.null_count:
            continue
        bounds = pc.min_max(column).as_py()
        low, top = bounds["min"], bounds["max"]
        kind = (
            pa.int32()
            if low >= -(2**31) and top < 2**31
            else pa.uint32()
            if low >= 0 and top < 2**32
            else None
        )
        if kind is not None:
            table = table.set_column(i, name, column.cast(kind))
    return table


def _leaves(kind: pa.DataType) -> int:
    """Parquet leaf columns of one Arrow field type."""
    if pa.types.is_struct(kind):
        return sum(_leaves(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind):
        return (
            sum(_leaves(f.type) for f in kind.fields)
            if pa.types.is_map(kind)
            else _leaves(kind.value_type)
        )
    return 1


def column_ranges(
    meta: pq.FileMetaData, groups: Sequence[int], columns: Sequence[str] | None
) -> list[tuple[int, int]]:
    """Byte ranges ``[start, end)`` of the column chunks of ``columns`` in row ``groups``."""
    schema = meta.schema.to_arrow_schema()
    wanted = set(schema.names if columns is None else [*columns, "partition"])
    leaves: list[int] = []  # leaf column indices of the wanted top-level fields
    first = 0
    for field in schema:
        count = _leaves(field.type)
        if field.name in wanted:
            leaves.extend(range(first, first + count))
        first += count
    out = []
    for g in groups:
        group = meta.row_group(g)
        for i in leaves:
            chunk = group.column(i)
            start = chunk.data_page_offset
            if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
                start = min(start, chunk.dictionary_page_offset)
            out.append((start, start + chunk.total_compressed_size))
    return out


def coalesce(ranges: Sequence[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    """Merge ranges closer than ``gap`` bytes (fewer, larger requests)."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if merged and start - merged[-1][1] <= gap:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
