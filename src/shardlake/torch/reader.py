"""Per-slot streaming of sample payloads through a Store: ranged reads, read-ahead, verification.

A slot's plan is a list of *chunks* (rows of one shard, ascending offsets) and, per emitted
sample, which chunk holds it. A chunk is fetched with one ``read_ranges`` call whose ranges are
the chunk's members coalesced: members separated by less than ``skim_gap`` bytes are read as one
span (dense selections skim over the small gaps), wider gaps are seeks (sparse selections fetch
only their members). Up to ``max_inflight`` chunks are fetched by a thread pool while the caller
decodes; read-ahead stops when ``max_buffer_bytes`` of payloads are held, so memory per worker is
bounded by the settings, not by the dataset.

Every payload is checked against the manifest's CRC-32 as it arrives (the zstd frame checksum is
checked when it is decoded, see :meth:`SlotReader.refetch`). A mismatch or a transient store
error is retried with bounded, jittered backoff; after the last attempt an ``IntegrityError`` (or
the store error) names the store URL, shard, key and offset.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import IntegrityError, RetriesExhaustedError
from ..format.codec import payload_checksum
from ..store import Store
from ..store.retry import is_transient


@dataclass(frozen=True)
class ReadOptions:
    """I/O knobs of a slot reader."""

    # Members closer than this are read as one span (dense selections skim over tar headers and
    # small gaps); wider gaps are seeks, so sparse selections fetch little beyond their members.
    skim_gap: int = 8 * 1024
    max_inflight: int = 8  # chunk fetches in flight per worker
    max_buffer_bytes: int = 256 * 1024 * 1024  # payload bytes held ahead of decoding
    io_threads: int = 8
    attempts: int = 4  # tries per fetch (integrity mismatches and transient errors)
    base_delay: float = 0.05
    max_delay: float = 2.0

    def backoff(self, attempt: int) -> float:
        return random.uniform(0.0, min(self.max_delay, self.base_delay * 2 ** (attempt - 1)))


@dataclass(frozen=True)
class RowTable:
    """The columns a reader needs, as plain arrays (cheap to pickle into workers)."""

    shard: np.ndarray[Any, Any]  # int64 index into shard_keys
    offset: np.ndarray[Any, Any]
    size: np.ndarray[Any, Any]
    raw_size: np.ndarray[Any, Any]
    crc32: np.ndarray[Any, Any]
    keys: Sequence[str]
    shard_keys: Sequence[str]

    def __len__(self) -> int:
        return len(self.keys)


def coalesce(
    offsets: Sequence[int], sizes: Sequence[int], gap: int
) -> list[tuple[int, int, list[int]]]:
    """Group members (ascending offsets) into spans ``(start, end, member indices)``.

    Members whose distance to the previous span's end is at most ``gap`` join that span.
    """
    spans: list[tuple[int, int, list[int]]] = []
    for i, (off, size) in enumerate(zip(offsets, sizes, strict=False)):
        if spans and off - spans[-1][1] <= gap and off >= spans[-1][0]:
            start, end, members = spans[-1]
            spans[-1] = (start, max(end, off + size), members + [i])
        else:
            spans.append((off, off + size, [i]))
    return spans


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, (IntegrityError, RetriesExhaustedError)) or is_transient(exc)


class SlotReader:
    """Fetches the payloads of one slot's samples in emit order (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        table: RowTable,
        chunks: Sequence[np.ndarray[Any, Any]],
        emit_rows: np.ndarray[Any, Any],
        emit_chunk: np.ndarray[Any, Any],
        options: ReadOptions | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store = store
        self.table = table
        self.options = options or ReadOptions()
        self._sleep = sleep
        self.emit_rows = np.asarray(emit_rows, dtype=np.int64)
        self.emit_chunk = np.asarray(emit_chunk, dtype=np.int64)
        # Only the rows still to be emitted are fetched (after a resume, a chunk may be partial).
        needed: dict[int, set[int]] = {}
        for row, chunk in zip(self.emit_rows.tolist(), self.emit_chunk.tolist(), strict=False):
            needed.setdefault(chunk, set()).add(row)
        order = sorted(needed)
        self._unit_of_chunk = {c: i for i, c in enumerate(order)}
        self._units: list[list[int]] = [
            [r for r in chunks[c].tolist() if r in needed[c]] for c in order
        ]
        self._remaining = [0] * len(self._units)
        for chunk in self.emit_chunk.tolist():
            self._remaining[self._unit_of_chunk[chunk]] += 1
        self._unit_bytes = [int(table.size[u].sum()) if u else 0 for u in self._units]
        self.bytes_fetched = 0
        self.requests = 0

    # --- fetching ------------------------------------------------------------------------------

    def where(self, row: int) -> str:
        t = self.table
        return (
            f"{self.store.key_url(t.shard_keys[int(t.shard[row])])} key {t.keys[row]!r} "
            f"offset {int(t.offset[row])}"
        )

    def _read_ranges(self, ranges: list[tuple[str, int, int]]) -> list[bytes]:
        attempt = 0
        while True:
            attempt += 1
            try:
                self.requests += len(ranges)
                out = self.store.read_ranges(ranges)
                self.bytes_fetched += sum(len(b) for b in out)
                return out
            except Exception as exc:  # noqa: BLE001 - classified by _retryable
                if attempt >= self.options.attempts or not _retryable(exc):
                    raise
                self._sleep(self.options.backoff(attempt))

    def _fetch_rows(self, rows: list[int]) -> dict[int, bytes]:
        """Payloads of ``rows`` (one shard, ascending offsets), each checked against its CRC."""
        t = self.table
        shard_key = t.shard_keys[int(t.shard[rows[0]])]
        offsets = [int(t.offset[r]) for r in rows]
        sizes = [int(t.size[r]) for r in rows]
        spans = coalesce(offsets, sizes, self.options.skim_gap)
        data = self._read_ranges([(shard_key, s, e) for s, e, _ in spans])
        out: dict[int, bytes] = {}
        bad: list[int] = []
        for (start, _end, members), blob in zip(spans, data, strict=False):
            view = memoryview(blob)
            for i in members:
                rel = offsets[i] - start
                payload = bytes(view[rel : rel + sizes[i]])
                row = rows[i]
                out[row] = payload
                if len(payload) != sizes[i] or payload_checksum(payload) != int(t.crc32[row]):
                    bad.append(row)
        for row in bad:
            out[row] = self.refetch(row)
        return out

    def refetch(self, row: int) -> bytes:
        """Re-read one payload until it matches its CRC (bounded); else ``IntegrityError``.

        Called after a CRC mismatch and after a zstd frame checksum failure at decode time.
        """
        t = self.table
        shard_key = t.shard_keys[int(t.shard[row])]
        start, size, crc = int(t.offset[row]), int(t.size[row]), int(t.crc32[row])
        last = ""
        for attempt in range(1, self.options.attempts):
            self._sleep(self.options.backoff(attempt))
            (payload,) = self._read_ranges([(shard_key, start, start + size)])
            actual = payload_checksum(payload)
            if len(payload) == size and actual == crc:
                return payload
            last = f"payload checksum mismatch (crc32 {actual:08x}, manifest says {crc:08x})"
        raise IntegrityError(f"{self.where(row)}: {last} after {self.options.attempts} reads")

    # --- emitting ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        """``(row, payload)`` in emit order."""
        opts = self.options
        pool = ThreadPoolExecutor(max_workers=max(1, min(opts.io_threads, opts.max_inflight)))
        futures: dict[int, Future[dict[int, bytes]]] = {}
        held: dict[int, dict[int, bytes]] = {}
        held_bytes = 0
        next_unit = 0

        def submit_more(need: int) -> None:
            nonlocal next_unit, held_bytes
            while next_unit < len(self._units) and (
                next_unit <= need
                or (len(futures) < opts.max_inflight and held_bytes < opts.max_buffer_bytes)
            ):
                futures[next_unit] = pool.submit(self._fetch_rows, self._units[next_unit])
                held_bytes += self._unit_bytes[next_unit]
                next_unit += 1

        try:
            for row, chunk in zip(self.emit_rows.tolist(), self.emit_chunk.tolist(), strict=False):
                unit = self._unit_of_chunk[chunk]
                submit_more(unit)
                if unit not in held:
                    held[unit] = futures.pop(unit).result()
                payload = held[unit][row]
                self._remaining[unit] -= 1
                if self._remaining[unit] == 0:
                    del held[unit]
                    held_bytes -= self._unit_bytes[unit]
                submit_more(unit)
                yield row, payload
        finally:
            for fut in futures.values():
                fut.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
