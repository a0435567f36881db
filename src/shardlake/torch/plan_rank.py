"""Plan shape 3: a rank plans its own slots, touching only what they read. Pure: no torch, no I/O.

Shapes 1 and 2 (:mod:`.plan`) shuffle every run of the epoch with one generator and split the
result over the slots, so every rank computes (and, without the node-local cache, holds) the
whole epoch's order. Shape 3 keeps shape 2's read shape - runs of consecutive members of one
shard, each shard cut into near-equal runs whose cut points move every epoch, read by
``interleave`` lanes per slot with a bounded shuffle - but orders the runs by a stateless
permutation (:class:`.permute.Permutation`, seeded like the other draws), so a rank finds the
runs that fall in its slots without ordering anyone else's samples:

1. the rows, in (shard, offset) order, are *groups* (one per shard): only the groups' first
   positions are needed (:class:`Groups`; a catalog's rows already come in that order, so no
   row is read to know them);
2. each group is cut into runs (:func:`.plan_steps._balanced_cuts`, a random phase per group
   and epoch): ``O(groups + runs)`` work; the replays that fill the last step are runs too
   (consecutive members from a random start, as in shape 2);
3. the runs are permuted, their lengths summed in that order (``O(runs)``: a run is up to
   ``chunk_size`` samples, one ranged GET), and the concatenation split into one contiguous
   segment per slot, rank-major, sized to its whole batches, as in shape 2;
4. each slot's segment is read and shuffled as in shape 2 (:func:`.plan_steps._slot_order`),
   with a generator of its own, so any slot is planned without the others.

A rank's work is ``O(runs)`` (~N/512 for small samples, ~N/45 for 183 KB frames) plus its own
samples; which samples, shards and table rows it never reads it never touches. Equal steps,
exactly-once epochs, replays, ``drop_last`` (the permuted order's tail sits out) and exact
evaluation (padding ids past the rows) are as in shape 2. A resume with another layout plans
the earlier legs' every slot to know what they consumed (``O(N)``, once per such resume).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .permute import Permutation
from .plan_steps import (
    _balanced_cuts,
    _check_padding,
    _generator,
    _in_shard_order,
    _seed_text,
    _slot_order,
    _slot_sizes,
)
from .plan_types import MIN_RUN_SAMPLES, IntArray, Layout, Leg, LegPlan, PlanParams, Rows

__all__ = ["Groups", "plan_epoch3", "plan_leg3", "shard_groups", "without_rows"]

EMPTY: IntArray = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Groups:
    """The rows a leg orders, in (shard, offset) order, by shard: position ``p`` (``0 <= p <
    n``) is row ``order[p]`` (``order`` None: row ``p``), and a shard's group begins at each of
    ``starts``."""

    n: int
    starts: IntArray
    order: np.ndarray[Any, Any] | None = None

    def rows(self, positions: IntArray) -> IntArray:
        if self.order is None:
            return positions
        out: IntArray = self.order[positions].astype(np.int64, copy=False)
        return out


_BLOCK = 1 << 20  # rows compared at a time: temporaries of a few MB, not of the whole table


def _ordered_starts(rows: Rows) -> IntArray | None:
    """Where each shard's rows begin, if ``rows`` are in (shard, offset) order (else None):
    compared a block at a time, with no copy of the columns (at 100M rows a copy of each was
    1.6 GB and seconds of a cold start)."""
    n, starts = len(rows), [np.zeros(1, dtype=np.int64)]
    for lo in range(0, n - 1, _BLOCK):
        hi = min(n, lo + _BLOCK + 1)  # one row of overlap: each neighbour pair once
        shard, offset = rows.shard[lo:hi], rows.offset[lo:hi]
        ahead = shard[1:] > shard[:-1]
        level = shard[1:] == shard[:-1]
        if not bool(np.all(ahead | (level & (offset[1:] >= offset[:-1])))):
            return None
        starts.append(np.flatnonzero(~level) + (lo + 1))
    return np.concatenate(starts).astype(np.int64, copy=False)


def shard_groups(rows: Rows) -> Groups:
    """The groups of ``rows`` (``O(n)``: for rows known only as arrays)."""
    n = len(rows)
    if n == 0:
        return Groups(0, EMPTY)
    starts = _ordered_starts(rows)
    if starts is not None:  # a catalog's rows mostly are in order
        return Groups(n, starts)
    ids = np.arange(n, dtype=np.int64)
    ordered = _in_shard_order(rows, ids)
    order = None if ordered is ids else ordered
    shard = rows.shard if order is None else rows.shard[order]
    return Groups(n, np.flatnonzero(np.r_[True, shard[1:] != shard[:-1]]), order)


def without_rows(groups: Groups, exclude: IntArray, n_all: int) -> Groups:
    """``groups`` less the rows ``exclude`` (what earlier legs consumed)."""
    if not len(exclude):
        return groups
    keep = np.ones(n_all, dtype=bool)
    keep[exclude] = False
    ids = (
        np.arange(groups.n, dtype=np.int64)
        if groups.order is None
        else groups.rows(np.arange(groups.n, dtype=np.int64))
    )
    kept = keep[ids]
    counts = np.add.reduceat(kept.astype(np.int64), groups.starts) if groups.n else EMPTY
    first = (np.cumsum(counts) - counts)[counts > 0]
    return Groups(int(kept.sum()), first.astype(np.int64), ids[kept])


def _seed(params: PlanParams, epoch: int, layout: Layout, leg: int, purpose: str) -> str:
    return _seed_text("shardlake.plan/3", params, epoch, layout, leg, purpose)


def _replay_runs(
    groups: Groups, pad: int, size: int, rng: np.random.Generator
) -> tuple[IntArray, IntArray]:
    """Shard-order positions of the ``pad`` replays: consecutive members from a random start
    (wrapping), and where each of their runs begins (at a new shard, the wrap, or every
    ``size``)."""
    start = int(rng.integers(0, groups.n))
    where = (start + np.arange(pad, dtype=np.int64)) % groups.n
    group = np.searchsorted(groups.starts, where, side="right")
    j = np.arange(pad)
    cut = (j % size == 0) | np.r_[True, (group[1:] != group[:-1]) | (where[1:] < where[:-1])]
    return where, np.flatnonzero(cut)


def _spread(
    groups: Groups,
    begin: IntArray,
    n: int,
    replay_at: IntArray,
    rng: np.random.Generator,
    seed: str,
) -> IntArray:
    """The runs' order: every shard's runs spread evenly over it, as in shape 2 (any stretch
    of the order, a slot's segment, holds every shard in proportion to its size). The
    permutation gives each run a random key; a shard's runs, ranked by their keys, take the
    places ``(rank + u) / count`` of one line (``u`` a random phase per shard), and the runs
    are taken in the order of their places (ties: by key). ``O(runs log runs)``."""
    key = Permutation(len(begin), seed).order()
    first = np.where(begin < n, begin, replay_at[np.maximum(begin - n, 0)] if len(replay_at) else 0)
    group = np.searchsorted(groups.starts, first, side="right") - 1
    by_group = np.lexsort((key, group))
    counts = np.bincount(group, minlength=len(groups.starts))
    rank = np.empty(len(begin), dtype=np.float64)
    rank[by_group] = np.arange(len(begin)) - np.repeat(np.cumsum(counts) - counts, counts)
    phase = rng.random(len(groups.starts))
    place = (rank + phase[group]) / counts[group]
    order: IntArray = np.lexsort((key, place)).astype(np.int64)
    return order


def plan_leg3(
    groups: Groups,
    params: PlanParams,
    epoch: int,
    layout: Layout,
    *,
    n_all: int,
    slots: range | None = None,
    leg: int = 0,
    epoch_samples: int | None = None,
    reads: bool = True,
) -> LegPlan:
    """The leg over ``groups`` (rows of ``0 .. n_all - 1``); only the slots ``slots`` (default
    all) are planned, the others are empty. Shuffled only (unshuffled legs keep the rows' own
    order: :func:`.plan_batches._ordered_leg`). ``reads=False``: ``slot_read`` and
    ``slot_read_pos`` stay empty (see :func:`.plan_steps._slot_order`)."""
    n, per_step = groups.n, layout.global_batch
    total = n // per_step * per_step if params.drop_last else n
    steps = math.ceil(total / per_step) if total else 0
    pad = steps * per_step - total
    basis = epoch_samples if epoch_samples is not None else n_all
    _check_padding(total, pad, basis, params, layout)
    size = params.chunk_size
    count = layout.world_size * layout.slots_per_rank
    if params.min_slot_runs and n:
        size = min(size, max(MIN_RUN_SAMPLES, math.ceil(n / (count * params.min_slot_runs))))
    rng = _generator(_seed(params, epoch, layout, leg, "runs"))
    counts = np.diff(np.r_[groups.starts, n]).astype(np.int64)
    run_at = _balanced_cuts(groups.starts, counts, size, rng) if n else EMPTY
    replay_at, replay_cuts = (EMPTY, EMPTY)
    if pad:
        replay_at, replay_cuts = _replay_runs(groups, pad, size, rng)
    # Runs as positions of one extended sequence: the groups' n positions, then the replays.
    begin = np.r_[run_at, n + replay_cuts].astype(np.int64)
    length = np.diff(np.r_[begin, n + pad]).astype(np.int64)
    pad_rows = groups.rows(replay_at) if pad else None

    def ids(positions: IntArray) -> IntArray:
        extra = positions >= n
        if not extra.any():
            return groups.rows(positions)
        out = np.empty(len(positions), dtype=np.int64)
        out[~extra] = groups.rows(positions[~extra])
        j = positions[extra] - n
        out[extra] = n_all + j if params.exact else groups.rows(replay_at[j])
        return out

    order = _spread(groups, begin, n, replay_at, rng, _seed(params, epoch, layout, leg, "order"))
    ends = np.cumsum(length[order])
    sizes = _slot_sizes(layout, steps)
    firsts = np.cumsum([0, *sizes])
    wanted = range(count) if slots is None else slots
    slot_rows: list[IntArray] = [EMPTY] * count
    slot_read, slot_pos, slot_chunk = list(slot_rows), list(slot_rows), list(slot_rows)
    segments: list[list[IntArray]] = [[] for _ in range(count)]
    for s in wanted:
        a, b = int(firsts[s]), int(firsts[s + 1])
        if b <= a:
            continue
        r0, r1 = int(np.searchsorted(ends, a, "right")), int(np.searchsorted(ends, b, "left"))
        picked = order[r0 : r1 + 1]
        run_end = ends[r0 : r1 + 1]
        run_start = run_end - length[picked]
        lo = np.maximum(a, run_start) - run_start
        hi = np.minimum(b, run_end) - run_start
        pieces = hi - lo
        firsts_in = np.cumsum(pieces) - pieces
        flat = np.repeat(begin[picked] + lo - firsts_in, pieces) + np.arange(b - a)
        rows = ids(flat)
        bounds = [*firsts_in.tolist(), b - a]
        seg = [rows[x:y] for x, y in zip(bounds[:-1], bounds[1:], strict=True)]
        segments[s] = seg
        emit, read, pos, chunk = _slot_order(
            seg,
            params,
            _generator(_seed(params, epoch, layout, leg, f"slot {s}")),
            rows,
            reads=reads,
        )
        slot_rows[s], slot_read[s], slot_pos[s], slot_chunk[s] = emit, read, pos, chunk
    return LegPlan(
        layout,
        steps,
        total,
        pad,
        slot_rows,
        slot_read,
        slot_pos,
        segments,
        slot_chunk,
        n_all if params.exact else None,
        pad_rows if params.exact else None,
    )


def plan_epoch3(
    groups: Groups,
    params: PlanParams,
    epoch: int,
    layout: Layout,
    legs: Sequence[Leg] = (),
    *,
    n_all: int,
    slots: range | None = None,
    reads: bool = True,
) -> LegPlan:
    """The current leg of ``epoch`` after the finished ``legs`` (resume), its ``slots`` only
    (``reads``: as :func:`plan_leg3`'s; earlier legs are planned without them)."""
    used: list[IntArray] = []
    for i, done in enumerate(legs):
        rest = without_rows(groups, np.concatenate(used), n_all) if used else groups
        prev = plan_leg3(rest, params, epoch, done.layout, n_all=n_all, leg=i, reads=False)
        got = prev.consumed(done.steps)
        used.append(got[got < prev.pad_base] if prev.pad_base is not None else got)
    rest = without_rows(groups, np.concatenate(used), n_all) if used else groups
    return plan_leg3(
        rest, params, epoch, layout, n_all=n_all, slots=slots, leg=len(legs), reads=reads
    )
