"""Plan-level mixing of plan shape 1 against plan shape 2, from plans alone (no reads).

For each corpus shape (partitions x samples, one shard per partition), the mean over 6 epochs
of the per-batch Jensen-Shannon distance to the selection (``shardlake mixing``'s figure),
batch 32, one rank with 2 DataLoader workers; shape 1 with its 16-sample chunks in groups of
16, shape 2 with 30-sample runs (8 MiB of ~280 KB frames) in 32 lanes::

    .venv/bin/python benchmarks/plan_mixing.py
"""

from __future__ import annotations

import numpy as np

from shardlake.torch.mixing import batch_mixing
from shardlake.torch.plan import plan_leg
from shardlake.torch.plan_types import Layout, PlanParams, Rows


def corpus(counts: list[int]) -> tuple[Rows, np.ndarray]:
    """Rows of partitions with ``counts`` samples (one shard each), and each row's partition."""
    shard = np.repeat(np.arange(len(counts)), counts)
    offset = np.concatenate([512 + 1024 * np.arange(n) for n in counts])
    return Rows(shard.astype(np.int64), offset.astype(np.int64)), shard


def mixing(counts: list[int], shape: int, chunk: int, lanes: int, epochs: int = 6) -> float:
    rows, part = corpus(counts)
    params = PlanParams(
        version_hash="v" * 32,
        selection_digest="s" * 32,
        seed=7,
        shape=shape,
        chunk_size=chunk,
        interleave=lanes,
    )
    layout = Layout(1, 2, 32)
    out = []
    for epoch in range(epochs):
        plan = plan_leg(rows, params, epoch, layout)
        out.append(batch_mixing([part[b] for b in plan.rank_batches(0)], part).mean)
    return float(np.mean(out))


def main() -> None:
    pareto = [int(x) for x in np.maximum(10, np.random.default_rng(0).pareto(1.5, 50) * 100)]
    cases = {
        "6 x 171": [171] * 6,
        "60 x 200": [200] * 60,
        "300 x 400": [400] * 300,
        "1,000 x 100": [100] * 1000,
        "50, Pareto sizes": pareto,
    }
    print("| partitions x samples | shape 1 | shape 2 |")
    print("|---|---|---|")
    for name, counts in cases.items():
        one, two = mixing(counts, 1, 16, 16), mixing(counts, 2, 30, 32)
        print(f"| {name} | {one:.3f} | {two:.3f} |", flush=True)


if __name__ == "__main__":
    main()
