"""Legs whose batches are given: order "torch" (DistributedSampler + DataLoader's exact batches)
and the unshuffled order; each batch is read as one chunk per shard it touches, or one per sample.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..errors import PlanError
from ..progress.bar import plural
from .plan_types import IntArray, Layout, LegPlan, PlanParams, Rows

__all__ = [
    "_ordered_leg",
    "plan_torch_leg",
]


def _from_start(ids: IntArray, pad: int) -> IntArray:
    """``pad`` ids repeated from the start of ``ids`` (cyclically), as DistributedSampler pads."""
    if not pad or not len(ids):
        return np.zeros(0, dtype=np.int64)
    return ids[np.arange(pad) % len(ids)]


def _ordered_leg(
    rows: Rows, ids: IntArray, params: PlanParams, layout: Layout, steps: int, pad: int
) -> LegPlan:
    """The unshuffled leg: ``ids`` in their own order (the selection's: a key list's or a
    keyset's order, else the manifest's), step after step and within a step rank after rank,
    whatever the workers. The padding repeats the first ids (marked invalid when exact)."""
    n_all = len(rows)
    replay = _from_start(ids, pad)
    pad_rows = None
    if params.exact:
        pad_rows, replay = replay, n_all + np.arange(pad, dtype=np.int64)
    seq = np.concatenate([ids, replay]).astype(np.int64, copy=False)
    b, world = layout.batch_size, layout.world_size
    rank_batches = [
        [seq[(t * world + r) * b : (t * world + r + 1) * b] for t in range(steps)]
        for r in range(world)
    ]
    return _batches_leg(
        rows, layout, rank_batches, len(ids), pad, pad_rows, one_per_chunk=False, exact=params.exact
    )


def plan_torch_leg(
    rows: Rows, params: PlanParams, layout: Layout, permutation: IntArray | None
) -> LegPlan:
    """Order "torch": the batches ``DataLoader(batch_size=B, drop_last=params.drop_last)``
    over ``DistributedSampler(num_replicas=R, rank=r, shuffle, seed,
    drop_last=params.sampler_drop_last)`` gives each rank, over the rows' own order.

    ``permutation`` is the sampler's ``torch.randperm(n)`` for this epoch (seeded with
    ``seed + epoch``; computed by the caller, this module imports no torch), or None unshuffled.
    Every sample is its own read (one ranged request), so emits need no reorder buffer.
    The sampler's padding repeats indices from the start of the (shuffled) list; with
    ``exact`` those repeats are marked invalid. The last batch may be short (DataLoader
    keeps it unless ``drop_last``), on every rank alike.
    """
    n = len(rows)
    world, b = layout.world_size, layout.batch_size
    indices = (
        np.arange(n, dtype=np.int64)
        if permutation is None
        else np.asarray(permutation, dtype=np.int64)
    )
    if len(indices) != n:
        raise PlanError(f"order='torch': permutation of {len(indices)} for {plural(n, 'row')}")
    if params.sampler_drop_last and n % world:
        per_rank = math.ceil((n - world) / world)
    else:
        per_rank = math.ceil(n / world)
    total = per_rank * world
    pad = max(0, total - n)
    padding = _from_start(indices, pad)
    pad_rows = None
    if params.exact and pad:
        pad_rows, padding = padding, n + np.arange(pad, dtype=np.int64)
    seq = np.concatenate([indices, padding])[:total]
    whole = per_rank // b
    steps = whole if params.drop_last or per_rank % b == 0 else whole + 1
    rank_batches = []
    for r in range(world):
        mine = seq[r:total:world]
        rank_batches.append([mine[t * b : (t + 1) * b] for t in range(steps)])
    samples = min(n, total)
    return _batches_leg(
        rows, layout, rank_batches, samples, pad, pad_rows, one_per_chunk=True, exact=params.exact
    )


def _batches_leg(
    rows: Rows,
    layout: Layout,
    rank_batches: list[list[IntArray]],
    samples: int,
    replays: int,
    pad_rows: IntArray | None,
    *,
    one_per_chunk: bool,
    exact: bool,
) -> LegPlan:
    """A leg whose batches are given (per rank, in step order): slot ``(r, k)`` yields rank
    ``r``'s steps ``k, k + W, ...``. Each batch is read as one chunk per shard it touches
    (its members in offset order), or ``one_per_chunk`` a chunk per sample."""
    n_all = len(rows)
    if pad_rows is not None and len(pad_rows):
        rows = Rows(
            np.concatenate([rows.shard, rows.shard[pad_rows]]),
            np.concatenate([rows.offset, rows.offset[pad_rows]]),
        )
    w = layout.slots_per_rank
    steps = len(rank_batches[0]) if rank_batches else 0
    empty = np.zeros(0, dtype=np.int64)
    slot_rows, slot_chunks, slot_emit = [], [], []
    for batches in rank_batches:
        for k in range(w):
            mine = batches[k:steps:w]
            emit = np.concatenate(mine).astype(np.int64, copy=False) if mine else empty
            chunks: list[IntArray] = []
            chunk_of: list[IntArray] = []
            for batch in mine:
                if one_per_chunk:
                    chunk_of.append(len(chunks) + np.arange(len(batch), dtype=np.int64))
                    chunks.extend(batch[i : i + 1] for i in range(len(batch)))
                    continue
                order = np.lexsort((rows.offset[batch], rows.shard[batch]))
                ordered = batch[order]
                shard = rows.shard[ordered]
                cuts = np.flatnonzero(np.r_[True, shard[1:] != shard[:-1]]).tolist()
                bounds = [*cuts, len(ordered)]
                which = np.empty(len(batch), dtype=np.int64)
                for c, (lo, hi) in enumerate(itertools.pairwise(bounds)):
                    which[order[lo:hi]] = len(chunks) + c
                chunks.extend(ordered[lo:hi] for lo, hi in itertools.pairwise(bounds))
                chunk_of.append(which)
            slot_rows.append(emit)
            slot_chunks.append(chunks)
            slot_emit.append(np.concatenate(chunk_of) if chunk_of else empty)
    read = [np.concatenate(c) if c else empty for c in slot_chunks]
    read_pos = [
        _read_positions(c, r, e) for c, r, e in zip(slot_chunks, slot_rows, slot_emit, strict=True)
    ]
    return LegPlan(
        layout,
        steps,
        samples,
        replays,
        slot_rows,
        read,
        read_pos,
        slot_chunks,
        slot_emit,
        n_all if exact else None,
        pad_rows if exact else None,
    )


def _read_positions(chunks: list[IntArray], emit: IntArray, emit_chunk: IntArray) -> IntArray:
    """For each emitted sample, its position in the slot's read order (the chunks in turn):
    emits and reads sorted alike by (chunk, row) pair up, as they are the same multiset."""
    if not chunks:
        return np.zeros(0, dtype=np.int64)
    lengths = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=len(chunks))
    read_rows = np.concatenate(chunks)
    read_chunk = np.repeat(np.arange(len(chunks)), lengths)
    pos = np.empty(len(emit), dtype=np.int64)
    pos[np.lexsort((emit, emit_chunk))] = np.lexsort((read_rows, read_chunk))
    return pos
