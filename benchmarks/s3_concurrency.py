"""How SeaweedFS on loopback serves concurrent ranged GETs, and what obstore costs per GB.

Two measurements behind docs/performance.md ("S3 read path: phase 3"), one SeaweedFS server:

* ``order``: ``--gets`` ranged GETs of ``--mb`` MiB each, all started at once (plain
  ``http.client``, one connection each, so no client library is involved): when each one's
  first byte and last byte arrive. A server that serves concurrent GETs side by side gives
  similar first-byte times; one that serves them roughly in turn gives first bytes spread
  over the whole transfer.
* ``cpu``: obstore ``get_ranges`` of 8 MiB ranges, 4 and 16 in flight, with and without a
  ``bytes()`` copy of each result, and obstore streams of the same ranges copied into one
  buffer: MB/s and this process's CPU seconds per GB (the server excluded).

    .venv/bin/python benchmarks/s3_concurrency.py --gets 24 --mb 6
"""

from __future__ import annotations

import argparse
import http.client
import resource
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

MiB = 1 << 20


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def arrival_order(endpoint: str, paths: list[str], size: int) -> list[tuple[float, float]]:
    """(first byte, last byte) seconds after the start, per GET, sorted."""
    url = urllib.parse.urlparse(endpoint)
    t0 = time.monotonic()

    def get(i: int) -> tuple[float, float]:
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port)
        start = (i // len(paths)) * size
        rng = f"bytes={start}-{start + size - 1}"
        conn.request("GET", "/" + paths[i % len(paths)], headers={"Range": rng})
        resp = conn.getresponse()
        buf = bytearray(512 * 1024)
        first = None
        while resp.readinto(buf):
            first = first if first is not None else time.monotonic() - t0
        conn.close()
        return round(first or 0.0, 3), round(time.monotonic() - t0, 3)

    n = len(paths) * 4
    with ThreadPoolExecutor(n) as pool:
        return sorted(pool.map(get, range(n)))


def client_cpu(store: Any, keys: list[str]) -> list[dict[str, Any]]:
    import obstore

    size = 8 * MiB

    def ranges(i: int, copy: bool) -> int:
        start = (i * size) % (24 * MiB)
        got = obstore.get_ranges(store, keys[i % len(keys)], starts=[start], ends=[start + size])
        return len(bytes(got[0])) if copy else len(got[0])

    def stream(i: int) -> int:
        start = (i * size) % (24 * MiB)
        got = obstore.get(store, keys[i % len(keys)], options={"range": (start, start + size)})
        view, pos = memoryview(bytearray(size)), 0
        for piece in got.stream(min_chunk_size=512 * 1024):
            view[pos : pos + len(piece)] = piece
            pos += len(piece)
        return pos

    cases: list[tuple[str, Callable[[int], int]]] = [
        ("get_ranges", lambda i: ranges(i, False)),
        ("get_ranges + bytes()", lambda i: ranges(i, True)),
        ("stream into a buffer", stream),
    ]
    out = []
    for name, fn in cases:
        for inflight in (4, 16):
            with ThreadPoolExecutor(inflight) as pool:
                list(pool.map(fn, range(8)))  # warm connections
                c0, t0 = _cpu(), time.perf_counter()
                total = sum(pool.map(fn, range(48)))
                seconds, cpu = time.perf_counter() - t0, _cpu() - c0
            out.append(
                {
                    "client": name,
                    "in_flight": inflight,
                    "mb_per_s": round(total / seconds / 1e6),
                    "client_cpu_s_per_gb": round(cpu / (total / 1e9), 3),
                }
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gets", type=int, default=24, help="concurrent GETs (a multiple of 6)")
    ap.add_argument("--mb", type=int, default=6, help="MiB per GET")
    args = ap.parse_args()
    from obstore.store import S3Store

    from shardlake.testing.seaweedfs import seaweedfs_server

    with seaweedfs_server() as s3:
        options = s3.storage_options
        endpoint = options.get("endpoint_url") or options["client_kwargs"]["endpoint_url"]
        store = S3Store(
            s3.bucket,
            endpoint=endpoint,
            client_options={"allow_http": True},
            access_key_id="x",
            secret_access_key="y",
            region="us-east-1",
        )
        import obstore

        keys = [f"bench/o{i}" for i in range(max(1, args.gets // 4))]
        for key in keys:
            obstore.put(store, key, bytes(max(4 * args.mb, 32) * MiB))
        order = arrival_order(endpoint, [f"{s3.bucket}/{k}" for k in keys], args.mb * MiB)
        print(f"# {args.gets} concurrent {args.mb} MiB GETs, (first byte, last byte) s, sorted:")
        print(order)
        for row in client_cpu(store, keys):
            print(row)


if __name__ == "__main__":
    main()
