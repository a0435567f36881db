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

import math
from collections.abc import Sequence

import numpy as np

from .plan_batches import _ordered_leg
from .plan_rank import plan_epoch3, plan_leg3, shard_groups, without_rows
from .plan_steps import (
    _balanced_cuts,
    _check_padding,
    _in_shard_order,
    _rng,
    _slot_order,
    _slot_sizes,
)
from .plan_types import (
    MIN_RUN_SAMPLES,
    IntArray,
    Layout,
    Leg,
    LegPlan,
    PlanParams,
    Rows,
)

__all__ = ["SHAPE1_INTERLEAVE", "plan_epoch", "plan_leg"]

SHAPE1_INTERLEAVE = 16  # plan shape 1's default
_NONE: IntArray = np.zeros(0, dtype=np.int64)


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
    if params.shape >= 3 and params.shuffle:
        groups = without_rows(shard_groups(rows), exclude if exclude is not None else _NONE, n_all)
        return plan_leg3(
            groups, params, epoch, layout, n_all=n_all, leg=leg, epoch_samples=epoch_samples
        )
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


def plan_epoch(
    rows: Rows,
    params: PlanParams,
    epoch: int,
    layout: Layout,
    legs: Sequence[Leg] = (),
) -> LegPlan:
    """The plan of the current leg of ``epoch``, after the finished ``legs`` (resume)."""
    if params.shape >= 3 and params.shuffle:
        return plan_epoch3(shard_groups(rows), params, epoch, layout, legs, n_all=len(rows))
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
