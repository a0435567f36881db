"""Ray next to Dask and the thread-engine loader (issue #48), measured in one run.

1. verify and scrub of one version on Ray and on Dask (2 workers each, loopback), the same
   partitions, the same reports; the ratio Ray / Dask (goal <= 1.2).
2. ``shardlake.ray.read`` of a keyset against the thread-engine loader (``ShardDataset``) over the
   same selection, on local disk and on SeaweedFS; the ratio read / loader in samples/s
   (goal >= 0.5).

Each figure is the best of ``--rounds`` runs after one unmeasured warm-up (worker start-up,
imports and the page cache are paid there)::

    python benchmarks/ray_dask.py --samples 100000 --partitions 100 --neighbors 2

Small frames (``--neighbors 2``) keep generation and disk bounded at 100k samples; the passes
then measure per-sample and per-task overhead, which is where executors differ.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import shardlake


def best(rounds: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    fn()  # warm-up
    times, result = [], None
    for _ in range(rounds):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return min(times), result


def executors(root: shardlake.Root, src: Path, rounds: int, workers: int) -> dict[str, float]:
    import distributed
    import ray

    out: dict[str, float] = {}
    with distributed.LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
        host="127.0.0.1",
    ) as cluster:  # fmt: skip
        dask = str(cluster.scheduler_address).replace("tcp://", "dask://")
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        try:
            for name, spec in (("dask", dask), ("ray", "ray")):
                t_verify, report = best(
                    rounds, lambda s=spec: root.verify(str(src), executor=s, progress=False)
                )
                assert report.ok, report
                t_scrub, report = best(
                    rounds, lambda s=spec: root.scrub(executor=s, progress=False)
                )
                assert report.ok, report
                out[f"{name} verify s"] = round(t_verify, 2)
                out[f"{name} scrub s"] = round(t_scrub, 2)
                print(
                    json.dumps({"name": f"{name} passes", "verify_s": t_verify, "scrub_s": t_scrub})
                )
        finally:
            ray.shutdown()
    return out


def reads(url: str, opts: dict[str, Any], rounds: int, batch: int, label: str) -> dict[str, float]:
    import ray

    import shardlake.ray
    from shardlake.torch import ShardDataset

    root = shardlake.open(url, **opts)
    n = len(root.dataset().select(keyset="bench"))

    def via_ray() -> int:
        return sum(
            len(b["key"])
            for b in shardlake.ray.read(root, keyset="bench").iter_batches(
                batch_size=batch, batch_format="numpy"
            )
        )

    def via_loader() -> int:
        ds = ShardDataset(url, keyset="bench", batch_size=batch, engine="threads",
                          storage_options=opts or None, max_pad_fraction=0.5,
                          include_key=True)  # fmt: skip
        return sum(len(b["__key__"]) for b in ds.loader())

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        t_ray, got = best(rounds, via_ray)
        assert got == n, (got, n)
    finally:
        ray.shutdown()
    t_loader, _ = best(rounds, via_loader)
    row = {
        "name": f"{label} read",
        "samples": n,
        "ray_samples_per_s": round(n / t_ray, 1),
        "loader_samples_per_s": round(n / t_loader, 1),
        "ray / loader (goal >= 0.5)": round(t_loader / t_ray, 3),
    }
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--samples", type=int, default=2000, help="samples in all")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--neighbors", type=int, default=8, help="frame size (see tools/synth)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--s3", action="store_true", help="also read from SeaweedFS (loopback)")
    ap.add_argument("--work", default=None, help="working folder (default: a temporary one)")
    args = ap.parse_args(argv)
    print(f"# issue 48: python benchmarks/ray_dask.py {' '.join(argv or sys.argv[1:])}")
    from shardlake.tools.synth import synth_corpus

    work = Path(args.work or tempfile.mkdtemp(prefix="shardlake-ray-bench-"))
    src = work / "src"
    per = max(1, args.samples // args.partitions)
    if not src.exists():
        synth_corpus(src, args.partitions, per, seed=5, neighbors=args.neighbors)
    url = str(work / "root")
    root = shardlake.open(url)
    if not (work / "root").exists():
        root.pack(str(src), tag="v1", progress=False)
    if "bench" not in {k.name for k in root.keysets.list()}:
        keys = root.dataset("v1").keys()
        root.keysets.create("bench", version="v1", keys=keys[::10])  # a 10% selection
    ratios = executors(root, src, args.rounds, args.workers)
    ratios["ray / dask verify (goal <= 1.2)"] = round(
        ratios["ray verify s"] / ratios["dask verify s"], 3
    )
    ratios["ray / dask scrub (goal <= 1.2)"] = round(
        ratios["ray scrub s"] / ratios["dask scrub s"], 3
    )
    print(json.dumps({"name": "ratios (passes)", **ratios}), flush=True)
    reads(url, {}, args.rounds, args.batch_size, "local")
    if args.s3:
        from shardlake.testing.fixtures import new_location, shared_servers

        location = new_location("seaweedfs", "raybench", shared_servers())
        shardlake.open(url).export(location.url, dest_storage_options=location.storage_options,
                                   progress=False)  # fmt: skip
        reads(location.url, location.storage_options, args.rounds, args.batch_size, "seaweedfs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
