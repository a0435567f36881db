"""obstore vs s3fs as the S3 client, against one loopback moto server, in one run.

Both clients fetch the same objects the way the loader does (8 MiB ranged GETs, many in flight)
and the way a bare whole-object copy does (``cat_file`` of whole objects in parallel). Printed per
client: MB/s and client CPU seconds per GB (this process only; the server runs in its own
process), and the ratios obstore / s3fs. The issue's bar for offering obstore: >= 1.5x on
throughput or on CPU per GB (and the store conformance suite passing).

    .venv/bin/python benchmarks/obstore_eval.py --objects 8 --mb 32
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from typing import Any

MiB = 1 << 20


def _serve(queue: Any, stop: Any) -> None:
    from shardlake.tools.loopback import moto_s3_server

    with moto_s3_server(set_env=False) as server:
        queue.put((server.endpoint_url, server.bucket, dict(server.storage_options)))
        stop.wait()


def _timed(fn: Callable[[], int]) -> tuple[float, float, int]:
    cpu0, t0 = time.process_time(), time.perf_counter()
    nbytes = fn()
    return time.perf_counter() - t0, time.process_time() - cpu0, nbytes


def _ranges(names: list[str], size: int, step: int) -> list[tuple[str, int, int]]:
    return [(n, s, min(size, s + step)) for n in names for s in range(0, size, step)]


def run(objects: int, mb: int, rounds: int) -> dict[str, Any]:
    import obstore
    import s3fs
    from obstore.store import S3Store

    ctx = mp.get_context("spawn")
    queue: Any = ctx.Queue()
    stop = ctx.Event()
    server = ctx.Process(target=_serve, args=(queue, stop), daemon=True)
    server.start()
    try:
        endpoint, bucket, opts = queue.get(timeout=60)
        fs = s3fs.S3FileSystem(**opts)
        size = mb * MiB
        blob = os.urandom(size)
        names = [f"obj-{i}" for i in range(objects)]
        for n in names:
            fs.pipe_file(f"{bucket}/{n}", blob)
        store = S3Store(
            bucket,
            endpoint=endpoint,
            access_key_id=opts["key"],
            secret_access_key=opts["secret"],
            region="us-east-1",
            client_options={"allow_http": True},
        )
        spans = _ranges(names, size, 8 * MiB)

        def s3fs_ranges() -> int:
            out = fs.cat_ranges(
                [f"{bucket}/{k}" for k, _, _ in spans],
                [s for _, s, _ in spans],
                [e for _, _, e in spans],
            )
            return sum(len(b) for b in out)

        def obstore_ranges() -> int:
            total = 0
            for n in names:  # one call per object, all its ranges concurrently
                mine = [(s, e) for k, s, e in spans if k == n]
                got = obstore.get_ranges(
                    store, n, starts=[s for s, _ in mine], ends=[e for _, e in mine]
                )
                total += sum(len(b) for b in got)
            return total

        def s3fs_whole() -> int:
            out = fs.cat([f"{bucket}/{n}" for n in names])
            return sum(len(b) for b in out.values())

        def obstore_whole() -> int:
            import concurrent.futures as cf

            with cf.ThreadPoolExecutor(8) as pool:
                got = pool.map(lambda n: obstore.get(store, n).bytes(), names)
                return sum(len(b) for b in got)

        cases = {
            "s3fs 8 MiB ranges": s3fs_ranges,
            "obstore 8 MiB ranges": obstore_ranges,
            "s3fs whole objects": s3fs_whole,
            "obstore whole objects": obstore_whole,
        }
        results: dict[str, Any] = {}
        for name, fn in cases.items():
            fn()  # warm: connections, credentials
            best: tuple[float, float, int] | None = None
            for _ in range(rounds):
                took = _timed(fn)
                if best is None or took[0] < best[0]:
                    best = took
            assert best is not None
            wall, cpu, nbytes = best
            results[name] = {
                "mb_per_s": round(nbytes / wall / 1e6, 1),
                "client_cpu_s_per_gb": round(cpu / (nbytes / 1e9), 3),
            }
        ratios = {}
        for shape in ("8 MiB ranges", "whole objects"):
            a, b = results[f"obstore {shape}"], results[f"s3fs {shape}"]
            ratios[f"{shape}: throughput obstore/s3fs"] = round(a["mb_per_s"] / b["mb_per_s"], 2)
            ratios[f"{shape}: cpu per GB s3fs/obstore"] = round(
                b["client_cpu_s_per_gb"] / a["client_cpu_s_per_gb"], 2
            )
        return {"objects": objects, "mb_each": mb, "results": results, "ratios": ratios}
    finally:
        stop.set()
        server.join(timeout=30)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--objects", type=int, default=8)
    ap.add_argument("--mb", type=int, default=32, help="MiB per object")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    print(json.dumps(run(args.objects, args.mb, args.rounds), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
