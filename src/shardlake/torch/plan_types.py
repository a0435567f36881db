"""What a plan is made of: the layout and parameters it is computed for, the rows it orders, a leg's
plan and its form in table rows (:class:`ReadPlan`), and the loader's cursor (resume).
"""

from __future__ import annotations

import hashlib
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
    "PLAN_SHAPES",
    "Cursor",
    "Layout",
    "Leg",
    "LegPlan",
    "PlanParams",
    "ReadPlan",
    "Rows",
    "resolve",
    "selection_digest",
    "IntArray",
    "MIN_RUN_SAMPLES",
    "SHUFFLE_RAMP",
]


DEFAULT_MAX_PAD_FRACTION = 0.1
DEFAULT_CHUNK_SIZE = 16
DEFAULT_INTERLEAVE = 32  # lanes of plan shape 2
DEFAULT_SHUFFLE_BUFFER = 512
PLAN_SHAPE = 3
PLAN_SHAPES = (1, 2, 3)  # what saved loader states may name
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
    # before plan shape 2, 16-sample chunks); 2 = `interleave` lanes of long runs; 3 (default)
    # = shape 2's runs and lanes, the runs ordered by a stateless permutation, so that a rank
    # plans its own slots only (plan_rank.py).
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
        if self.shape not in PLAN_SHAPES:
            raise PlanError(f"unknown plan shape {self.shape} (this shardlake knows 1, 2 and 3)")
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
    # slot -> rows in read order (the order chunks are fetched; same multiset as slot_rows);
    # this and slot_read_pos are empty in a plan made with reads=False (a loader's: unused)
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
    # per slot, one past each chunk's last emit (``slot_units.chunk_ends``; None: not computed,
    # as before :func:`~.compact.compact_plan`): a reader sets up each unit as it reaches it
    slot_chunk_ends: list[IntArray] | None = field(default=None, repr=False)

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
