"""Pack throughput: shardlake ``pack`` vs webdataset's ``ShardWriter`` on the same corpus.

Both sides start from the same synthetic npz corpus, use the same number of worker processes
(one task per partition) and produce the same encoded members (safetensors + zstd, same level).
shardlake additionally hashes every source file, verifies every sample bit-exactly, writes
parquet manifests and publishes a version; webdataset just writes tar files.

    .venv/bin/python benchmarks/pack.py --partitions 4 --samples 50 --workers 2

Prints per-frame stage costs, samples/s and MB/s for both, and the ratios.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from shardlake.tools.bench.pack import stage_costs


def _wds_partition(args: tuple[str, list[str], str, int, int]) -> tuple[int, int]:
    """Baseline worker: read npz, encode like shardlake, write with webdataset.ShardWriter."""
    import webdataset as wds

    from shardlake.format.codec import Encoder
    from shardlake.format.layout import escape_member_key
    from shardlake.pack.build import load_npz

    root, keys, out_dir, level, shard_size = args
    encoder = Encoder(level)
    samples = payload = 0
    pattern = os.path.join(out_dir, "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxsize=shard_size, verbose=0) as sink:
        for key in keys:
            data = Path(root, key + ".npz").read_bytes()
            arrays = load_npz(data, key)
            _, blob = encoder.encode(arrays, key)
            sink.write({"__key__": escape_member_key(key), "safetensors.zst": blob})
            samples += 1
            payload += len(blob)
    return samples, payload


def run_webdataset(
    src: Path, out: Path, workers: int, level: int, shard_size: int
) -> tuple[float, int, int]:
    parts: dict[str, list[str]] = {}
    for path in sorted(src.rglob("*.npz")):
        rel = path.relative_to(src).as_posix()[: -len(".npz")]
        parts.setdefault(rel.split("/")[0], []).append(rel)
    tasks = []
    for name, keys in parts.items():
        (out / name).mkdir(parents=True, exist_ok=True)
        tasks.append((str(src), keys, str(out / name), level, shard_size))
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["shardlake.pack.build", "webdataset"])
    start = time.perf_counter()
    with cf.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        results = list(pool.map(_wds_partition, tasks))
    seconds = time.perf_counter() - start
    return seconds, sum(r[0] for r in results), sum(r[1] for r in results)


def run_shardlake(
    src: Path, root: Path, workers: int, level: int, shard_size: int
) -> tuple[float, Any]:
    from shardlake.pack import pack_with_report

    start = time.perf_counter()
    report = pack_with_report(
        src, str(root), tag="bench", workers=workers, level=level, shard_size=shard_size
    )
    return time.perf_counter() - start, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--samples", type=int, default=50, help="frames per partition")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--neighbors", type=int, default=320, help="N (real frames: 320)")
    parser.add_argument("--level", type=int, default=3)
    parser.add_argument("--shard-size", type=int, default=1 << 30)
    parser.add_argument("--repeat", type=int, default=1, help="alternate the two runs this often")
    parser.add_argument("--workdir", help="where to put corpus and outputs (default: a temp dir)")
    args = parser.parse_args(argv)

    from shardlake.tools.synth import synth_corpus

    work = Path(args.workdir or tempfile.mkdtemp(prefix="shardlake-bench-"))
    src = work / "src"
    if not src.exists():
        t = time.perf_counter()
        synth_corpus(src, args.partitions, args.samples, seed=0, neighbors=args.neighbors)
        print(f"synth: {args.partitions * args.samples} frames in {time.perf_counter() - t:.1f}s")
    npz_bytes = sum(p.stat().st_size for p in src.rglob("*.npz"))
    total = args.partitions * args.samples
    print(
        f"corpus: {total} frames, {npz_bytes / total / 1e3:.0f} KB npz/frame, workers={args.workers}"
    )
    costs = stage_costs(src, sorted(src.rglob("*.npz"))[:20], args.level)
    print("per-frame ms (1 thread): " + ", ".join(f"{k} {v:.2f}" for k, v in costs.items()))

    best: dict[str, float] = {}
    payload = 0
    for rep in range(args.repeat):
        for name in ("webdataset", "shardlake"):
            out = work / f"out-{name}-{rep}"
            shutil.rmtree(out, ignore_errors=True)
            if name == "webdataset":
                seconds, samples, payload = run_webdataset(
                    src, out, args.workers, args.level, args.shard_size
                )
            else:
                seconds, report = run_shardlake(src, out, args.workers, args.level, args.shard_size)
                samples = report.version.samples
                payload = sum(int(p["payload_bytes"]) for p in report.version.partitions)
            if samples != total:
                print(f"{name}: wrote {samples} of {total} samples", file=sys.stderr)
                return 1
            best[name] = min(best.get(name, float("inf")), seconds)
            shutil.rmtree(out, ignore_errors=True)
    for name, seconds in best.items():
        print(
            f"{name:>10}: {seconds:6.2f}s  {total / seconds:8.1f} samples/s  "
            f"{npz_bytes / seconds / 1e6:7.1f} MB/s npz in  {payload / seconds / 1e6:7.1f} MB/s payload out"
        )
    ratio = best["webdataset"] / best["shardlake"]
    print(
        f"shardlake / webdataset throughput: {ratio:.2f}x (goal >= 0.9x, shardlake verifies every sample)"
    )
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
