"""Mixing of a loader's batches, with the reference point a perfect global shuffle would reach."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["mixing_summary"]


def random_baseline(partition_of: Any, batch_size: int, seed: int = 0) -> dict[str, float]:
    """JS distances of batches drawn by a perfect global shuffle of the same selection.

    A batch is a small sample, so even ideal shuffling does not score 0; this is the floor a
    loader's ``js_mean`` should be compared with (and a one-partition-at-a-time stream is ~1).
    """
    from ...torch.mixing import batch_mixing

    part = np.asarray(partition_of, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(part))
    whole = len(order) // batch_size * batch_size
    batches = order[:whole].reshape(-1, batch_size) if whole else order[None, :]
    report = batch_mixing([part[b] for b in batches], part)
    return {"js_mean": round(report.mean, 4), "js_p95": round(report.p95, 4)}


def mixing_summary(
    ds: Any, *, num_workers: int, rank: int | None = None, epoch: int = 0
) -> dict[str, Any]:
    """The plan's mixing for ``epoch`` (no reads) next to the global-shuffle baseline."""
    from ...torch.mixing import plan_mixing

    ds.set_epoch(epoch)
    doc = plan_mixing(ds, num_workers=num_workers, rank=rank).to_json()
    doc["epoch"] = epoch
    doc["global_shuffle_baseline"] = random_baseline(ds.partition_of, ds.batch_size)
    return doc
