"""A per-partition pack cost model: calibrate on a few partitions, extrapolate to a whole corpus.

Packing a partition costs a fixed overhead (open, manifest, publish of its revision) plus a part
proportional to its source bytes (inflate, encode, compress, verify). So the model is::

    seconds(partition) = overhead_s + npz_bytes / bytes_per_s

fitted by least squares on partitions packed one at a time (one worker, so timings don't share
cores). For a corpus (a list of partition sizes, e.g. from ``shardlake inspect --json``) the
serial cost is the sum; the wall time with W workers is the makespan of a longest-first schedule
(the largest partitions bound it: a 19 GB partition is a long tail no worker count removes),
divided by the measured parallel efficiency when one was measured.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ...errors import UsageError

__all__ = [
    "Calibration",
    "CostModel",
    "extrapolate",
    "fit",
    "load_partition_sizes",
    "makespan",
]


@dataclass(frozen=True)
class Calibration:
    """One partition packed alone: its size and how long it took."""

    partition: str
    samples: int
    npz_bytes: int
    seconds: float


@dataclass(frozen=True)
class CostModel:
    overhead_s: float
    bytes_per_s: float
    calibration: tuple[Calibration, ...]
    # Measured: serial seconds / (workers × wall) at the benchmark's --workers; applied to every
    # predicted worker count > 1 (measure on the conversion machine with its real worker count).
    parallel_efficiency: float | None = None

    def partition_seconds(self, npz_bytes: int) -> float:
        return self.overhead_s + npz_bytes / self.bytes_per_s

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["calibration"] = [asdict(c) for c in self.calibration]
        doc["mb_per_s"] = round(self.bytes_per_s / 1e6, 3)
        # How well the line explains the calibration points: the worst relative error.
        errs = [
            abs(self.partition_seconds(c.npz_bytes) - c.seconds) / c.seconds
            for c in self.calibration
            if c.seconds > 0
        ]
        doc["max_relative_fit_error"] = round(max(errs), 4) if errs else None
        return doc


def fit(points: Sequence[Calibration]) -> CostModel:
    """Least-squares line through (npz_bytes, seconds); a single size gives a zero-overhead line."""
    if not points:
        raise UsageError("the cost model needs at least one calibration partition")
    xs = [float(p.npz_bytes) for p in points]
    ys = [p.seconds for p in points]
    n = len(points)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0 or n < 2:
        # All partitions the same size: the overhead cannot be separated from the rate.
        slope, intercept = my / mx if mx else 0.0, 0.0
    else:
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
        intercept = my - slope * mx
        if intercept < 0 or slope <= 0:
            # Noise on tiny calibrations can tilt the line; fall back to a proportional model.
            slope, intercept = sum(ys) / sum(xs), 0.0
    if slope <= 0:
        raise UsageError("calibration partitions took no measurable time; calibrate on larger ones")
    return CostModel(overhead_s=intercept, bytes_per_s=1.0 / slope, calibration=tuple(points))


def makespan(durations: Sequence[float], workers: int) -> float:
    """Wall time of a longest-first greedy schedule of ``durations`` on ``workers`` workers."""
    if workers < 1:
        raise UsageError("workers must be >= 1")
    loads = [0.0] * min(workers, max(1, len(durations)))
    heapq.heapify(loads)
    for d in sorted(durations, reverse=True):
        heapq.heappush(loads, heapq.heappop(loads) + d)
    return max(loads) if durations else 0.0


def extrapolate(
    model: CostModel, partitions: Sequence[dict[str, Any]], workers: int
) -> dict[str, Any]:
    """Predict packing a corpus given as rows with ``npz_bytes`` (and ``samples``)."""
    durations = [model.partition_seconds(int(p["npz_bytes"])) for p in partitions]
    serial = sum(durations)
    wall = makespan(durations, workers)
    largest = max(durations) if durations else 0.0
    efficiency = model.parallel_efficiency if workers > 1 else None
    if efficiency:
        # Shared cores/disk/network slow every worker; no slowdown makes one partition faster
        # than it is alone, though, so the largest partition still bounds the wall from below.
        wall = max(wall / efficiency, largest)
    samples = sum(int(p.get("samples", 0)) for p in partitions)
    return {
        "partitions": len(partitions),
        "samples": samples,
        "npz_bytes": sum(int(p["npz_bytes"]) for p in partitions),
        "workers": workers,
        "serial_seconds": round(serial, 1),
        "predicted_wall_seconds": round(wall, 1),
        "predicted_wall_hours": round(wall / 3600, 3),
        "largest_partition_seconds": round(largest, 1),
        # When the largest partition dominates, more workers do not help: say so.
        "bound_by_largest_partition": bool(durations) and largest >= serial / workers,
        "applied_parallel_efficiency": efficiency,
    }


def load_partition_sizes(path: str | Path) -> list[dict[str, Any]]:
    """Partition rows from ``shardlake inspect --json`` output or a TSV with a header row
    containing ``npz_bytes`` (and ``samples``), e.g. ``shardlake inspect --out partitions.tsv``."""
    text = Path(path).read_text()
    if text.lstrip().startswith("{"):
        doc = json.loads(text)
        rows = doc.get("partitions")
        if not isinstance(rows, list):
            raise UsageError(f"{path}: JSON without a 'partitions' list")
        return rows
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    if not lines:
        raise UsageError(f"{path}: empty")
    header = lines[0].split("\t")
    if "npz_bytes" not in header:
        raise UsageError(f"{path}: no 'npz_bytes' column in the header ({', '.join(header)})")
    out = []
    for lineno, line in enumerate(lines[1:], start=2):
        cells = dict(zip(header, line.split("\t"), strict=False))
        try:
            out.append(
                {
                    "path": cells.get("path", ""),
                    "npz_bytes": int(cells["npz_bytes"]),
                    "samples": int(cells.get("samples", 0) or 0),
                }
            )
        except (KeyError, ValueError):
            raise UsageError(f"{path}:{lineno}: bad row {line!r}") from None
    return out
