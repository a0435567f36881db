"""The pieces every shuffled plan shape is made of: seeded draws, run cuts, a slot's lanes and
bounded shuffle, the slots' sizes and the padding warning. Pure: no torch, no I/O. Plan shapes
1 and 2 (:mod:`.plan`) and shape 3 (:mod:`.plan_rank`) put them together.
"""

from __future__ import annotations

import hashlib
import heapq
import warnings
from typing import Any

import numpy as np

from ..errors import PlanError
from ..progress.bar import plural
from .plan_types import SHUFFLE_RAMP, IntArray, Layout, PlanParams, Rows

__all__ = [
    "_balanced_cuts",
    "_check_padding",
    "_generator",
    "_in_shard_order",
    "_lane_starts",
    "_rng",
    "_seed_text",
    "_slot_order",
    "_slot_sizes",
    "_stable_argsort",
]

EMPTY: IntArray = np.zeros(0, dtype=np.int64)


def _seed_text(
    shape: str, params: PlanParams, epoch: int, layout: Layout, leg: int, purpose: str
) -> str:
    """What seeds one draw of a plan: the plan shape's tag (``"shardlake.plan/1"``, ...), the
    version, selection, seed, epoch, layout, leg and what the draw is for."""
    return "|".join(
        str(x)
        for x in (
            shape,
            params.version_hash,
            params.selection_digest,
            params.seed,
            epoch,
            layout.world_size,
            layout.slots_per_rank,
            layout.batch_size,
            leg,
            purpose,
        )
    )


def _generator(text: str) -> np.random.Generator:
    digest = hashlib.sha256(text.encode()).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "little")))


def _rng(
    params: PlanParams, epoch: int, layout: Layout, leg: int, purpose: str
) -> np.random.Generator:
    """A draw of plan shapes 1 and 2."""
    return _generator(_seed_text("shardlake.plan/1", params, epoch, layout, leg, purpose))


def _in_shard_order(rows: Rows, ids: IntArray) -> IntArray:
    """``ids`` in (shard, offset) order, as a stable ``lexsort`` orders them. Rows already in
    that order (a catalog's rows mostly are) are found so by one comparison of neighbours
    and not sorted: at 5M rows the sort was a second of a rank's start-up."""
    if len(ids) < 2:
        return ids
    shard, offset = rows.shard[ids], rows.offset[ids]
    ahead = shard[1:] > shard[:-1]
    level = shard[1:] == shard[:-1]
    if bool(np.all(ahead | (level & (offset[1:] >= offset[:-1])))):
        return ids
    return ids[np.lexsort((offset, shard))]


def _balanced_cuts(
    starts: IntArray, counts: IntArray, chunk_size: int, rng: np.random.Generator | None
) -> IntArray:
    """Where plan shape 2's runs begin (positions in the shard-ordered ids): each shard's
    ``m`` members in ``k = round(m / chunk_size)`` near-equal runs, the cut points moved by a
    random phase ``u`` (of a run) per shard every epoch; the piece shorter than half a run
    (the first when u < 1/2, else the last) joins its neighbour.

    Member ``p`` of a shard is in run ``floor(p * k / m - u) + 1`` (clamped as just said); the
    cuts are computed per run, not per member (at 5M rows the per-member form was 0.8 s of a
    rank's start-up): each run's first member from the formula, then moved onto the exact
    float boundary of the per-member form, so both cut at the same members.
    """
    m = counts.astype(np.int64)
    k = np.maximum(1, np.rint(m / chunk_size)).astype(np.int64)
    u = rng.random(len(starts)) if rng is not None else np.zeros(len(starts))

    def run_of(shard: IntArray, p: IntArray) -> IntArray:  # unclamped, as the per-member form
        return np.floor(p * k[shard] / m[shard] - u[shard]).astype(np.int64) + 1

    every = np.arange(len(starts))
    first, last = run_of(every, np.zeros(len(starts), np.int64)), run_of(every, m - 1)
    low = u < 0.5
    # The runs that begin a new (clamped) block: low shards merge run <= 1 into 1, the
    # others merge runs >= k - 1 into k - 1.
    lo = np.where(low, np.maximum(first, 1), first) + 1
    hi = np.where(low, last, np.minimum(last, k - 1))
    per = np.maximum(hi - lo + 1, 0)
    shard = np.repeat(every, per)
    run = np.repeat(lo, per) + np.arange(int(per.sum())) - np.repeat(np.cumsum(per) - per, per)
    # First member with run_of >= run: the formula, then onto the exact boundary.
    p = np.ceil((run - 1 + u[shard]) * m[shard] / k[shard]).astype(np.int64)
    p = np.clip(p, 1, m[shard] - 1)
    for _ in range(4):
        back = (p > 1) & (run_of(shard, p - 1) >= run)
        ahead = run_of(shard, p) < run
        if not (back.any() or ahead.any()):
            break
        p = p - back + (ahead & ~back)
    else:
        raise PlanError("plan shape 2: run boundaries did not settle")  # float drift > 4
    return np.unique(np.concatenate([starts, starts[shard] + p]))


