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
import itertools
import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..errors import PlanError

__all__ = [
    "ORDERS",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_INTERLEAVE",
    "DEFAULT_MAX_PAD_FRACTION",
    "DEFAULT_SHUFFLE_BUFFER",
    "MIN_SLOT_RUNS",
    "PLAN_SHAPE",
    "SHAPE1_INTERLEAVE",
    "Cursor",
    "Layout",
    "Leg",
    "LegPlan",
    "PlanParams",
    "ReadPlan",
    "Rows",
    "plan_epoch",
    "plan_leg",
    "plan_torch_leg",
    "resolve",
    "selection_digest",
]

DEFAULT_MAX_PAD_FRACTION = 0.1
DEFAULT_CHUNK_SIZE = 16
DEFAULT_INTERLEAVE = 32  # lanes of plan shape 2
SHAPE1_INTERLEAVE = 16  # plan shape 1's default
DEFAULT_SHUFFLE_BUFFER = 512
PLAN_SHAPE = 2
MIN_SLOT_RUNS = 16  # plan shape 2: runs per slot at least (shorter runs in a small epoch)
MIN_RUN_SAMPLES = 4  # plan shape 2: the shortest run a small epoch gets
SHUFFLE_RAMP = 64  # plan shape 2: the shuffle's reach at a slot's first sample
# "shardlake": the plan above (fast); "torch": DistributedSampler + DataLoader's exact order
ORDERS = ("shardlake", "torch")

IntArray = np.ndarray[Any, np.dtype[np.int64]]


@dataclass(frozen=True)
class Layout:
    """How many ranks, workers per rank and samples per rank batch a leg runs with."""

    world_size: int
    num_workers: int  # DataLoader workers per rank; 0 (in-process) plans like 1
    batch_size: int

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.batch_size < 1 or self.num_workers < 0:
            raise PlanError(
                f"invalid layout: world_size={self.world_size}, num_workers={self.num_workers}, "
                f"batch_size={self.batch_size} (need world_size >= 1, batch_size >= 1, "
                "num_workers >= 0)"
            )

    @property
    def slots_per_rank(self) -> int:
        return max(1, self.num_workers)

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch_size


@dataclass(frozen=True)
class PlanParams:
    """Everything besides the layout that decides the order."""

    version_hash: str
    selection_digest: str
    seed: int = 0
    shuffle: bool = True
    max_pad_fraction: float = DEFAULT_MAX_PAD_FRACTION
    chunk_size: int = DEFAULT_CHUNK_SIZE
    interleave: int = DEFAULT_INTERLEAVE
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER
    # Evaluation: the padding for equal steps is marked invalid (not capped, not a replay).
    exact: bool = False
    # How a slot's chunks are read and mixed: 1 = `interleave` chunks at a time (loaders
    # before plan shape 2, 16-sample chunks); 2 = `interleave` lanes of long runs (default).
    shape: int = PLAN_SHAPE
    # Shape 2: shorter runs where a slot would get fewer (0: chunk_size as given).
    min_slot_runs: int = MIN_SLOT_RUNS
    # Drop the remainder that does not fill a step on every rank, instead of replaying samples
    # (DistributedSampler + DataLoader(drop_last=True)); in order "torch": DataLoader's own.
    drop_last: bool = False
    order: str = "shardlake"
    # Order "torch" only: DistributedSampler(drop_last=...) (drop the tail that does not
    # divide among the ranks, instead of padding it).
    sampler_drop_last: bool = False

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise PlanError(f"order={self.order!r}: choose one of {', '.join(map(repr, ORDERS))}")
        if self.chunk_size < 1 or self.interleave < 1 or self.shuffle_buffer < 1:
            raise PlanError("chunk_size, interleave and shuffle_buffer must be >= 1")
        if self.min_slot_runs < 0:
            raise PlanError("min_slot_runs must be >= 0")
        if self.shape not in (1, 2):
            raise PlanError(f"unknown plan shape {self.shape} (this shardlake knows 1 and 2)")
        if not self.max_pad_fraction >= 0.0:
            raise PlanError("max_pad_fraction must be >= 0")


@dataclass(frozen=True)
class Leg:
    """One finished stretch of an epoch: its layout and the global steps it consumed."""

    layout: Layout
    steps: int

    def to_json(self) -> dict[str, int]:
        return {**asdict(self.layout), "steps": self.steps}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Leg:
        return cls(
            Layout(int(doc["world_size"]), int(doc["num_workers"]), int(doc["batch_size"])),
            int(doc["steps"]),
        )


@dataclass(frozen=True)
class Rows:
    """The selected manifest rows the plan orders: for row ``i``, its shard and byte offset.

    ``shard`` is any integer naming the shard file (e.g. an index into a list of shard keys);
    rows of one shard with ascending ``offset`` are read sequentially.
    """

    shard: IntArray
    offset: IntArray

    def __post_init__(self) -> None:
        if self.shard.shape != self.offset.shape or self.shard.ndim != 1:
            raise PlanError("Rows.shard and Rows.offset must be 1-d arrays of one length")

    def __len__(self) -> int:
        return int(self.shard.shape[0])


