"""The loader's S3 read path, measured (issue #21); used by ``benchmarks/load.py --s3``.

* :func:`timed_epoch` - one loader epoch: wall rate, client CPU per sample (main process plus
  DataLoader workers, live or reaped; the server excluded), server CPU, GETs, bytes per GET,
  requests in flight over time, and how long the main process waited for batches.
* :func:`bare_obstore_fetch` - every shard object fetched with obstore, ``threads`` at a time,
  in a forked child (obstore's runtime must not start in this process: forked loader workers
  would then read through s3fs), plus serial ranged GETs timing the first byte.
* ``SHARDLAKE_BENCH_PROFILE=DIR`` - :func:`profiled` runs the epoch with every DataLoader worker
  under cProfile (thread CPU clock, main thread) and writes each worker's per-thread CPU (main
  thread, obstore's tokio threads, the reader's pool threads) next to the profile; the main
  process is profiled the same way. :func:`stage_report` sums them into stages.

Benchmark-only: nothing here is a switch of the production code.
"""

from __future__ import annotations

import contextlib
import cProfile
import json
import multiprocessing as mp
import os
import pstats
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from shardlake.store import Store
from shardlake.tools.bench.measure import CountingStore, process_tree_cpu_s

PROFILE_ENV = "SHARDLAKE_BENCH_PROFILE"


def load() -> float:
    return round(os.getloadavg()[0], 2)


def server_cpu_s(pid: int | None) -> float:
    import psutil

    if not pid:
        return 0.0
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


class TimedStore(CountingStore):
    """A :class:`CountingStore` whose lines also carry ``t0 t1`` (monotonic, shared by all
    processes) and the calling thread's CPU for the call: ``pid bytes t0 t1 thread_cpu``."""

    def _timed(self, call: Callable[[], list[Any]]) -> list[Any]:
        t0, c0 = time.monotonic(), time.thread_time()
        out = call()
        t1, c1 = time.monotonic(), time.thread_time()
        sizes = [len(b) for b in out if len(b)]
        cpu = (c1 - c0) / max(1, len(sizes))
        text = "".join(f"{os.getpid()} {n} {t0:.6f} {t1:.6f} {cpu:.6f}\n" for n in sizes)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        return out

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return self._timed(lambda: [Store.read_range(self, key, start, end)])[0]

    def read_ranges(
        self, ranges: Sequence[tuple[str, int, int]], *, views: bool = False
    ) -> list[Any]:
        return self._timed(lambda: Store.read_ranges(self, ranges, views=views))


def request_report(log: Path, t_start: float, t_end: float) -> dict[str, Any]:
    """GETs, their sizes and latencies, and the number in flight over the epoch's wall time."""
    rows = []
    if log.exists():
        for line in log.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 5:
                rows.append((int(parts[0]), int(parts[1]), float(parts[2]), float(parts[3]),
                             float(parts[4])))  # fmt: skip
    if not rows:
        return {"gets": 0}
    import numpy as np

    sizes = np.array([r[1] for r in rows], dtype=float)
    lat = np.array([r[3] - r[2] for r in rows])
    events = sorted([(r[2], 1) for r in rows] + [(r[3], -1) for r in rows])
    span = max(t_end - t_start, 1e-9)
    in_flight: dict[int, float] = {}
    level, last = 0, t_start
    for t, step in events:
        t = min(max(t, t_start), t_end)
        in_flight[level] = in_flight.get(level, 0.0) + (t - last)
        level, last = level + step, t
    in_flight[level] = in_flight.get(level, 0.0) + (t_end - last)
    mean_level = sum(k * v for k, v in in_flight.items()) / span
    # Seconds between the epoch's start and its first GET's start; after the last GET ends.
    first, final = min(r[2] for r in rows), max(r[3] for r in rows)
    return {
        "gets": len(rows),
        "mean_mb_per_get": round(float(sizes.mean()) / 1e6, 3),
        "p50_mb_per_get": round(float(np.median(sizes)) / 1e6, 3),
        "get_latency_ms_p50_p90_max": [
            round(float(x) * 1e3, 1) for x in np.percentile(lat, [50, 90, 100])
        ],  # fmt: skip
        "mean_in_flight": round(mean_level, 2),
        "share_of_wall_by_in_flight": {
            str(k): round(v / span, 3) for k, v in sorted(in_flight.items()) if v > 0
        },
        "no_get_in_flight_share": round(in_flight.get(0, 0.0) / span, 3),
        "first_get_after_s": round(first - t_start, 3),
        "after_last_get_s": round(t_end - final, 3),
        "fetch_mb_per_s_while_in_flight": round(
            float(sizes.sum()) / 1e6 / max(span * (1 - in_flight.get(0, 0.0) / span), 1e-9), 1
        ),
        "caller_thread_cpu_ms_per_get": round(float(np.mean([r[4] for r in rows])) * 1e3, 3),
    }