def _slot_order(
    segment: list[IntArray],
    params: PlanParams,
    rng: np.random.Generator | None,
    ids: IntArray | None = None,
    *,
    reads: bool = True,
) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    """(emit order, read order, read position and chunk of each emitted sample) for one slot.
    ``ids``: the segment's chunks concatenated, where the caller has them (not built again).
    ``reads=False``: the read order and positions come back empty (a loader's plan never uses
    them: two of a slot's four int64 arrays neither built nor held)."""
    if not segment:
        return EMPTY, EMPTY, EMPTY, EMPTY
    if ids is None:
        ids = np.concatenate(segment)
    n = len(ids)
    lengths = np.fromiter((len(c) for c in segment), dtype=np.int64, count=len(segment))
    if rng is None:  # no shuffle: read order is emit order
        chunk_no = np.repeat(np.arange(len(segment)), lengths)
        return ids, ids if reads else EMPTY, np.arange(n) if reads else EMPTY, chunk_no
    # Temporaries in int32 where a slot's positions fit (they do below 2**31 samples).
    small = np.int32 if n < 2**31 - 1 else np.int64
    chunk_of = np.repeat(np.arange(len(segment), dtype=small), lengths)
    first = np.cumsum(lengths) - lengths
    if params.shape >= 2:
        # Lanes: `interleave` runs are open at once and their samples alternate; when a run
        # ends, the next chunk opens in its lane (the least-filled one), so runs start and end
        # one at a time (a steady refill) instead of `interleave` together.
        lane_start = _lane_starts(lengths, params.interleave, staggered=True)
        tick = np.repeat((lane_start - first).astype(small), lengths)
        tick += np.arange(n, dtype=small)
        # By tick, ties by chunk: as lexsort((chunk, tick)), since positions are in chunk
        # order; a stable sort of the (mostly ascending) ticks is several times faster.
        read_order = np.argsort(tick, kind="stable")
        del tick
    else:
        # Shape 1: chunks are taken `interleave` at a time and their samples alternate.
        chunk_no = chunk_of.astype(np.int64)
        in_chunk = np.arange(n) - np.repeat(first, lengths)
        read_order = np.lexsort((chunk_no, in_chunk, chunk_no // params.interleave))
        del chunk_no, in_chunk
    read_order = read_order.astype(np.int64, copy=False)
    # Bounded shuffle: emit by (read position + uniform jitter); a sample moves < buffer places,
    # so the reader never holds more than `shuffle_buffer` samples it read but has not emitted.
    key = rng.random(n)
    if params.shape >= 2:
        # The reach widens from SHUFFLE_RAMP over the slot's first samples: the first batches
        # come from the first lanes' runs (see the module docstring).
        ramp = max(0, min(n, params.shuffle_buffer - SHUFFLE_RAMP))
        key[:ramp] *= SHUFFLE_RAMP + np.arange(ramp)
        key[ramp:] *= params.shuffle_buffer
    else:
        key *= params.shuffle_buffer
    key += np.arange(n)  # the same sums as arange + jitter * reach
    emit_pos = _stable_argsort(key)
    del key
    emit_read = read_order[emit_pos]
    if not reads:
        del read_order, emit_pos
    chunk = chunk_of[emit_read].astype(np.int64)
    del chunk_of
    if not reads:
        return ids[emit_read], EMPTY, EMPTY, chunk
    return ids[emit_read], ids[read_order], emit_pos, chunk


def _stable_argsort(key: np.ndarray[Any, Any]) -> IntArray:
    """``np.argsort(key, kind="stable")``, by the faster unstable sort where no two keys are
    equal (then every sort gives the one order): 0.1 s less per slot at 2.5M samples."""
    order = np.argsort(key)
    ranked = key[order]
    if len(ranked) > 1 and bool(np.any(ranked[1:] == ranked[:-1])):
        order = np.argsort(key, kind="stable")
    return order.astype(np.int64, copy=False)


def _lane_starts(lengths: IntArray, lanes: int, *, staggered: bool = False) -> IntArray:
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


def _check_padding(n: int, pad: int, basis: int, params: PlanParams, layout: Layout) -> None:
    """Warn when a leg's padding (replayed samples) exceeds ``max_pad_fraction`` of ``basis``.
    Any size plans, as DistributedSampler pads any size: a large share is a warning only."""
    if pad and not params.exact and pad > params.max_pad_fraction * basis:
        warnings.warn(
            f"{n} selected samples over {plural(layout.world_size, 'rank')} x batch_size "
            f"{layout.batch_size} leave {pad} slots filled by replaying samples "
            f"({pad / max(basis, 1):.1%} of the epoch, more than max_pad_fraction="
            f"{params.max_pad_fraction:g}); drop_last=True drops the remainder instead, and a "
            "smaller batch_size or fewer ranks replay less",
            stacklevel=2,
        )


def _slot_sizes(layout: Layout, steps: int) -> list[int]:
    """Rows of each slot (rank-major): its whole batches of the ``steps`` steps."""
    w = layout.slots_per_rank
    return [
        len(range(k, steps, w)) * layout.batch_size
        for _r in range(layout.world_size)
        for k in range(w)
    ]
