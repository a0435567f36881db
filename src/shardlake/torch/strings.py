"""A column of strings held as two NumPy arrays (UTF-8 bytes and offsets), not Python objects.

A million sample keys as a Python list cost ~80 bytes each and, in forked DataLoader workers,
every access touches a reference count and copies the page it lives on; as two flat arrays they
cost their UTF-8 bytes plus 8 and stay shared. Items are decoded on access.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..progress.bar import plural

__all__ = [
    "LazyStrings",
    "StringColumn",
    "key_digest",
]

U8Array = np.ndarray[Any, np.dtype[np.uint8]]
IntArray = np.ndarray[Any, np.dtype[np.integer[Any]]]


def _compact(offsets: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """int32 offsets while the data stays under 2 GiB (4 bytes a string instead of 8)."""
    last = int(offsets[-1]) if len(offsets) else 0
    return offsets.astype(np.int32 if last < 2**31 else np.int64)


class StringColumn(Sequence[str]):
    """An immutable sequence of ``str`` backed by ``data`` (UTF-8) and ``offsets`` (n + 1;
    int32 or int64)."""

    def __init__(self, data: U8Array, offsets: np.ndarray[Any, Any]) -> None:
        self.data = data
        self.offsets = offsets

    @classmethod
    def from_arrow(cls, values: pa.Array | pa.ChunkedArray) -> StringColumn:
        """From an Arrow string column (nulls are not allowed in a key column)."""
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks() if values.num_chunks else pa.array([], pa.string())
        # A plain string array is read in place (int32 offsets); no cast copies the keys first.
        small = values.type == pa.string()
        array = values if small else values.cast(pa.large_string())
        if array.null_count:
            raise ValueError("a string column for the loader must not hold nulls")
        if len(array) == 0:
            return cls(np.zeros(0, dtype=np.uint8), np.zeros(1, dtype=np.int32))
        views, offsets = _string_buffers(array)
        offsets = offsets.astype(np.int64)
        first, last = int(offsets[0]), int(offsets[-1])
        data = views[first:last].copy() if last > first else np.zeros(0, dtype=np.uint8)
        return cls(data, _compact(offsets - first))

    @classmethod
    def concat(cls, columns: Sequence[StringColumn]) -> StringColumn:
        if len(columns) == 1:
            return columns[0]
        data = np.concatenate([c.data for c in columns]) if columns else np.zeros(0, np.uint8)
        parts, base = [np.zeros(1, dtype=np.int64)], 0
        for c in columns:
            parts.append(c.offsets[1:].astype(np.int64) + base)
            base += int(c.offsets[-1])
        return cls(data, _compact(np.concatenate(parts)))

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        i = int(index) + n if int(index) < 0 else int(index)
        if not 0 <= i < n:
            raise IndexError(f"row {index} is outside a column of {n}")
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        return bytes(self.data[start:end]).decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        for i in range(len(self)):
            yield self[i]

    def nbytes(self) -> int:
        return int(self.data.nbytes + self.offsets.nbytes)


class LazyStrings(Sequence[str]):
    """A string column of ``count`` items that ``load`` reads (again) on first use.

    The loader drops its sample keys after the set-up unless batches carry them (at 1M samples
    they are ~30 B a sample, a third of a rank's memory), and reads them back from the catalog
    only for :meth:`~shardlake.torch.ShardDataset.keys_of` or an error message naming a key."""

    def __init__(self, count: int, load: Callable[[], StringColumn]) -> None:
        self._count = count
        self._load = load
        self._column: StringColumn | None = None
        self._lock = threading.Lock()

    def column(self) -> StringColumn:
        with self._lock:
            if self._column is None:
                column = self._load()
                if len(column) != self._count:
                    raise ValueError(
                        f"sample keys read again: {plural(len(column), 'key')}, the table has {self._count}"
                    )
                self._column = column
            return self._column

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        return self.column()[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self.column())

    def __getstate__(self) -> dict[str, Any]:
        return {"count": self._count, "load": self._load, "column": self._column}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["count"], state["load"])  # type: ignore[misc]
        self._column = state["column"]


DIGEST_BLOCK = 1 << 16  # keys hashed per block: bounds the digest's scratch memory


def key_digest(keys: pa.Array | pa.ChunkedArray, breaks: IntArray | None = None) -> str:
    """:func:`shardlake.torch.plan_types.selection_digest` of an Arrow key column, computed in bulk:
    sha256 over the keys in sorted order, each as 8-byte little-endian length then UTF-8.

    Catalog rows come as sorted runs (one per partition, whose keys share its path), so the
    sorted order is usually those runs ordered by their first key: checked by one vectorised
    comparison of neighbours, then the runs are hashed in that order where they lie, chunk by
    chunk (no combined or sorted copy of the keys); a full string sort only when the runs
    overlap. ``breaks`` (e.g. each partition's first row) are where a run may begin although
    the keys ascend across it: two partitions in a row whose keys happen to ascend are then two
    runs, not one overlapping the others. They only cut runs, so any ``breaks`` give the same
    digest.
    """
    chunks = _key_chunks(keys)
    segments = _sorted_segments(chunks, breaks)
    if segments is None:
        whole = pa.chunked_array(chunks, chunks[0].type).combine_chunks()
        chunks = [pc.take(whole, pc.sort_indices(whole))]
        segments = [(0, len(whole))]
    h = hashlib.sha256()
    block = _FramedBlock(h)
    bounds = np.cumsum([0, *(len(c) for c in chunks)])
    buffers = [_string_buffers(c) for c in chunks]
    for start, end in segments:  # a partition's run is a few hundred keys: gathered in blocks
        first = int(np.searchsorted(bounds, start, side="right")) - 1
        for i in range(first, len(chunks)):
            lo, hi = max(start, int(bounds[i])), min(end, int(bounds[i + 1]))
            if lo >= hi:
                break
            data, offsets = buffers[i]
            base = int(bounds[i])
            for begin in range(lo, hi, DIGEST_BLOCK):
                stop = min(begin + DIGEST_BLOCK, hi)
                block.add(data, offsets[begin - base : stop - base + 1].astype(np.int64))
    block.flush()
    return h.hexdigest()[:32]


def _key_chunks(keys: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    """The non-empty chunks of a key column, as plain (large) strings, refused with nulls."""
    column = keys if isinstance(keys, pa.ChunkedArray) else pa.chunked_array([keys])
    if column.type not in (pa.string(), pa.large_string()):  # views, dictionaries: plain bytes
        column = column.cast(pa.large_string())
    if column.null_count:
        raise ValueError("a key column for the digest must not hold nulls")
    chunks = [c for c in column.chunks if len(c)]
    return chunks or [pa.array([], column.type)]


def _sorted_segments(
    chunks: list[pa.Array], breaks: IntArray | None
) -> list[tuple[int, int]] | None:
    """Row ranges of the keys (``chunks`` of one column) whose concatenation is the keys in
    sorted order (the same bytes as ``take(sort_indices)``, equal keys being equal), or None
    when a full sort is needed.

    One vectorised comparison of neighbours (in each chunk, and across the chunks' joins)
    finds the ascending runs; when there are few, they are ordered by their first key and the
    order checked at the runs' joins only (each run is ascending by construction), so the keys
    are compared once, not sorted.
    """
    n = sum(len(c) for c in chunks)
    if n < 2:
        return [(0, n)]
    found: list[np.ndarray[Any, Any]] = []
    at = 0
    for i, chunk in enumerate(chunks):
        m = len(chunk)
        if i and chunks[i - 1][-1].as_py() > chunk[0].as_py():
            found.append(np.array([at], dtype=np.int64))
        if m > 1:
            descents = pc.greater(chunk.slice(0, m - 1), chunk.slice(1))
            found.append(np.flatnonzero(descents.to_numpy(zero_copy_only=False)) + 1 + at)
        at += m
    cuts = np.concatenate(found).astype(np.int64) if found else np.zeros(0, np.int64)
    if breaks is not None and len(breaks):
        inside = breaks[(breaks > 0) & (breaks < n)].astype(np.int64)
        cuts = np.union1d(cuts, inside)
    if len(cuts) == 0:
        return [(0, n)]
    if (len(cuts) + 1) * 4 >= n:  # many short runs: a sort is as cheap
        return None
    starts = np.concatenate([[0], cuts]).astype(np.int64)
    ends = np.append(cuts, n).astype(np.int64)
    firsts = _take_rows(chunks, starts)
    run_order = pc.sort_indices(firsts).to_numpy()
    lasts = _take_rows(chunks, ends - 1)
    joins_ok = pc.all(
        pc.less_equal(
            pc.take(lasts, pa.array(run_order[:-1])), pc.take(firsts, pa.array(run_order[1:]))
        )
    ).as_py()
    if not joins_ok:
        return None
    segments: list[tuple[int, int]] = []
    for run in run_order.tolist():
        start, end = int(starts[run]), int(ends[run])
        if segments and segments[-1][1] == start:  # the next run lies right behind: one range
            segments[-1] = (segments[-1][0], end)
        else:
            segments.append((start, end))
    return segments


def _take_rows(chunks: list[pa.Array], rows: np.ndarray[Any, Any]) -> pa.Array:
    """The keys at ascending ``rows`` of the column ``chunks`` make up, taken chunk by chunk
    (a take from a chunked column would first copy all of it into one array)."""
    bounds = np.cumsum([0, *(len(c) for c in chunks)])
    cut = np.searchsorted(rows, bounds)
    parts = [
        pc.take(chunk, pa.array(rows[cut[i] : cut[i + 1]] - bounds[i]))
        for i, chunk in enumerate(chunks)
        if cut[i + 1] > cut[i]
    ]
    return pa.concat_arrays(parts) if parts else pa.array([], chunks[0].type)


def _string_buffers(keys: pa.Array) -> tuple[U8Array, np.ndarray[Any, Any]]:
    """The UTF-8 bytes and the ``n + 1`` offsets of a string column, as views (no copy)."""
    n = len(keys)
    _validity, offsets_buf, data_buf = keys.buffers()
    width = np.int64 if keys.type == pa.large_string() else np.int32
    if offsets_buf is None or n == 0:
        return np.zeros(0, dtype=np.uint8), np.zeros(1, dtype=width)
    offsets = np.frombuffer(offsets_buf, dtype=width)[keys.offset : keys.offset + n + 1]
    data = (
        np.frombuffer(data_buf, dtype=np.uint8)
        if data_buf is not None
        else np.zeros(0, dtype=np.uint8)
    )
    return data, offsets


class _FramedBlock:
    """Keys framed as the digest frames them (each its 8-byte little-endian length, then its
    UTF-8 bytes), gathered into blocks of about DIGEST_BLOCK keys and hashed block by block."""

    def __init__(self, h: Any) -> None:
        self.h = h
        self.pieces: list[tuple[U8Array, np.ndarray[Any, Any]]] = []  # (data, int64 bounds)
        self.keys = 0

    def add(self, data: U8Array, bounds: np.ndarray[Any, Any]) -> None:
        """The keys whose bytes are ``data[bounds[i]:bounds[i + 1]]``."""
        self.pieces.append((data, bounds))
        self.keys += len(bounds) - 1
        if self.keys >= DIGEST_BLOCK:
            self.flush()

    def flush(self) -> None:
        if not self.pieces:
            return
        size = sum(int(b[-1] - b[0]) + 8 * (len(b) - 1) for _d, b in self.pieces)
        out = np.empty(size, dtype=np.uint8)
        at = 0
        for data, bounds in self.pieces:
            at = _frame_into(out, at, data, bounds)
        self.h.update(out)
        self.pieces, self.keys = [], 0


def _frame_into(out: U8Array, at: int, data: U8Array, bounds: np.ndarray[Any, Any]) -> int:
    """Frame the keys ``data[bounds[i]:bounds[i + 1]]`` into ``out`` from ``at``; the end.
    Keys come in runs of one length (a partition's keys share its path and a counter's
    width): each run is written as a 2-D block, a length column beside the keys' bytes."""
    lengths = np.diff(bounds)
    n = len(lengths)
    chunk = data[int(bounds[0]) : int(bounds[-1])]
    end = at + len(chunk) + 8 * n
    changes = np.flatnonzero(lengths[1:] != lengths[:-1]) + 1
    if len(changes) * 16 > n:  # lengths vary key to key: placed one byte position at a time
        starts = np.arange(n, dtype=np.int64) * 8 + (np.cumsum(lengths) - lengths)
        region = out[at:end]
        is_data = np.ones(region.shape[0], dtype=bool)
        slots = (starts[:, None] + np.arange(8)).ravel()
        is_data[slots] = False
        region[slots] = lengths.astype("<i8").view(np.uint8)
        region[is_data] = chunk
        return end
    edges = np.concatenate([[0], changes, [n]]).tolist()
    rel = bounds - bounds[0]
    for a, b in zip(edges[:-1], edges[1:], strict=False):
        width = int(lengths[a])
        lo = at + int(rel[a]) + 8 * a
        rows = out[lo : lo + (b - a) * (8 + width)].reshape(b - a, 8 + width)
        rows[:, :8] = np.array([width], dtype="<i8").view(np.uint8)
        rows[:, 8:] = chunk[int(rel[a]) : int(rel[b])].reshape(b - a, width)
    return end
