"""The epoch plan: which sample every (rank, worker) slot yields at every step. Pure: no torch, no I/O.

Design
------
A *leg* is a stretch of an epoch run with one layout (world size R, workers per rank W, batch
size B). Within a leg, rank ``r`` runs ``T = ceil(n / (R * B))`` steps (the same on every rank,
so DDP never waits on a rank that ran out) and step ``t`` of rank ``r`` comes from worker
``t % W`` (the order in which a ``DataLoader`` polls its workers). Every slot therefore yields
whole batches; the ``T * R * B - n`` missing samples are *replays* of randomly chosen selected
samples, capped by ``max_pad_fraction`` of the epoch.

The order is built for mixing and for sequential reads at once:

1. the selected rows are cut into *chunks*: runs of about ``chunk_size`` consecutive members of
   one shard (the cut points move every epoch, so chunks differ between epochs); the loader
   sizes them to about ``ReadOptions.request_bytes`` (8 MiB) of payload, one GET each;
2. the chunk order is shuffled (a different, reproducible permutation per epoch, so every epoch
   reassigns samples to other ranks and workers) and the concatenation is split into one
   contiguous segment per slot, sized to the slot's whole batches;
3. inside a slot, ``interleave`` chunks are open at a time and their samples alternate (each
   chunk is one coalesced ranged read): plan shape 2 keeps ``interleave`` *lanes*, each reading
   its runs one after the other, so a run opens as another ends (sequential shard streaming
   with a shuffle buffer); and a bounded shuffle (every sample is emitted at most
   ``shuffle_buffer`` positions away from where it was read) mixes partitions inside batches.
   Shape 2 also starts its lanes one after another over the first run's length and widens the
   shuffle from ``SHUFFLE_RAMP`` samples to ``shuffle_buffer`` over a slot's first samples, so
   a slot's first batches need the first few runs of the slot, not every run it opens: from an
   object store, the first batch waits for a few GETs instead of all of them.

Plan shape 1 (loader states saved before shape 2 name no shape and resume with it) cut
chunks to at most ``chunk_size`` from a random phase, took ``interleave`` chunks at a time as a
group, and drew each replay independently.

Everything is a function of (version hash, selection digest, seed, epoch, layout, knobs), so a
rerun is identical and any slot's order is computed without looking at the others' I/O.

Resume: the loader's cursor is ``(epoch, legs)`` where each finished leg records its layout and
how many global steps were consumed (a global step = one batch on every rank). With the same
layout, resuming is just starting every slot at the next unconsumed step: exactly the remaining
batches, in the same order. With another layout (world size, workers or batch size changed), a
new leg is planned over the samples the earlier legs did not consume — recomputed from their
plans, which is cheap and independent of how far they got — so the union of all legs is one
epoch with no duplicates beyond planned replays. (Keeping the old batches under a new layout is
not possible in general: a batch must hold B samples of one rank.)
"""

from __future__ import annotations

import hashlib
import heapq
import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import PlanError
from ..progress.bar import plural
from .plan_batches import _ordered_leg
from .plan_types import (
    MIN_RUN_SAMPLES,
    SHUFFLE_RAMP,
    IntArray,
    Layout,
    Leg,
    LegPlan,
    PlanParams,
    Rows,
)

__all__ = ["SHAPE1_INTERLEAVE", "plan_epoch", "plan_leg"]

SHAPE1_INTERLEAVE = 16  # plan shape 1's default


def _rng(
    params: PlanParams, epoch: int, layout: Layout, leg: int, purpose: str
) -> np.random.Generator:
    text = "|".join(
        str(x)
        for x in (
            "shardlake.plan/1",
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
    digest = hashlib.sha256(text.encode()).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "little")))


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


def _chunks(
    rows: Rows,
    ids: IntArray,
    chunk_size: int,
    rng: np.random.Generator | None,
    balanced: bool = False,
) -> list[IntArray]:
    """Cut ``ids`` into runs of consecutive members of one shard (shard order): of <=
    ``chunk_size`` members, or (``balanced``, plan shape 2) each shard's members into
    ``round(m / chunk_size)`` near-equal runs of 1/2-3/2 ``chunk_size``, so that no short
    run costs a request of its own."""
    if len(ids) == 0:
        return []
    ids = _in_shard_order(rows, ids)
    shard = rows.shard[ids]
    starts = np.flatnonzero(np.r_[True, shard[1:] != shard[:-1]])
    counts = np.diff(np.r_[starts, len(ids)])
    if balanced:
        cuts = _balanced_cuts(starts, counts, chunk_size, rng)
    else:
        group = np.repeat(np.arange(len(starts)), counts)
        pos = np.arange(len(ids)) - starts[group]
        if rng is not None:
            # A random phase per shard: the cut points (hence chunk members) move every epoch.
            phase = rng.integers(0, chunk_size, size=len(starts))
            pos = pos + phase[group]
        block = pos // chunk_size
        cuts = np.flatnonzero(np.r_[True, (group[1:] != group[:-1]) | (block[1:] != block[:-1])])
    # Plain slices: np.split costs ~10 us a piece, and a million rows make ~60,000 chunks.
    ends = [*cuts[1:].tolist(), len(ids)]
    return [ids[a:b] for a, b in zip(cuts.tolist(), ends, strict=True)]


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
        lane_start = _lane_starts(lengths, params.interleave, staggered=True)
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
    emit_pos = _stable_argsort(key)
    return read[emit_pos], read, emit_pos, chunk_no[read_order][emit_pos]


