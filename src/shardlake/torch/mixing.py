"""How well batches mix partitions: Jensen-Shannon distance to the selection's distribution.

For each batch, the distribution of its samples over partitions is compared with the
distribution of the whole selection over partitions. 0 means a batch looks like the selection;
1 (base-2 logarithms) means it shares no partition with it. A loader that streams one partition
at a time scores near 1; a perfect global shuffle scores what random sampling of ``batch_size``
samples does (small, but not 0, because a batch is a small sample).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "MixingReport",
    "batch_mixing",
    "js_distance",
    "plan_mixing",
]


def js_distance(
    p: Sequence[float] | np.ndarray[Any, Any], q: Sequence[float] | np.ndarray[Any, Any]
) -> float:
    """Jensen-Shannon distance (sqrt of the divergence, base 2, in [0, 1]) of two histograms."""
    a = np.asarray(p, dtype=np.float64)
    b = np.asarray(q, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError("js_distance needs two 1-d histograms of one length")
    if a.sum() <= 0 or b.sum() <= 0:
        raise ValueError("js_distance needs non-empty histograms")
    a = a / a.sum()
    b = b / b.sum()
    m = 0.5 * (a + b)

    def kl(x: np.ndarray[Any, Any]) -> float:
        nz = x > 0
        return float(np.sum(x[nz] * np.log2(x[nz] / m[nz])))

    return float(np.sqrt(max(0.0, 0.5 * kl(a) + 0.5 * kl(b))))


@dataclass(frozen=True)
class MixingReport:
    """Per-batch JS distances and their summary."""

    distances: list[float]
    partitions: int
    batches: int
    # samples per source in the planned batches (a mix; padding of an exact pass excluded)
    sources: dict[str, int] = field(default_factory=dict)

    @property
    def mean(self) -> float:
        return float(np.mean(self.distances)) if self.distances else 0.0

    @property
    def p95(self) -> float:
        return float(np.percentile(self.distances, 95)) if self.distances else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "partitions": self.partitions,
            "js_mean": round(self.mean, 4),
            "js_p95": round(self.p95, 4),
            "js_max": round(max(self.distances, default=0.0), 4),
            **({"sources": self.sources} if self.sources else {}),
        }


def batch_mixing(
    batches: Iterable[Sequence[int] | np.ndarray[Any, Any]],
    selection: Sequence[int] | np.ndarray[Any, Any],
) -> MixingReport:
    """JS distance of each batch's partition histogram to the selection's.

    ``selection`` is the partition index of every selected sample; each batch is the partition
    indices of its samples (e.g. ``partition_of[rows]`` for a plan's batches).
    """
    sel = np.asarray(selection, dtype=np.int64)
    k = int(sel.max(initial=-1)) + 1
    target = np.bincount(sel, minlength=k)
    out = []
    for batch in batches:
        hist = np.bincount(np.asarray(batch, dtype=np.int64), minlength=k)
        out.append(js_distance(hist, target))
    return MixingReport(out, int(np.count_nonzero(target)), len(out))


def plan_mixing(ds: Any, num_workers: int | None = None, rank: int | None = None) -> MixingReport:
    """The mixing of a :class:`~shardlake.torch.ShardDataset`'s current epoch (from its plan).

    Computed from the plan alone (no reads): every batch of ``rank`` (all ranks if ``None``).
    """
    layout = ds.layout(ds.num_workers if num_workers is None else num_workers)
    ranks = range(layout.world_size) if rank is None else [rank]
    plan = ds.plan(layout, all_ranks=list(ranks) != [ds.rank])
    part = ds.partition_of
    batches = [part[b] for r in ranks for b in plan.rank_batches(r)]
    report = batch_mixing(batches, part)
    names = [doc["name"] for doc in ds.source_records]
    counts = np.zeros(len(names), dtype=np.int64)
    for r in ranks:
        for k in range(layout.slots_per_rank):
            slot = plan.slot(r, k)
            rows = plan.slot_rows[slot][plan.slot_valid[slot]]
            counts += np.bincount(ds.source_of[rows], minlength=len(names))
    report.sources.update(zip(names, counts.tolist(), strict=True))
    return report
