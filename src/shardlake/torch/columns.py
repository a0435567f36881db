"""One source's loader columns (:class:`SourceColumns`), built from its selected manifest rows.

Built column by column and chunk by chunk from what the catalog read gives (the partition column
as dictionary codes, integer columns already narrowed per row group): vectorised, no per-row
Python objects, no combined copy of a column, and each integer column in the narrowest dtype
its values allow (at 1M samples and more the row table is most of a loader's memory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import IntegrityError

__all__ = [
    "INT32_MAX",
    "SourceColumns",
    "compact_crc",
    "compact_int",
    "index_dtype",
    "partition_breaks",
]

IntArray = np.ndarray[Any, np.dtype[np.int64]]
INT32_MAX = 2**31 - 1
SUM_BLOCK = 1 << 20  # rows summed at a time: bounds the scratch of max(offset + size)


def compact_int(values: np.ndarray[Any, Any], upper: int | None = None) -> np.ndarray[Any, Any]:
    """``values`` (non-negative) as int32 when they, and ``upper`` (a bound derived values must
    stay under, e.g. offset + size), fit; else int64. Halves the row table's resident bytes.
    Columns already int32 (mapped from the node-local cache) are not scanned: a scan would
    bring every page of a column into this process, a column the loader never reads
    (``raw_size``) included."""
    if values.dtype == np.int32 and (upper or 0) <= INT32_MAX:
        return values
    top = max(int(values.max()) if len(values) else 0, upper or 0)
    low = int(values.min()) if len(values) else 0
    dtype = np.int32 if low >= 0 and top <= INT32_MAX else np.int64
    return values.astype(dtype, copy=False)


def compact_crc(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
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


@dataclass
class SourceColumns:
    """One source's loader columns, as the row table takes them (the plan does not enter):
    per row its (partition, shard) pair's index into ``pairs``, its payload's place and check,
    and its partition's index into ``partition_names`` (sorted). Integer columns are int32
    where their values fit (CRC-32s uint32), indices the smallest signed type."""

    shard: np.ndarray[Any, Any]
    offset: np.ndarray[Any, Any]
    size: np.ndarray[Any, Any]
    raw_size: np.ndarray[Any, Any]
    crc32: np.ndarray[Any, Any]
    partition: np.ndarray[Any, Any]
    pairs: list[tuple[str, int]]
    partition_names: list[str]
    offset_end: int  # max(offset + size): what the offsets of derived reads stay under

    ARRAYS = ("shard", "offset", "size", "raw_size", "crc32", "partition")

    def __len__(self) -> int:
        return len(self.shard)

    @classmethod
    def from_table(cls, table: pa.Table) -> SourceColumns:
        """From the selected manifest rows: vectorised, narrow dtypes end to end (no int64
        copy of a column is made unless its values need it)."""
        part, names = _partition_codes(table.column("partition"))
        shard, pairs = _shard_index(part, names, _narrow(table.column("shard")))
        offset, size = _narrow(table.column("offset")), _narrow(table.column("size"))
        ends = _max_end(offset, size)
        if ends > INT32_MAX:  # derived reads' offsets must fit the offsets' dtype too
            offset = offset.astype(np.int64)
        return cls(
            shard=shard.astype(np.int32 if len(pairs) <= INT32_MAX else np.int64, copy=False),
            offset=offset,
            size=size,
            raw_size=_narrow(table.column("raw_size")),
            crc32=_narrow_crc(table.column("crc32")),
            partition=part,
            pairs=pairs,
            partition_names=names,
            offset_end=ends,
        )

    def to_cache(self) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
        doc = {
            "pairs": [[p, s] for p, s in self.pairs],
            "partition_names": self.partition_names,
            "offset_end": self.offset_end,
        }
        return doc, {name: getattr(self, name) for name in self.ARRAYS}

    @classmethod
    def from_cache(
        cls, doc: dict[str, Any], arrays: dict[str, np.ndarray[Any, Any]]
    ) -> SourceColumns:
        return cls(
            **{name: arrays[name] for name in cls.ARRAYS},
            pairs=[(str(p), int(s)) for p, s in doc["pairs"]],
            partition_names=[str(n) for n in doc["partition_names"]],
            offset_end=int(doc["offset_end"]),
        )


def _partition_codes(column: pa.ChunkedArray) -> tuple[np.ndarray[Any, Any], list[str]]:
    """Per row its partition's index into the sorted names of the partitions that have rows,
    and those names. Chunk by chunk from dictionary codes (as the catalog reads them; a plain
    string chunk is encoded first): no combined copy, no string compared a row."""
    chunks = [
        c if pa.types.is_dictionary(c.type) else pc.dictionary_encode(c)
        for c in column.chunks
        if len(c)
    ]
    if any(c.null_count for c in chunks):
        raise IntegrityError("a manifest row has no partition")
    codes = [c.indices.to_numpy() for c in chunks]
    values = [c.dictionary.to_pylist() for c in chunks]  # a few per chunk: its partitions
    used: set[Any] = set()
    for index, named in zip(codes, values, strict=True):
        # Rows of a partition come in runs: the codes at the runs' starts name them all.
        starts = np.concatenate([[0], np.flatnonzero(index[1:] != index[:-1]) + 1])
        used.update(named[i] for i in np.unique(index[starts]).tolist())
    if None in used:
        raise IntegrityError("a manifest row has no partition")
    names = sorted(used)
    position = {name: i for i, name in enumerate(names)}
    out = np.empty(len(column), dtype=index_dtype(len(names)))
    at = 0
    for index, named in zip(codes, values, strict=True):
        number = np.array([position.get(v, 0) for v in named], dtype=out.dtype)
        out[at : at + len(index)] = number[index]
        at += len(index)
    return out, names


def _max_end(offset: np.ndarray[Any, Any], size: np.ndarray[Any, Any]) -> int:
    """``max(offset + size)`` (0 for no rows), summed in int64 a block at a time."""
    ends = [
        int(np.add(offset[i : i + SUM_BLOCK], size[i : i + SUM_BLOCK], dtype=np.int64).max())
        for i in range(0, len(offset), SUM_BLOCK)
    ]
    return max(ends) if ends else 0


def _narrow(column: pa.ChunkedArray, upper: int = 0) -> np.ndarray[Any, Any]:
    """A non-negative integer column as int32 when its values (and ``upper``) fit, else
    int64, filled chunk by chunk (no int64 copy of the whole column first)."""
    bounds = pc.min_max(column).as_py() if len(column) else {"min": 0, "max": 0}
    low, top = int(bounds["min"] or 0), max(int(bounds["max"] or 0), upper)
    return _fill(column, np.int32 if low >= 0 and top <= INT32_MAX else np.int64)


def _narrow_crc(column: pa.ChunkedArray) -> np.ndarray[Any, Any]:
    """CRC-32s as uint32 (a value outside it, never a valid CRC, keeps int64 and mismatches)."""
    bounds = pc.min_max(column).as_py() if len(column) else {"min": 0, "max": 0}
    low, top = int(bounds["min"] or 0), int(bounds["max"] or 0)
    return _fill(column, np.uint32 if low >= 0 and top <= 0xFFFFFFFF else np.int64)


def _fill(column: pa.ChunkedArray, dtype: Any) -> np.ndarray[Any, Any]:
    out = np.empty(len(column), dtype=dtype)
    at = 0
    for chunk in column.chunks:
        values = chunk.to_numpy(zero_copy_only=False)
        out[at : at + len(values)] = values
        at += len(values)
    return out


def _shard_index(
    part: np.ndarray[Any, Any], names: list[str], shards: np.ndarray[Any, Any]
) -> tuple[IntArray, list[tuple[str, int]]]:
    """Per row, the index of its (partition, shard) pair, numbered by first appearance; and
    the pairs in that order (``part``: per row its partition's index into ``names``).
    Vectorised: no per-row Python objects."""
    if len(part) == 0:
        return np.zeros(0, dtype=np.int64), []
    moved = part[1:] != part[:-1]
    moved |= shards[1:] != shards[:-1]
    changes = np.flatnonzero(moved) + 1
    starts = np.concatenate([[0], changes])
    width = int(shards.max()) + 1
    if len(np.unique(part[starts].astype(np.int64) * width + shards[starts])) == len(starts):
        # Each pair in one run (catalog rows come grouped by partition, then by shard): the
        # runs are the pairs in first-appearance order, numbered without a sort of every row.
        run = np.zeros(len(part), dtype=np.int8)
        run[changes] = 1
        firsts = zip(part[starts].tolist(), shards[starts].tolist(), strict=True)
        total = np.int32 if len(part) <= INT32_MAX else np.int64
        return np.cumsum(run, dtype=total), [(names[p], s) for p, s in firsts]
    pair = part.astype(np.int64) * width + shards
    _u, first, inverse = np.unique(pair, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    order = np.sort(first)
    return rank[inverse.reshape(-1)], [(names[int(part[i])], int(shards[i])) for i in order]


def partition_breaks(column: pa.ChunkedArray) -> IntArray:
    """Rows where a partition may begin: each chunk's first row and where its codes change.
    A superset of the partitions' first rows (a chunk may begin inside one), which is all that
    :func:`~shardlake.torch.strings.key_digest` asks of its ``breaks``."""
    found: list[np.ndarray[Any, Any]] = []
    at = 0
    for chunk in column.chunks:
        if len(chunk):
            coded = chunk if pa.types.is_dictionary(chunk.type) else pc.dictionary_encode(chunk)
            codes = coded.indices.to_numpy(zero_copy_only=False)
            found += [np.array([at]), np.flatnonzero(codes[1:] != codes[:-1]) + 1 + at]
            at += len(chunk)
    return np.concatenate(found).astype(np.int64) if found else np.zeros(0, np.int64)