@dataclass
class LegPlan:
    """The plan of one leg: per slot, its samples (row indices) in emit order, batch by batch."""

    layout: Layout
    steps: int  # steps per rank
    samples: int  # distinct rows this leg covers
    replays: int  # padding samples (rows emitted a second time)
    # slot (rank * slots_per_rank + worker) -> rows in emit order (len = batches * batch_size)
    slot_rows: list[IntArray] = field(repr=False)
    # slot -> rows in read order (the order chunks are fetched; same multiset as slot_rows)
    slot_read: list[IntArray] = field(repr=False)
    # slot -> for each emitted sample, its position in slot_read (to bound read-ahead)
    slot_read_pos: list[IntArray] = field(repr=False)
    # slot -> its chunks in fetch order (rows of one shard, ascending offsets)
    slot_chunks: list[list[IntArray]] = field(repr=False)
    # slot -> for each emitted sample, the index of its chunk in slot_chunks
    slot_emit_chunk: list[IntArray] = field(repr=False)
    # exact mode: ids >= pad_base are padding; pad_rows[id - pad_base] is the row read for it
    pad_base: int | None = None
    pad_rows: IntArray | None = field(default=None, repr=False)

    def slot(self, rank: int, worker: int) -> int:
        return rank * self.layout.slots_per_rank + worker

    def batches(self, rank: int, worker: int) -> list[IntArray]:
        rows = self.slot_rows[self.slot(rank, worker)]
        b = self.layout.batch_size
        return [rows[i : i + b] for i in range(0, len(rows), b)]

    def rank_batches(self, rank: int) -> list[IntArray]:
        """Rank ``rank``'s batches in step order (what its loader yields)."""
        w = self.layout.slots_per_rank
        per_worker = [self.batches(rank, k) for k in range(w)]
        return [per_worker[t % w][t // w] for t in range(self.steps)]

    def step_rows(self, step: int) -> IntArray:
        """Every row consumed at global step ``step`` (all ranks)."""
        w = self.layout.slots_per_rank
        b = self.layout.batch_size
        j = step // w
        parts = [
            self.slot_rows[self.slot(r, step % w)][j * b : (j + 1) * b]
            for r in range(self.layout.world_size)
        ]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def consumed(self, steps: int) -> IntArray:
        """Rows consumed by the first ``steps`` global steps (replays included)."""
        w = self.layout.slots_per_rank
        b = self.layout.batch_size
        parts: list[IntArray] = []
        for r in range(self.layout.world_size):
            for k in range(w):
                n = len(range(k, min(steps, self.steps), w))
                parts.append(self.slot_rows[self.slot(r, k)][: n * b])
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


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
        raise PlanError(f"order='torch': permutation of {len(indices)} for {n} rows")
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
            f"{n} selected samples over {layout.world_size} rank(s) x batch_size "
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


@dataclass
class ReadPlan:
    """A leg plan in table rows: what each slot reads and emits, and which emits are real."""

    layout: Layout
    steps: int
    samples: int
    replays: int
    slot_rows: list[IntArray] = field(repr=False)
    slot_chunks: list[list[IntArray]] = field(repr=False)
    slot_emit_chunk: list[IntArray] = field(repr=False)
    # per slot, True where the emitted sample counts (False: padding of an exact pass)
    slot_valid: list[np.ndarray[Any, np.dtype[np.bool_]]] = field(repr=False)
    slot_ids: list[IntArray] = field(repr=False)  # plan ids (epoch positions) of the emits

    def slot(self, rank: int, worker: int) -> int:
        return rank * self.layout.slots_per_rank + worker

    def rank_batches(self, rank: int) -> list[IntArray]:
        """Rank ``rank``'s batches (table rows) in step order."""
        w, b = self.layout.slots_per_rank, self.layout.batch_size
        per = [self.slot_rows[self.slot(rank, k)] for k in range(w)]
        return [per[t % w][(t // w) * b : (t // w + 1) * b] for t in range(self.steps)]


def resolve(plan: LegPlan, epoch_map: IntArray | None) -> ReadPlan:
    """Turn a leg plan over epoch positions into table rows (``epoch_map[position] = row``)."""
    n = plan.pad_base

    def rows(ids: IntArray) -> IntArray:
        out = ids
        if n is not None and plan.pad_rows is not None and len(plan.pad_rows):
            out = np.where(ids < n, ids, plan.pad_rows[np.maximum(ids - n, 0)])
        return out if epoch_map is None else epoch_map[out]

    valid = [ids < n if n is not None else np.ones(len(ids), dtype=bool) for ids in plan.slot_rows]
    return ReadPlan(
        plan.layout,
        plan.steps,
        plan.samples,
        plan.replays,
        [rows(ids) for ids in plan.slot_rows],
        [[rows(c) for c in chunks] for chunks in plan.slot_chunks],
        plan.slot_emit_chunk,
        valid,
        plan.slot_rows,
    )


def selection_digest(keys: Sequence[str]) -> str:
    """A digest of a selection (its keys, order-independent)."""
    h = hashlib.sha256()
    for key in sorted(keys):
        data = key.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class Cursor:
    """A position in the sample stream: epoch, its finished legs and global steps consumed in
    the current leg. Loaders own one each (immutable: moving it makes a new one)."""

    epoch: int = 0
    legs: tuple[Leg, ...] = ()
    step: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "legs": [leg.to_json() for leg in self.legs],
            "step": self.step,
        }