def timed_epoch(
    name: str,
    make_loader: Callable[[], Any],
    *,
    server_pid: int | None,
    log: Path | None,
    count: Callable[[Any], int],
    cores: int,
) -> dict[str, Any]:
    """One epoch of ``make_loader()`` (worker start included, as every epoch pays it)."""
    if log is not None:
        log.unlink(missing_ok=True)
    exclude = (server_pid,) if server_pid else ()
    load0 = load()
    cpu0, srv0 = process_tree_cpu_s(live=True, exclude=exclude), server_cpu_s(server_pid)
    self0 = time.process_time()
    t0 = time.monotonic()
    n, wait, first = 0, 0.0, None
    it = iter(make_loader())
    while True:
        tw = time.monotonic()
        try:
            batch = next(it)
        except StopIteration:
            break
        wait += time.monotonic() - tw
        first = first if first is not None else time.monotonic() - t0
        n += count(batch)
    del it
    t1 = time.monotonic()
    wall = t1 - t0
    main_cpu = time.process_time() - self0
    cpu = process_tree_cpu_s(live=True, exclude=exclude) - cpu0
    srv = server_cpu_s(server_pid) - srv0
    row: dict[str, Any] = {
        "name": name,
        "load_avg": [load0, load()],
        "samples": n,
        "seconds": round(wall, 3),
        "samples_per_s": round(n / wall, 1),
        "ttfb_s": round(first or 0.0, 3),
        "client_cpu_ms_per_sample": round(cpu / max(1, n) * 1e3, 3),
        "main_cpu_ms_per_sample": round(main_cpu / max(1, n) * 1e3, 3),
        "workers_cpu_ms_per_sample": round((cpu - main_cpu) / max(1, n) * 1e3, 3),
        "main_waiting_share": round(wait / wall, 3),
        # Core-seconds nobody used (client, server), per second of the epoch's wall time.
        "idle_cores": round(max(0.0, cores - (cpu + srv) / wall), 2),
    }
    if server_pid:
        row["server_cpu_ms_per_sample"] = round(srv / max(1, n) * 1e3, 3)
    if log is not None:
        row.update(request_report(log, t0, t1))
    return row


# --- moto in a process of its own ------------------------------------------------------------


def _serve_moto(queue: Any, stop: Any, prefix: str) -> None:
    from shardlake.tools.loopback import moto_s3_server

    with moto_s3_server(set_env=False) as server:
        queue.put((server.url(prefix), dict(server.storage_options)))
        stop.wait()


@contextlib.contextmanager
def spawned_moto(prefix: str) -> Iterator[tuple[str, dict[str, Any], int | None]]:
    """``(url, storage_options, pid)`` of moto's S3 in a spawned process: in the benchmark's
    own process it would compete for the GIL and its CPU would count as the client's."""
    ctx = mp.get_context("spawn")
    queue: Any = ctx.Queue()
    stop = ctx.Event()
    proc = ctx.Process(target=_serve_moto, args=(queue, stop, prefix), daemon=True)
    proc.start()
    try:
        url, opts = queue.get(timeout=60)
        yield url, opts, proc.pid
    finally:
        stop.set()
        proc.join(timeout=30)


# --- bare obstore fetch (forked child) ---------------------------------------------------------


def _bare_child(conn: Any, opts: dict[str, Any], paths: list[str], threads: int,
                probe_bytes: int) -> None:  # fmt: skip
    from concurrent.futures import ThreadPoolExecutor

    import obstore

    from shardlake.store.backends.obstore import ObstoreReads, obstore_config

    reads = ObstoreReads("s3", obstore_config("s3", opts) or {})

    def get(path: str) -> int:
        bucket, _, key = path.partition("/")
        return len(obstore.get(reads._store(bucket), key).bytes())

    get(paths[0])  # the client and its connection, outside the timing
    c0, t0 = time.process_time(), time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(get, paths))
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    # Time to first byte: serial ranged GETs of the loader's mean request size.
    ttfb, whole = [], []
    for i in range(12):
        bucket, _, key = paths[i % len(paths)].partition("/")
        store = reads._store(bucket)
        size = obstore.head(store, key)["size"]
        end = min(size, probe_bytes)
        t = time.monotonic()
        result = obstore.get(store, key, options={"range": (0, end)})
        stream = iter(result.stream(min_chunk_size=1))
        next(stream)
        ttfb.append(time.monotonic() - t)
        for _chunk in stream:
            pass
        whole.append(time.monotonic() - t)
    conn.send({"bytes": total, "wall": wall, "cpu": cpu, "ttfb": ttfb, "whole": whole})
    conn.close()


