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
    comparison of neighbours, then the runs are hashed in that order where they lie (no sorted
    copy of the keys); a full string sort only when the runs overlap. ``breaks`` (e.g. each
    partition's first row) are where a run may begin although the keys ascend across it: two
    partitions in a row whose keys happen to ascend are then two runs, not one overlapping the
    others. They only cut runs, so any ``breaks`` give the same digest.
    """
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks else pa.array([], pa.string())
    if keys.type not in (pa.string(), pa.large_string()):  # views, dictionaries: plain bytes
        keys = keys.cast(pa.large_string())
    if keys.null_count:
        raise ValueError("a key column for the digest must not hold nulls")
    segments = _sorted_segments(keys, breaks)
    if segments is None:
        keys = pc.take(keys, pc.sort_indices(keys))
        segments = [(0, len(keys))]
    data, offsets = _string_buffers(keys)
    h = hashlib.sha256()
    pieces: list[U8Array] = []
    lengths: list[np.ndarray[Any, Any]] = []
    pending = 0
    for start, end in segments:  # gathered into blocks: a partition's run is a few hundred keys
        for begin in range(start, end, DIGEST_BLOCK):
            bounds = offsets[begin : min(begin + DIGEST_BLOCK, end) + 1].astype(np.int64)
            pieces.append(data[int(bounds[0]) : int(bounds[-1])])
            lengths.append(np.diff(bounds))
            pending += len(bounds) - 1
            if pending >= DIGEST_BLOCK:
                h.update(_framed(np.concatenate(pieces), np.concatenate(lengths)))
                pieces, lengths, pending = [], [], 0
    if pending:
        h.update(_framed(np.concatenate(pieces), np.concatenate(lengths)))
    return h.hexdigest()[:32]


def _sorted_segments(keys: pa.Array, breaks: IntArray | None) -> list[tuple[int, int]] | None:
    """Row ranges of ``keys`` whose concatenation is the keys in sorted order (the same bytes
    as ``take(sort_indices)``, equal keys being equal), or None when a full sort is needed.

    One vectorised comparison of neighbours finds the ascending runs; when there are few, they
    are ordered by their first key and the order checked at the runs' joins only (each run is
    ascending by construction), so the keys are compared once, not sorted.
    """
    n = len(keys)
    if n < 2:
        return [(0, n)]
    descents = pc.greater(keys.slice(0, n - 1), keys.slice(1))
    cuts = np.flatnonzero(descents.to_numpy(zero_copy_only=False)) + 1
    if breaks is not None and len(breaks):
        inside = breaks[(breaks > 0) & (breaks < n)].astype(np.int64)
        cuts = np.union1d(cuts, inside)
    if len(cuts) == 0:
        return [(0, n)]
    if (len(cuts) + 1) * 4 >= n:  # many short runs: a sort is as cheap
        return None
    starts = np.concatenate([[0], cuts]).astype(np.int64)
    ends = np.append(cuts, n).astype(np.int64)
    firsts = pc.take(keys, pa.array(starts))
    run_order = pc.sort_indices(firsts).to_numpy()
    lasts = pc.take(keys, pa.array(ends - 1))
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


def _framed(chunk: U8Array, lengths: np.ndarray[Any, Any]) -> bytes:
    """Keys (``chunk``: their UTF-8 bytes back to back) as the digest frames them: each its
    8-byte little-endian length, then its bytes."""
    n = len(lengths)
    starts = np.arange(n, dtype=np.int64) * 8 + (np.cumsum(lengths) - lengths)
    out = np.empty(len(chunk) + 8 * n, dtype=np.uint8)
    is_data = np.ones(out.shape[0], dtype=bool)
    slots = (starts[:, None] + np.arange(8)).ravel()
    is_data[slots] = False
    out[slots] = lengths.astype("<i8").view(np.uint8)
    out[is_data] = chunk
    return out.tobytes()
