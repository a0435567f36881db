"""The loader over a root served by plain HTTP (issue #33), next to the same root on disk.

Synthesises a small corpus, packs it, exports it to a folder (what one would put on a web
server) and serves that folder on loopback twice, from a child process each: once honouring
``Range`` and once ignoring it (200 with the whole object, as some servers and proxies do).
Then one epoch of ``bench load`` per location, one JSON line each (samples/s, payload MB/s,
time to first batch, requests, bytes fetched), and the ratios to disk::

    python benchmarks/http_load.py --partitions 4 --samples 240

The loopback server is Python's ``http.server`` (``shardlake.testing.http_server``), which
shares the machine's cores with the loader: the figures bound the client's overhead from
below, not what nginx or a CDN would serve.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import shardlake
from shardlake.tools.bench.load import bench_load
from shardlake.tools.synth import synth_corpus

_SERVE = """
import sys, time
from shardlake.testing.http_server import static_http_server
with static_http_server(sys.argv[1], ranges=sys.argv[2] == "range") as server:
    print(server.url, flush=True)
    sys.stdin.read()  # until the parent closes our stdin
"""
FIELDS = (
    "samples",
    "samples_per_s",
    "epoch_samples_per_s",
    "payload_mb_per_s",
    "time_to_first_batch_s",
    "requests",
)


def _serve(folder: Path, ranges: bool) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(folder), "range" if ranges else "no-range"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--samples", type=int, default=240, help="samples in all")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--work", default=None, help="working folder (default: a temporary one)")
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="shardlake-http-bench-"))
    per = max(1, args.samples // args.partitions)
    print(f"# issue 33: python benchmarks/http_load.py {' '.join(argv or sys.argv[1:])}")
    synth_corpus(work / "src", args.partitions, per, seed=3, neighbors=8)
    root = shardlake.open(str(work / "root"))
    root.pack(str(work / "src"), tag="v1")
    root.export(str(work / "www"), progress=False)
    results: dict[str, dict[str, float]] = {}
    servers = [_serve(work / "www", ranges) for ranges in (True, False)]
    try:
        locations = {
            "disk": str(work / "www"),
            "http (Range)": servers[0][1],
            "http (Range ignored)": servers[1][1],
        }
        # One unmeasured pass: imports, the first worker start and the page cache are paid here.
        bench_load(
            locations["disk"], batch_size=args.batch_size, num_workers=args.num_workers,
            max_pad_fraction=0.5, progress=False,
        )  # fmt: skip
        for name, url in locations.items():
            started = time.perf_counter()
            doc = bench_load(
                url,
                batch_size=args.batch_size,
                num_workers=args.num_workers,
                max_pad_fraction=0.5,
                progress=False,
            )
            row = {"name": name, **{k: doc.get(k) for k in FIELDS}}
            row["wall_s"] = round(time.perf_counter() - started, 2)
            results[name] = row
            print(json.dumps(row), flush=True)
    finally:
        for proc, _ in servers:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=30)
    disk = results["disk"]["samples_per_s"] or 1.0
    ratios = {
        f"{name} / disk": round((row["samples_per_s"] or 0) / disk, 3)
        for name, row in results.items()
        if name != "disk"
    }
    print(json.dumps({"name": "ratios (samples/s)", **ratios}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