def _stable_argsort(key: np.ndarray[Any, Any]) -> IntArray:
    """``np.argsort(key, kind="stable")``, by the faster unstable sort where no two keys are
    equal (then every sort gives the one order): 0.1 s less per slot at 2.5M samples."""
    order = np.argsort(key)
    ranked = key[order]
    if len(ranked) > 1 and bool(np.any(ranked[1:] == ranked[:-1])):
        order = np.argsort(key, kind="stable")
    return order.astype(np.int64, copy=False)


def _spread(rows: Rows, chunks: list[IntArray], rng: np.random.Generator) -> IntArray:
    """A random chunk order in which every shard's chunks are spread evenly (plan shape 2).

    Each shard's chunks, in a random order, get the places ``(i + u) / n`` (``n`` chunks,
    ``u`` a random phase per shard) of one line, and the chunks are taken in the order of
    their places: any stretch of the order (a slot's segment, a lane set) holds every shard in
    proportion to its size, however long the runs; which chunk lands where changes every
    epoch as before."""
    if not chunks:
        return np.zeros(0, dtype=np.int64)
    shard = rows.shard[np.fromiter((c[0] for c in chunks), dtype=np.int64, count=len(chunks))]
    perm = rng.permutation(len(chunks))  # a random order of chunks, then ranks within shards
    by_shard = perm[np.argsort(shard[perm], kind="stable")]
    kinds, first, count = np.unique(shard[by_shard], return_index=True, return_counts=True)
    rank = np.empty(len(chunks), dtype=np.float64)
    rank[by_shard] = np.arange(len(chunks)) - np.repeat(first, count)
    group = np.searchsorted(kinds, shard)
    place = (rank + rng.random(len(kinds))[group]) / count[group]
    return np.lexsort((rng.random(len(chunks)), place))


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


