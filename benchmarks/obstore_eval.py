"""obstore vs the fsspec client (s3fs, gcsfs, adlfs) as the store's read client, in one run.

For each loopback server (SeaweedFS for S3, fake-gcs-server for GCS, Azurite for Azure; moto
with ``--stores moto``), the same objects are read the way the loader reads them: 8 MiB ranged
GETs through ``Store.read_ranges(..., views=True)``, one range per call, from a pool of threads
(many GETs in flight). Printed per store and client: MB/s and this process's CPU seconds per GB
(SeaweedFS, fake-gcs-server and Azurite run as processes of their own; moto runs in a spawned
process), and the ratios obstore / fsspec. Issue #21's bar for obstore as the default read client
on a protocol: no more CPU per GB than the fsspec client (the store conformance suite passing).

    .venv/bin/python benchmarks/obstore_eval.py --objects 4 --mb 32 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shardlake.store import Store, open_store

MiB = 1 << 20
STORES = ("seaweedfs", "gcs", "azure", "moto")
FSSPEC_CLIENT = {"seaweedfs": "s3fs", "moto": "s3fs", "gcs": "gcsfs", "azure": "adlfs"}


@contextlib.contextmanager
def serve(kind: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(url, storage_options)`` of a fresh prefix on a loopback server of ``kind``."""
    if kind == "moto":  # a Python server: its own process, so its CPU is not the client's
        import s3path

        with s3path.spawned_moto("eval") as (url, opts, _pid):
            yield url, opts
        return
    from shardlake.testing.servers import start_store_server

    with start_store_server(kind) as server:
        yield server.url("eval"), dict(server.storage_options)


def _timed_reads(
    store: Store, spans: list[tuple[str, int, int]], threads: int
) -> tuple[float, float]:
    """Wall and process CPU seconds to read every span, one ``read_ranges`` call each."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        got = list(pool.map(lambda span: store.read_ranges([span], views=True)[0], spans))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if any(len(b) != e - s for b, (_, s, e) in zip(got, spans, strict=True)):
        raise RuntimeError("a ranged read came back short")
    return wall, cpu


def run_store(kind: str, objects: int, mb: int, rounds: int, threads: int) -> dict[str, Any]:
    size = mb * MiB
    with serve(kind) as (url, opts):
        writer = open_store(url, opts)
        names = [f"obj-{i}" for i in range(objects)]
        for name in names:
            writer.write(name, os.urandom(size))
        spans = [(n, s, min(size, s + 8 * MiB)) for n in names for s in range(0, size, 8 * MiB)]
        results: dict[str, Any] = {}
        for client in ("fsspec", "obstore"):
            store = open_store(url, {**opts, "read_client": client})
            _timed_reads(store, spans, threads)  # warm: connections, credentials, runtime
            walls, cpus = [], []
            for _ in range(rounds):
                wall, cpu = _timed_reads(store, spans, threads)
                walls.append(wall)
                cpus.append(cpu)
            gb = objects * size / 1e9
            name = FSSPEC_CLIENT[kind] if client == "fsspec" else client
            results[name] = {
                "mb_per_s": round(gb * 1e3 / min(walls), 1),
                "client_cpu_s_per_gb": round(min(cpus) / gb, 3),
            }
        fs_row, ob_row = results[FSSPEC_CLIENT[kind]], results["obstore"]
        ratios = {
            "throughput obstore / fsspec": round(ob_row["mb_per_s"] / fs_row["mb_per_s"], 2),
            "cpu per GB fsspec / obstore": round(
                fs_row["client_cpu_s_per_gb"] / ob_row["client_cpu_s_per_gb"], 2
            ),
        }
        return {"store": kind, "results": results, "ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--objects", type=int, default=4)
    ap.add_argument("--mb", type=int, default=32, help="MiB per object")
    ap.add_argument("--rounds", type=int, default=3, help="timed passes per client; best counts")
    ap.add_argument("--threads", type=int, default=12, help="reads in flight (the loader's 12)")
    ap.add_argument(
        "--stores", default="seaweedfs,gcs,azure", help=f"comma-separated, of {', '.join(STORES)}"
    )
    args = ap.parse_args(argv)
    kinds = [k for k in args.stores.split(",") if k]
    unknown = sorted(set(kinds) - set(STORES))
    if unknown:
        ap.error(f"unknown store(s) {', '.join(unknown)}: use {', '.join(STORES)}")
    print("# " + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]))
    print(f"# load average {os.getloadavg()}")
    for kind in kinds:
        row = run_store(kind, args.objects, args.mb, args.rounds, args.threads)
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