def bare_obstore_fetch(
    url_opts: tuple[str, dict[str, Any]],
    store: Store,
    keys: list[str],
    *,
    threads: int,
    server_pid: int | None,
    comp_mb_per_sample: float,
    probe_bytes: int,
) -> dict[str, Any]:
    """Every object of ``keys`` fetched whole with obstore, ``threads`` at a time (a child
    process)."""
    import statistics

    _url, opts = url_opts
    paths = [_path(store, k) for k in keys]
    # Spawned, not forked: with the thread engine this process has already read through
    # obstore, and a forked child's copy of obstore's runtime hangs on its first request.
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    load0, srv0 = load(), server_cpu_s(server_pid)
    proc = ctx.Process(target=_bare_child, args=(child, opts, paths, threads, probe_bytes))
    proc.start()
    child.close()  # only the child writes: its death is then an EOF here, not a hang
    try:
        got = parent.recv()
    except EOFError:
        proc.join(timeout=60)
        raise RuntimeError(f"the bare-fetch child died (exit code {proc.exitcode})") from None
    proc.join(timeout=60)
    srv = server_cpu_s(server_pid) - srv0
    gb = got["bytes"] / 1e9
    mbps = got["bytes"] / got["wall"] / 1e6
    return {
        "name": f"bare obstore GET of every shard ({threads} in flight)",
        "load_avg": [load0, load()],
        "objects": len(paths),
        "mean_mb_per_get": round(got["bytes"] / len(paths) / 1e6, 2),
        "fetched_mb_per_s": round(mbps, 1),
        "samples_per_s_equivalent": round(mbps / comp_mb_per_sample, 1),
        "client_cpu_s_per_gb": round(got["cpu"] / gb, 3),
        "server_cpu_s_per_gb": round(srv / gb, 3),
        "ttfb_ms_median": round(statistics.median(got["ttfb"]) * 1e3, 2),
        "probe_get_mb": round(probe_bytes / 1e6, 2),
        "probe_get_ms_median": round(statistics.median(got["whole"]) * 1e3, 2),
    }


def _path(store: Store, key: str) -> str:
    """``bucket/prefix/key`` of a store key (what obstore's ``bucket/key`` split needs)."""
    url = store.key_url(key)
    return url.split("://", 1)[1]


# --- profiles --------------------------------------------------------------------------------


def _thread_cpu() -> dict[str, Any]:
    """This process's CPU by thread kind, from /proc (clock ticks -> s)."""
    tick = os.sysconf("SC_CLK_TCK")
    pid = os.getpid()

    def ticks(stat: str) -> float:
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    with open(f"/proc/{pid}/stat") as fh:
        total = ticks(fh.read())
    kinds: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                cpu = ticks(fh.read())
            with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                comm = fh.read().strip()
        except OSError:
            continue
        kind = "main" if int(tid) == pid else ("tokio" if comm.startswith("tokio") else "other")
        kinds[kind] = kinds.get(kind, 0.0) + cpu
    # Threads that already ended (the reader's pool threads) count in the process total only.
    kinds["ended_or_other_threads"] = total - kinds.get("main", 0.0) - kinds.get("tokio", 0.0)
    kinds.pop("other", None)
    return {"total": total, **kinds}


@contextlib.contextmanager
def profiled(out: Path) -> Iterator[None]:
    """Profile the loader's workers and this process's main thread while inside."""
    import torch.utils.data._utils.worker as worker_mod

    out.mkdir(parents=True, exist_ok=True)
    original = worker_mod._worker_loop

    def worker_loop(*args: Any, **kwargs: Any) -> Any:
        prof = cProfile.Profile(time.thread_time)
        prof.enable()
        try:
            return original(*args, **kwargs)
        finally:
            prof.disable()
            prof.dump_stats(str(out / f"worker-{os.getpid()}.prof"))
            (out / f"worker-{os.getpid()}.json").write_text(json.dumps(_thread_cpu()))

    worker_mod._worker_loop = worker_loop  # type: ignore[assignment]
    main = cProfile.Profile(time.thread_time)
    main.enable()
    try:
        yield
    finally:
        main.disable()
        worker_mod._worker_loop = original  # type: ignore[assignment]
        main.dump_stats(str(out / "main.prof"))
    threading.Event().wait(0.2)  # let the workers' files land


