"""``shardlake bench pack``: packing throughput, per-frame stage costs and a calibrated cost model.

Sizing a conversion of a multi-million-frame corpus means answering "how long, with how many
workers?" before starting. This benchmark:

1. picks a few *calibration* partitions from the source, spread over its size range;
2. packs each one alone with one worker into a fresh scratch prefix of the target root (so
   nothing is reused and a remote root measures its real write path), timing each;
3. fits ``seconds = overhead + npz_bytes / rate`` (:mod:`shardlake.tools.bench.costmodel`);
4. optionally packs all calibration partitions together with ``--workers`` to measure parallel
   efficiency, and extrapolates to the whole corpus (the source itself, or the partition table
   of a bigger one from ``shardlake inspect --json``/``--out``).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import shardlake

from ...errors import UsageError
from ...progress.bar import Progress
from .costmodel import Calibration, CostModel, extrapolate, fit, load_partition_sizes
from .measure import MB, MemorySampler, machine_info, peak_rss_bytes, rate

__all__ = [
    "GOAL_VS_FLOOR",
    "GOAL_VS_WEBDATASET",
    "bench_pack",
    "stage_ceilings",
    "stage_costs",
]


def stage_costs(source: Path, files: list[Path], level: int = 3) -> dict[str, float]:
    """Per-frame milliseconds of each pack stage on one thread.

    ``read+sha256``, ``npz_inflate`` (the strict reader), ``safetensors_encode``, ``zstd`` and
    ``verify`` are shardlake's stages; ``np.load`` is the baseline's way of reading the same
    frame, for comparison with ``npz_inflate``.
    """
    import io

    import numpy as np

    from ...format.codec import Decoder, Encoder, encode_safetensors
    from ...pack.revisions import verify_sample
    from ...source.npz import load_npz

    encoder, decoder = Encoder(level), Decoder()
    names = ("read+sha256", "npz_inflate", "safetensors_encode", "zstd", "verify", "np.load")
    totals = dict.fromkeys(names, 0.0)
    for path in files:
        t0 = time.perf_counter()
        data = path.read_bytes()
        hashlib.sha256(data).hexdigest()
        t1 = time.perf_counter()
        arrays = load_npz(data, str(path))
        t2 = time.perf_counter()
        st = encode_safetensors(arrays)
        t3 = time.perf_counter()
        payload = encoder.compress(st)
        t4 = time.perf_counter()
        verify_sample(st, payload, arrays, decoder, str(path))
        t5 = time.perf_counter()
        with np.load(io.BytesIO(data)) as npz:
            {name: npz[name] for name in npz.files}
        t6 = time.perf_counter()
        steps = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)
        for name, dt in zip(names, steps, strict=True):
            totals[name] += dt
    n = max(1, len(files))
    return {name: round(1000 * value / n, 3) for name, value in totals.items()}


GOAL_VS_WEBDATASET = 2.0
GOAL_VS_FLOOR = 0.8


def stage_ceilings(costs: dict[str, float]) -> dict[str, float]:
    """Per-frame ms of the floor, of shardlake's stages and of the np.load baseline, and the
    best ratios these stage costs allow (no I/O wait, no per-partition overhead).

    floor = fastest inflate + safetensors encode + zstd; shardlake adds source hashing and the
    verification of every sample (a zstd decompression + memcmp); the webdataset baseline reads
    with ``np.load`` and encodes like shardlake.
    """
    floor = costs["npz_inflate"] + costs["safetensors_encode"] + costs["zstd"]
    ours = floor + costs["read+sha256"] + costs["verify"]
    baseline = costs["np.load"] + costs["safetensors_encode"] + costs["zstd"]
    return {
        "floor_ms": round(floor, 3),
        "shardlake_ms": round(ours, 3),
        "webdataset_ms": round(baseline, 3),
        "ceiling_vs_floor": round(floor / ours, 3) if ours else 0.0,
        "ceiling_vs_webdataset": round(baseline / ours, 3) if ours else 0.0,
    }


def pack_goals(costs: dict[str, float], samples_per_s_1_worker: float) -> dict[str, Any]:
    """Issue #14's pack goals as far as one machine without webdataset can measure them."""
    ceilings = stage_ceilings(costs)
    floor_rate = 1000.0 / ceilings["floor_ms"] if ceilings["floor_ms"] else 0.0
    return {
        **ceilings,
        "pack_vs_floor": round(samples_per_s_1_worker / floor_rate, 3) if floor_rate else None,
        "pack_vs_floor_goal": GOAL_VS_FLOOR,
        "ceiling_vs_webdataset_goal": GOAL_VS_WEBDATASET,
    }


