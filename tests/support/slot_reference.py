"""The slot reader as it was before its set-up went incremental: every unit of the slot set up
before the first read (a test oracle for :class:`shardlake.torch.reader.SlotReader`).

The same two-tier loop, over units numbered in chunk order and found with one ``np.unique``
of the slot's emits; a unit's rows are its whole chunk when it serves as many emits summing to
the same rows, else the chunk's rows that are emitted.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import numpy as np

import shardlake.torch.reader as reader_module
from shardlake.torch.reader import Payload, SlotReader


class WholeSlotReader(SlotReader):
    def __iter__(self) -> Iterator[tuple[int, Payload]]:
        opts = self.options
        rows_at, chunk_at = self.emit_rows, self.emit_chunk
        order, first, counts = np.unique(chunk_at, return_index=True, return_counts=True)
        unit_of = {c: u for u, c in enumerate(order.tolist())}
        unit_rows: list[list[int]] = []
        unit_bytes: list[int] = []
        for u, c in enumerate(order.tolist()):
            rows = np.asarray(self.chunks[c])
            wanted = rows_at[chunk_at == c]
            same_sum = int(wanted.sum(dtype=np.int64)) == int(rows.sum(dtype=np.int64))
            if int(counts[u]) != len(rows) or not same_sum:
                rows = rows[np.isin(rows, wanted)]
            unit_rows.append(rows.tolist())
            unit_bytes.append(int(self.table.size[rows].sum(dtype=np.int64)))
        remaining = counts.astype(np.int64)
        by_first = np.argsort(first, kind="stable")
        firsts = first[by_first].tolist()
        reach = (np.maximum.accumulate(by_first) if len(by_first) else by_first).tolist()
        seen = 0

        def needed_by(position: int) -> int:
            nonlocal seen
            while seen < len(firsts) and firsts[seen] <= position:
                seen += 1
            return int(reach[seen - 1]) if seen else -1

        pool = reader_module.ThreadPoolExecutor(max_workers=opts.max_inflight)
        futures: dict[int, Future[dict[int, Payload]]] = {}
        held: dict[int, dict[int, Payload]] = {}
        ahead_bytes = 0
        next_unit = 0

        def submit(unit: int) -> None:
            nonlocal next_unit, ahead_bytes
            futures[unit] = pool.submit(self._fetch_rows, unit_rows[unit])
            ahead_bytes += unit_bytes[unit]
            next_unit = unit + 1

        def submit_more(need: int) -> None:
            while next_unit < len(unit_rows) and next_unit <= need:
                submit(next_unit)
            if any(u <= need and not f.done() for u, f in futures.items()):
                return
            while (
                next_unit < len(unit_rows)
                and len(futures) < opts.max_inflight
                and ahead_bytes < opts.max_buffer_bytes
            ):
                submit(next_unit)

        rows_list: list[int] = rows_at.tolist()
        chunks_list: list[int] = chunk_at.tolist()
        try:
            for position, (row, chunk) in enumerate(zip(rows_list, chunks_list, strict=True)):
                unit = unit_of[chunk]
                need = max(unit, needed_by(position + self.lookahead))
                submit_more(need)
                if unit not in held:
                    held[unit] = futures.pop(unit).result()
                    ahead_bytes -= unit_bytes[unit]
                    submit_more(need)
                payload = held[unit][row]
                remaining[unit] -= 1
                if remaining[unit] == 0:
                    del held[unit]
                yield row, payload
        finally:
            for fut in futures.values():
                fut.cancel()
            pool.shutdown(wait=True, cancel_futures=True)


def reference_args(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``SlotReader`` keywords for the oracle: it sets up from the emits alone."""
    return {k: v for k, v in kwargs.items() if k not in ("ends", "begin")}