def _split_segments(chunks: list[IntArray], sizes: list[int]) -> list[list[IntArray]]:
    """Cut the concatenated ``chunks`` into consecutive segments of ``sizes`` rows, each a
    list of (pieces of) chunks; vectorised, as a million rows make ~60,000 chunks."""
    lengths = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=len(chunks))
    flat = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
    chunk_of = np.repeat(np.arange(len(chunks)), lengths)
    segments: list[list[IntArray]] = []
    start = 0
    for size in sizes:
        end = start + size
        cuts = (np.flatnonzero(np.diff(chunk_of[start:end])) + 1).tolist()
        bounds = [0, *cuts, size] if size else [0]
        part = flat[start:end]
        segments.append([part[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
        start = end
    return segments


def plan_leg(
    rows: Rows,
    params: PlanParams,
    epoch: int,
    layout: Layout,
    *,
    exclude: IntArray | None = None,
    leg: int = 0,
    epoch_samples: int | None = None,
) -> LegPlan:
    """Plan one leg of ``epoch`` over ``rows`` minus ``exclude`` (rows earlier legs consumed).

    ``epoch_samples`` (default: all rows) is what ``max_pad_fraction`` is measured against.
    Unshuffled, the leg keeps the rows' own order (see :func:`_ordered_leg`).
    """
    n_all = len(rows)
    ids = _leg_ids(n_all, exclude)
    per_step = layout.global_batch
    rng = _rng(params, epoch, layout, leg, "order") if params.shuffle else None
    if params.drop_last:
        # DistributedSampler + DataLoader(drop_last=True): only whole steps, nothing replayed;
        # shuffled, which samples sit out changes every epoch.
        keep = len(ids) // per_step * per_step
        if keep < len(ids) and rng is not None:
            drop_rng = _rng(params, epoch, layout, leg, "drop")
            ids = np.sort(drop_rng.permutation(ids)[:keep])
        else:
            ids = ids[:keep]
    n = len(ids)
    steps = math.ceil(n / per_step) if n else 0
    pad = steps * per_step - n
    _check_padding(n, pad, epoch_samples if epoch_samples is not None else n_all, params, layout)
    if rng is None:
        return _ordered_leg(rows, ids, params, layout, steps, pad)
    replay_rng = _rng(params, epoch, layout, leg, "replay") if pad else None
    shaped = params.shape >= 2
    replay = _replay(ids, pad, replay_rng, rows if shaped else None)
    pad_rows = None
    if params.exact:
        # Padding gets ids of its own past the rows, so it can be told apart after planning.
        pad_rows, replay = replay, n_all + np.arange(pad, dtype=np.int64)
        rows = Rows(
            np.concatenate([rows.shard, rows.shard[pad_rows]]),
            np.concatenate([rows.offset, rows.offset[pad_rows]]),
        )
    size = params.chunk_size
    if shaped and params.min_slot_runs and n:
        # Every slot gets at least `min_slot_runs` runs (a small epoch over many slots would
        # otherwise mix only a few partitions into each, or read one whole partition per
        # slot), down to MIN_RUN_SAMPLES: only an epoch of < 256 samples per slot is affected.
        slots = layout.world_size * layout.slots_per_rank
        per_slot = math.ceil(n / (slots * params.min_slot_runs))
        size = min(size, max(MIN_RUN_SAMPLES, per_slot))
    chunks = _chunks(rows, ids, size, rng, shaped) + _chunks(rows, replay, size, rng, shaped)
    order = _spread(rows, chunks, rng) if shaped else rng.permutation(len(chunks))
    chunks = [chunks[i] for i in order]
    # Split the chunk sequence into one contiguous segment per slot (rank-major), sized to
    # each slot's whole batches; a chunk straddling a boundary is split.
    segments = _split_segments(chunks, _slot_sizes(layout, steps))
    slot_rows, slot_read, slot_pos, slot_chunk = [], [], [], []
    for seg in segments:
        emit, read, pos, chunk_of = _slot_order(seg, params, rng)
        slot_rows.append(emit)
        slot_read.append(read)
        slot_pos.append(pos)
        slot_chunk.append(chunk_of)
    return LegPlan(
        layout,
        steps,
        n,
        pad,
        slot_rows,
        slot_read,
        slot_pos,
        segments,
        slot_chunk,
        n_all if params.exact else None,
        pad_rows,
    )


def _leg_ids(n_all: int, exclude: IntArray | None) -> IntArray:
    """Row ids ``0..n_all-1`` without ``exclude``."""
    ids = np.arange(n_all, dtype=np.int64)
    if exclude is None or not len(exclude):
        return ids
    keep = np.ones(n_all, dtype=bool)
    keep[exclude] = False
    return ids[keep]


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


def _replay(
    ids: IntArray, pad: int, rng: np.random.Generator | None, rows: Rows | None = None
) -> IntArray:
    """``pad`` of ``ids`` drawn by ``rng`` to fill the last step (with repeats if too few).

    With ``rows`` (plan shape 2) they are one run of consecutive members in shard order from
    a random start (one or two requests instead of one per replay)."""
    if not pad or rng is None:
        return np.zeros(0, dtype=np.int64)
    if rows is not None and pad <= len(ids):
        ordered = _in_shard_order(rows, ids)
        start = int(rng.integers(0, len(ids)))
        return ordered[(start + np.arange(pad)) % len(ids)]
    return ids[rng.choice(len(ids), size=pad, replace=pad > len(ids))]


def _slot_sizes(layout: Layout, steps: int) -> list[int]:
    """Rows of each slot (rank-major): its whole batches of the ``steps`` steps."""
    w = layout.slots_per_rank
    return [
        len(range(k, steps, w)) * layout.batch_size
        for _r in range(layout.world_size)
        for k in range(w)
    ]


def plan_epoch(
    rows: Rows,
    params: PlanParams,
    epoch: int,
    layout: Layout,
    legs: Sequence[Leg] = (),
) -> LegPlan:
    """The plan of the current leg of ``epoch``, after the finished ``legs`` (resume)."""
    exclude: list[IntArray] = []
    for i, done in enumerate(legs):
        prev = plan_leg(
            rows,
            params,
            epoch,
            done.layout,
            exclude=np.concatenate(exclude) if exclude else None,
            leg=i,
        )
        used = prev.consumed(done.steps)
        if prev.pad_base is not None:
            used = used[used < prev.pad_base]
        exclude.append(used)
    return plan_leg(
        rows,
        params,
        epoch,
        layout,
        exclude=np.concatenate(exclude) if exclude else None,
        leg=len(legs),
    )