def pick_calibration(partitions: list[Any], k: int) -> list[Any]:
    """``k`` partitions spread over the size range (smallest, largest and quantiles between)."""
    ordered = sorted(partitions, key=lambda p: (p.npz_bytes, p.path))
    if k >= len(ordered):
        return ordered
    if k == 1:
        return [ordered[len(ordered) // 2]]
    idx = sorted({round(i * (len(ordered) - 1) / (k - 1)) for i in range(k)})
    return [ordered[i] for i in idx]


def _join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


def bench_pack(
    source: str | None,
    *,
    root: str | None = None,
    calibrate: int = 3,
    workers: int = 2,
    parallel: bool = True,
    corpus: str | None = None,
    predict_workers: list[int] | None = None,
    synth_partitions: int = 3,
    synth_samples: int = 16,
    neighbors: int = 320,
    stage_frames: int = 10,
    storage_options: dict[str, Any] | None = None,
    keep: bool = False,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Run the pack benchmark; returns the JSON document ``shardlake bench pack`` prints.

    ``progress``: calibration packs on standard error (None: only on a terminal).
    """
    from ...pack import discover

    if calibrate < 1 or workers < 1:
        raise UsageError("--calibrate and --workers must be >= 1")
    if root is not None:  # it packs there: a read-only (HTTP) root is refused before any work
        from ...root import as_store

        as_store(root, storage_options, name="bench pack ROOT").require_writable("bench pack")
    # Read the corpus table first: a bad file should fail before minutes of calibration.
    corpus_sizes = load_partition_sizes(corpus) if corpus is not None else None
    scratch = Path(tempfile.mkdtemp(prefix="shardlake-bench-pack-"))
    mem = MemorySampler().start()  # the pack worker processes are children: they count
    try:
        src = (
            Path(source)
            if source is not None
            else _synth_source(scratch / "src", synth_partitions, synth_samples, neighbors)
        )
        tree = discover(src)
        tree.check_packable()
        parts = list(tree.partitions.values())
        chosen = pick_calibration(parts, calibrate)
        run_prefix = _join(root or str(scratch / "roots"), f"bench-{uuid.uuid4().hex[:12]}")
        points = _calibration_packs(src, chosen, run_prefix, storage_options, progress)
        model = fit(points)
        result: dict[str, Any] = {
            "benchmark": "pack",
            "machine": machine_info(),
            "source": str(src),
            "root": run_prefix,
            "calibration": _calibration_summary(points),
        }
        if parallel and workers > 1 and len(chosen) > 1:
            result["parallel"], model = _parallel_pack(
                src, chosen, run_prefix, workers, storage_options, points, model
            )
        result["cost_model"] = model.to_json()
        files = [src / f.npz for part in chosen for f in part.files][:stage_frames]
        stages = result["stage_ms_per_frame"] = stage_costs(src, files)
        result["goals"] = pack_goals(stages, result["calibration"]["samples_per_s_1_worker"] or 0.0)
        if corpus_sizes is not None:
            sizes, corpus_name = corpus_sizes, str(corpus)
        else:
            sizes = [{"npz_bytes": p.npz_bytes, "samples": p.samples} for p in parts]
            corpus_name = str(src)
        by_workers = sorted(set(predict_workers or [workers]))
        result["prediction"] = {
            "corpus": corpus_name,
            "by_workers": [extrapolate(model, sizes, w) for w in by_workers],
        }
        mem.stop()
        result.update(_memory_peaks(mem))
        if root is not None and not keep:
            _delete_run(run_prefix, storage_options)
        return result
    finally:
        mem.stop()
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)


def _synth_source(dest: Path, partitions: int, samples: int, neighbors: int) -> Path:
    """A synthetic source of unequal partition sizes, so the fit can tell per-partition
    overhead from rate."""
    from ..synth import synth_corpus

    counts = [max(1, samples * (i + 1) // partitions) for i in range(partitions)]
    synth_corpus(dest, partitions, counts, seed=0, neighbors=neighbors)
    return dest


def _calibration_packs(
    src: Path,
    chosen: list[Any],
    run_prefix: str,
    storage_options: dict[str, Any] | None,
    progress: bool | None,
) -> list[Calibration]:
    """Pack each chosen partition alone with one worker, timed (after an untimed warm-up)."""
    # Warm-up: the first pack in a process pays for worker start and imports; time none of it.
    shardlake.open(_join(run_prefix, "warmup"), **(storage_options or {})).pack(
        src, tag="bench", workers=1, path_list=[f.npz for f in chosen[0].files[:1]]
    )
    points: list[Calibration] = []
    bar = Progress(len(chosen), "bench pack", unit="calibration packs", enabled=progress)
    for i, part in enumerate(chosen):
        t0 = time.perf_counter()
        shardlake.open(_join(run_prefix, f"cal-{i}"), **(storage_options or {})).pack(
            src, tag="bench", workers=1, path_list=[f.npz for f in part.files]
        )
        points.append(
            Calibration(part.path, part.samples, part.npz_bytes, time.perf_counter() - t0)
        )
        bar.update()
    bar.close()
    return points


def _calibration_summary(points: list[Calibration]) -> dict[str, Any]:
    samples = sum(p.samples for p in points)
    nbytes = sum(p.npz_bytes for p in points)
    seconds = sum(p.seconds for p in points)
    return {
        "partitions": len(points),
        "samples": samples,
        "npz_mb": round(nbytes / MB, 3),
        "seconds": round(seconds, 3),
        "samples_per_s_1_worker": rate(samples, seconds),
        "mb_per_s_1_worker": rate(nbytes / MB, seconds),
    }


def _parallel_pack(
    src: Path,
    chosen: list[Any],
    run_prefix: str,
    workers: int,
    storage_options: dict[str, Any] | None,
    points: list[Calibration],
    model: CostModel,
) -> tuple[dict[str, Any], CostModel]:
    """The calibration partitions packed at once by ``workers``: the run's numbers, and the
    cost model with the parallel efficiency it measured."""
    cal_samples = sum(p.samples for p in points)
    cal_bytes = sum(p.npz_bytes for p in points)
    cal_seconds = sum(p.seconds for p in points)
    t0 = time.perf_counter()
    report = shardlake.open(_join(run_prefix, "parallel"), **(storage_options or {})).pack(
        src, tag="bench", workers=workers, path_list=[f.npz for part in chosen for f in part.files]
    )
    wall = time.perf_counter() - t0
    efficiency = min(1.0, cal_seconds / (workers * wall)) if wall > 0 else None
    model = CostModel(
        model.overhead_s, model.bytes_per_s, model.calibration, parallel_efficiency=efficiency
    )
    payload = sum(e.payload_bytes for e in report.record.entries)
    run = {
        "workers": workers,
        "seconds": round(wall, 3),
        "samples_per_s": rate(cal_samples, wall),
        "mb_per_s": rate(cal_bytes / MB, wall),
        "payload_mb_per_s": rate(payload / MB, wall),
        "speedup": round(cal_seconds / wall, 3) if wall > 0 else None,
        "efficiency": round(efficiency, 3) if efficiency is not None else None,
    }
    return run, model


def _memory_peaks(mem: MemorySampler) -> dict[str, float]:
    return {
        "peak_rss_mb": round(mem.peak_rss / MB, 1),  # whole process tree, sampled
        "peak_pss_mb": round(mem.peak_pss / MB, 1),
        # The kernel's exact peaks: this process, and the largest single finished child.
        "peak_rss_self_mb": round(peak_rss_bytes() / MB, 1),
        "peak_rss_largest_child_mb": round(peak_rss_bytes(children=True) / MB, 1),
    }


def _delete_run(run_prefix: str, storage_options: dict[str, Any] | None) -> None:
    from ...root import as_store

    store = as_store(run_prefix, storage_options, name="bench pack ROOT")
    for key in store.list(""):
        store.delete(key)
