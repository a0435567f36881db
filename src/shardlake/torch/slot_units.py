"""A slot reader's units, set up as the reader reaches them: the first batch costs the first
units' work, not the slot's.

A *unit* is a chunk of the slot with rows still to emit; units are fetched in chunk order. What
a unit needs before it is fetched - its rows (the whole chunk, or only the rows still emitted
after a resume or with repeats), its bytes and how many emits it serves - depends on every emit
of its chunk. The plan gives each chunk's *end*, one past its last emit (:func:`chunk_ends`,
computed once with the plan and kept with it in the node-local cache), so a unit is known once
the emits before its end are scanned: the scan runs a bounded step ahead of the reads, and a
slot's emits past what the reads need are never touched (at 10M samples a slot, a whole-slot
set-up was 1-2 s of every start-up and resume, and mapped the whole plan into the rank).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import PlanError

__all__ = ["SCAN_STEP", "Reach", "SlotUnits", "UnitInfo", "chunk_ends"]

SCAN_STEP = 16384  # emits scanned at least at a time (NumPy calls amortised over a block)
_FIND_STEP = 64  # chunks examined first when looking for the next unit (doubling from there)
_REACH_BLOCK = 4096
_ENDS_BLOCK = 1 << 20

UnitInfo = tuple[np.ndarray[Any, Any], int, int]  # (rows to fetch, emits served, payload bytes)


def chunk_ends(emit_chunk: np.ndarray[Any, Any], chunks: int) -> np.ndarray[Any, Any]:
    """Per chunk, one past the position of its last emit in ``emit_chunk`` (0: never emitted);
    int32 where it fits. ``O(emits)``: computed once per plan, not per reader; a block at a
    time, so its temporaries stay small."""
    n = len(emit_chunk)
    dtype = np.int32 if n < 2**31 - 1 else np.int64
    ends = np.zeros(chunks, dtype=dtype)
    for begin in range(0, n, _ENDS_BLOCK):
        block = np.asarray(emit_chunk[begin : begin + _ENDS_BLOCK]).astype(np.intp)
        np.maximum.at(ends, block, np.arange(begin + 1, begin + len(block) + 1, dtype=dtype))
    return ends


class Reach:
    """The highest chunk emitted at or before a position (the units the next ``lookahead``
    emits need); positions are asked about in non-decreasing order, a block at a time."""

    def __init__(self, emit_chunk: np.ndarray[Any, Any]) -> None:
        self._chunk = emit_chunk
        self._start = self._end = 0
        self._values: list[int] = []
        self._carry = -1

    def needed_by(self, position: int) -> int:
        """The highest chunk of the emits ``0..position`` (-1: none)."""
        position = min(position, len(self._chunk) - 1)
        if position < 0:
            return -1
        while position >= self._end:
            begin, end = self._end, min(len(self._chunk), self._end + _REACH_BLOCK)
            block = np.maximum.accumulate(self._chunk[begin:end].astype(np.int64))
            self._values = np.maximum(block, self._carry).tolist()
            self._start, self._end, self._carry = begin, end, self._values[-1]
        return self._values[position - self._start]


class SlotUnits:
    """The units of a slot's remaining emits, found in chunk order and set up one at a time.

    ``ends`` (:func:`chunk_ends` of the whole slot) and ``begin`` (the slot's emits before
    ``emit_rows[0]``, a resume) say which chunks still have emits and how far the emits must be
    scanned to know one. The per-chunk tallies are zero-filled arrays the scan writes into, so
    only the pages of the chunks reached are ever touched.
    """

    def __init__(
        self,
        chunks: Sequence[np.ndarray[Any, Any]],
        emit_rows: np.ndarray[Any, Any],
        emit_chunk: np.ndarray[Any, Any],
        sizes: np.ndarray[Any, Any],
        ends: np.ndarray[Any, Any],
        begin: int,
    ) -> None:
        if len(ends) != len(chunks):
            raise PlanError(f"a slot of {len(chunks)} chunks has {len(ends)} chunk ends")
        self._chunks = chunks
        self._rows = emit_rows
        self._chunk = emit_chunk
        self._sizes = sizes
        self._ends = ends
        self._begin = begin
        self.scanned = 0  # emits scanned so far (the work done ahead of the reads)
        n = len(chunks)
        self._count = np.zeros(n, dtype=np.int64)  # emits of each chunk scanned so far
        self._row_sum = np.zeros(n, dtype=np.int64)
        self._first = np.zeros(n, dtype=np.int64)  # len(emits) - first emit scanned (0: none)

    def next_unit(self, chunk: int) -> int | None:
        """The first chunk from ``chunk`` on with emits left (None: no more units)."""
        step, total = _FIND_STEP, len(self._ends)
        while chunk < total:
            hit = np.flatnonzero(self._ends[chunk : chunk + step] > self._begin)
            if len(hit):
                return chunk + int(hit[0])
            chunk += step
            step = min(2 * step, 1 << 20)
        return None

    def unit(self, chunk: int) -> UnitInfo:
        """Unit ``chunk``'s rows to fetch (in chunk order), emits and payload bytes: the whole
        chunk when its emits are its rows, else the chunk's rows that are still emitted."""
        end = int(self._ends[chunk]) - self._begin
        self._scan_to(end)
        count = int(self._count[chunk])
        if count == 0:
            raise PlanError(f"chunk {chunk} of a slot has an end but no emits")
        rows = np.asarray(self._chunks[chunk])
        if count != len(rows) or int(self._row_sum[chunk]) != int(rows.sum(dtype=np.int64)):
            first = len(self._chunk) - int(self._first[chunk])
            mine = self._chunk[first:end] == chunk
            rows = rows[np.isin(rows, self._rows[first:end][mine])]
        return rows, count, int(self._sizes[rows].sum(dtype=np.int64))

    def _scan_to(self, end: int) -> None:
        """Tally the emits before ``end`` (at least ``SCAN_STEP`` more, up to the slot's end)."""
        n = len(self._chunk)
        if end <= self.scanned:
            return
        end = min(n, max(end, self.scanned + SCAN_STEP))
        begin = self.scanned
        chunk = self._chunk[begin:end].astype(np.intp)
        positions = np.arange(begin, end, dtype=np.int64)
        if bool(np.any(positions >= self._ends[chunk].astype(np.int64) - self._begin)):
            raise PlanError("a slot's chunk ends do not match its emits (a stale plan?)")
        np.add.at(self._count, chunk, 1)
        np.add.at(self._row_sum, chunk, self._rows[begin:end].astype(np.int64))
        np.maximum.at(self._first, chunk, n - positions)
        self.scanned = end