STAGES = (
    ("zstd decompress", lambda f, n: "decompress" in n),
    ("crc32", lambda f, n: "crc32" in n),
    (
        "handoff (pickle, queues, shared memory, fds)",
        lambda f, n: (
            any(
                s in f
                for s in (
                    "multiprocessing",
                    "torch/multiprocessing",
                    "pickle",
                    "reduction",
                    "/_utils/worker.py",
                    "/_utils/fetch.py",
                    "dataloader.py",
                    "socket",
                )
            )
            or any(
                s in n
                for s in (
                    "dump",
                    "loads",
                    "recv",
                    "send",
                    "_new_shared",
                    "share_memory",
                    "_share_filename",
                    "_share_fd",
                    "poll",
                    "select",
                )
            )
        ),
    ),  # fmt: skip
    (
        "decode + copy into batch (safetensors, collate)",
        lambda f, n: (
            any(s in f for s in ("format/codec", "torch/collate", "torch/strings", "numpy"))
            or any(
                s in n
                for s in (
                    "frombuffer",
                    "copyto",
                    "memoryview",
                    "'copy'",
                    "from_numpy",
                    "empty",
                    "zeros",
                    "view",
                    "decode",
                    "_rebuild",
                )
            )
        ),
    ),  # fmt: skip
    (
        "request (reader, store, futures)",
        lambda f, n: (
            any(
                s in f
                for s in (
                    "torch/reader",
                    "shardlake/store",
                    "concurrent/futures",
                    "threading",
                    "s3path.py",
                    "obstore",
                )
            )
            or any(s in n for s in ("acquire", "get_ranges", "wait"))
        ),
    ),  # fmt: skip
)


def _bucket(stats: pstats.Stats) -> tuple[dict[str, float], list[tuple[str, float]]]:
    out: dict[str, float] = {}
    top: list[tuple[str, float]] = []
    for (filename, line, name), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        label = "other"
        for stage, match in STAGES:
            if match(filename, name):
                label = stage
                break
        out[label] = out.get(label, 0.0) + tt
        top.append((f"{Path(filename).name}:{line}:{name}", tt))
    top.sort(key=lambda x: -x[1])
    return out, top[:14]


def stage_report(out: Path, samples: int) -> dict[str, Any]:
    """CPU ms per sample by stage: workers (main thread by profile, scaled to its /proc CPU;
    tokio and pool threads from /proc) and the main process (its main thread's profile)."""
    per = 1e3 / max(1, samples)
    workers: dict[str, float] = {}
    top: dict[str, float] = {}
    threads: dict[str, float] = {}
    for prof in sorted(out.glob("worker-*.prof")):
        stats = pstats.Stats(str(prof))
        buckets, tops = _bucket(stats)
        cpu = json.loads(prof.with_suffix(".json").read_text())
        profiled_s = sum(buckets.values()) or 1e-9
        scale = cpu.get("main", profiled_s) / profiled_s  # profiler overhead taken out
        for k, v in buckets.items():
            workers[f"main thread: {k}"] = workers.get(f"main thread: {k}", 0.0) + v * scale
        for k, v in cpu.items():
            if k not in ("total", "main"):
                threads[k] = threads.get(k, 0.0) + v
        for k, v in tops:
            top[k] = top.get(k, 0.0) + v * scale
    workers.update({f"{k} threads" if "threads" not in k else k: v for k, v in threads.items()})
    main_stats = pstats.Stats(str(out / "main.prof"))
    main_buckets, main_top = _bucket(main_stats)
    return {
        "workers_cpu_ms_per_sample": {
            k: round(v * per, 3) for k, v in sorted(workers.items(), key=lambda x: -x[1])
        },  # fmt: skip
        "workers_top_functions_ms_per_sample": {
            k: round(v * per, 3) for k, v in sorted(top.items(), key=lambda x: -x[1])[:14]
        },
        "main_cpu_ms_per_sample": {
            k: round(v * per, 3) for k, v in sorted(main_buckets.items(), key=lambda x: -x[1])
        },  # fmt: skip
        "main_top_functions_ms_per_sample": {k: round(v * per, 3) for k, v in main_top},
    }
