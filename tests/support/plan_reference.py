"""Verbatim copy of plan shapes 2-3's slot order as it was before issue #47's faster form
(``shardlake.torch.plan_steps._slot_order``, ``_stable_argsort``, ``_lane_starts``): the oracle
the new form is compared with, array by array (tests/torch/test_slot_order_equiv.py)."""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from shardlake.torch.plan_types import SHUFFLE_RAMP, IntArray, PlanParams


def slot_order(
    segment: list[IntArray], params: PlanParams, rng: np.random.Generator | None
) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    """(emit order, read order, read position and chunk of each emitted sample) for one slot."""
    if not segment:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty
    ids = np.concatenate(segment)
    lengths = np.fromiter((len(c) for c in segment), dtype=np.int64, count=len(segment))
    chunk_no = np.repeat(np.arange(len(segment)), lengths)
    if rng is None:  # no shuffle: read order is emit order
        return ids, ids, np.arange(len(ids)), chunk_no
    in_chunk = np.arange(len(ids)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    if params.shape >= 2:
        # Lanes: `interleave` runs are open at once and their samples alternate; when a run
        # ends, the next chunk opens in its lane (the least-filled one), so runs start and end
        # one at a time (a steady refill) instead of `interleave` together.
        lane_start = lane_starts(lengths, params.interleave, staggered=True)
        tick = np.repeat(lane_start, lengths) + in_chunk
        read_order = np.lexsort((chunk_no, tick))
    else:
        # Shape 1: chunks are taken `interleave` at a time and their samples alternate.
        group = chunk_no // params.interleave
        read_order = np.lexsort((chunk_no, in_chunk, group))
    read = ids[read_order]
    # Bounded shuffle: emit by (read position + uniform jitter); a sample moves < buffer places,
    # so the reader never holds more than `shuffle_buffer` samples it read but has not emitted.
    reach: float | IntArray = params.shuffle_buffer
    if params.shape >= 2:
        # The reach widens from SHUFFLE_RAMP over the slot's first samples: the first batches
        # come from the first lanes' runs (see the module docstring).
        reach = np.minimum(params.shuffle_buffer, SHUFFLE_RAMP + np.arange(len(read)))
    key = np.arange(len(read)) + rng.random(len(read)) * reach
    emit_pos = stable_argsort(key)
    return read[emit_pos], read, emit_pos, chunk_no[read_order][emit_pos]


def stable_argsort(key: np.ndarray[Any, Any]) -> IntArray:
    """``np.argsort(key, kind="stable")``, by the faster unstable sort where no two keys are
    equal (then every sort gives the one order): 0.1 s less per slot at 2.5M samples."""
    order = np.argsort(key)
    ranked = key[order]
    if len(ranked) > 1 and bool(np.any(ranked[1:] == ranked[:-1])):
        order = np.argsort(key, kind="stable")
    return order.astype(np.int64, copy=False)


def lane_starts(lengths: IntArray, lanes: int, *, staggered: bool = False) -> IntArray:
    """Where each chunk starts (in samples of its lane) when chunks, in order, are put into
    ``lanes`` lanes, each chunk into the lane that ends first (ties: the lowest lane). Starts
    never decrease with the chunk number, so chunks are first read in chunk order.

    ``staggered``: the first ``k`` lanes open one after another, lane ``j`` at ``j * L / k``
    (``L`` the mean length of the first ``k`` chunks), so runs end, and the next open, one at
    a time from the slot's start instead of all together after the first run."""
    k = min(lanes, len(lengths))
    step = float(lengths[:k].mean()) / k if staggered and k else 0.0
    heap = [(round(lane * step), lane) for lane in range(k)]
    out = np.zeros(len(lengths), dtype=np.int64)
    for c, length in enumerate(lengths.tolist()):
        start, lane = heap[0]
        out[c] = start
        heapq.heapreplace(heap, (start + length, lane))
    return out


def shard_groups(rows: Any) -> tuple[int, IntArray, Any]:
    """``shardlake.torch.plan_rank.shard_groups`` before its blockwise in-order check, as
    (n, starts, order)."""
    from shardlake.torch.plan_steps import _in_shard_order

    n = len(rows)
    if n == 0:
        return 0, np.zeros(0, dtype=np.int64), None
    ids = np.arange(n, dtype=np.int64)
    ordered = _in_shard_order(rows, ids)
    order = None if ordered is ids else ordered
    shard = rows.shard if order is None else rows.shard[order]
    return n, np.flatnonzero(np.r_[True, shard[1:] != shard[:-1]]), order
