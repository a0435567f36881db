"""Measurement helpers shared by ``shardlake bench`` and ``benchmarks/*.py``: clocks, RSS, rates."""

from __future__ import annotations

import os
import platform
import resource
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from ...store import Store

__all__ = [
    "MB",
    "CountingStore",
    "MemorySampler",
    "decode_cpu_s_per_sample",
    "machine_info",
    "peak_rss_bytes",
    "process_tree_cpu_s",
    "rate",
    "read_counts",
]

MB = 1_000_000


def process_tree_cpu_s(*, live: bool = False, exclude: Sequence[int] = ()) -> float:
    """CPU seconds of this process and its waited-for children (DataLoader or pack workers).

    ``live``: also the children still running (psutil ``cpu_times`` of each, recursively, less
    ``exclude``: e.g. a loopback server this process started), so the difference of two calls
    counts workers that were still alive at either end. A child counted live and waited for in
    between is counted once (``RUSAGE_CHILDREN`` takes over its time when it is reaped).
    """
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    if live:
        total += live_children_cpu_s(exclude)
    return total


def live_children_cpu_s(exclude: Sequence[int] = ()) -> float:
    """CPU seconds (user + system) of this process's running children; 0 without psutil."""
    try:
        import psutil
    except ImportError:
        return 0.0
    skip = set(exclude)
    total = 0.0
    try:
        children = psutil.Process().children(recursive=True)
    except (psutil.Error, OSError):
        return 0.0
    for child in children:
        if child.pid in skip:
            continue
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue  # its time reaches RUSAGE_CHILDREN when it is waited for
            times = child.cpu_times()
        except (psutil.Error, OSError):
            continue
        total += times.user + times.system
    return total


def decode_cpu_s_per_sample(store: Store, table: Any, samples: int = 64) -> float:
    """CPU seconds to decode one payload (zstd + safetensors), over up to ``samples`` of ``table``.

    The payloads are fetched first; only the decoding is timed, on this thread.
    """
    import numpy as np

    from ...format.codec import Decoder, decode_safetensors

    n = len(table)
    if n == 0:
        return 0.0
    rows = np.linspace(0, n - 1, min(samples, n)).astype(np.int64)
    spans = [
        (
            table.shard_keys[int(table.shard[r])],
            int(table.offset[r]),
            int(table.offset[r] + table.size[r]),
        )
        for r in rows
    ]
    payloads = store.read_ranges(spans)
    decoder = Decoder()
    c0 = time.process_time()
    for payload in payloads:
        decode_safetensors(decoder.decompress(payload))
    return (time.process_time() - c0) / len(payloads)


def peak_rss_bytes(children: bool = False) -> int:
    """Peak resident set size of this process (or of its waited-for children) so far."""
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    kb = resource.getrusage(who).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return int(kb if sys.platform == "darwin" else kb * 1024)


def current_rss_bytes(pid: int | None = None) -> int | None:
    """Current RSS of ``pid`` (default: this process) from /proc; None where there is no /proc."""
    try:
        with open(f"/proc/{pid or os.getpid()}/statm") as fh:
            pages = int(fh.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def tree_memory_bytes() -> tuple[int, int] | None:
    """Current (RSS, PSS) of this process plus its live children (DataLoader or pack workers).

    PSS splits shared pages (torch's shared-memory batches, forked copy-on-write pages) among
    the processes sharing them, so unlike summed RSS it does not count them once per worker.
    None without psutil.
    """
    try:
        import psutil
    except ImportError:
        return None
    me = psutil.Process()
    rss = pss = 0
    for proc in [me, *me.children(recursive=True)]:
        try:
            info = proc.memory_full_info()
        except (psutil.Error, OSError):
            continue
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
    return rss, pss


class MemorySampler:
    """Peak RSS and PSS of the process tree, sampled every ``interval`` s on a thread.

    Use as a context manager around the measured work; read ``peak_rss``/``peak_pss`` after.
    A sample reads every process's ``smaps`` (tens of ms of CPU with DataLoader workers), so
    sampling is sparse and ``cpu_s`` (this sampler's own CPU time) lets a caller take it out of
    the CPU it charges to the measured work.
    """

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.peak_rss = 0
        self.peak_pss = 0
        self.cpu_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shardlake-mem", daemon=True)

    def sample(self) -> None:
        now = tree_memory_bytes()
        if now is None:
            rss = current_rss_bytes() or 0
            now = (rss, rss)
        self.peak_rss = max(self.peak_rss, now[0])
        self.peak_pss = max(self.peak_pss, now[1])

    def _run(self) -> None:
        start = time.thread_time()
        while not self._stop.is_set():
            self.sample()
            self.cpu_s = time.thread_time() - start
            self._stop.wait(self.interval)

    def start(self) -> MemorySampler:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            self.sample()

    def __enter__(self) -> MemorySampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def rate(amount: float, seconds: float) -> float:
    return round(amount / seconds, 3) if seconds > 0 else 0.0


def machine_info() -> dict[str, Any]:
    """Enough context to tell two benchmark results apart."""
    from ... import __version__

    return {
        "shardlake": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }


class CountingStore(Store):
    """A store counting each range of ``read_ranges``/``read_range`` as one GET.

    fsspec's ``cat_ranges`` sends one request per range, while the store's own request log
    counts calls. Lines ``<pid> <bytes>`` go to ``log_path`` with one ``O_APPEND`` write per
    call, so DataLoader worker processes share the file. Make one with :meth:`wrap`.
    """

    log_path: str

    @classmethod
    def wrap(cls, store: Store, log_path: str) -> CountingStore:
        counted = cls.__new__(cls)
        Store.__setstate__(counted, store.__getstate__())
        counted.log_path = log_path
        return counted

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "log_path": self.log_path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.log_path = state["log_path"]

    def _record(self, sizes: list[int]) -> None:
        text = "".join(f"{os.getpid()} {n}\n" for n in sizes)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def read_range(self, key: str, start: int, end: int) -> bytes:
        out = super().read_range(key, start, end)
        self._record([len(out)])
        return out

    def read_ranges(
        self, ranges: Sequence[tuple[str, int, int]], *, views: bool = False
    ) -> list[Any]:
        out = super().read_ranges(ranges, views=views)
        self._record([len(b) for b in out if len(b)])
        return out


def read_counts(log_path: str) -> tuple[int, int]:
    """``(GETs, bytes)`` recorded by a :class:`CountingStore` in ``log_path``."""
    requests = total = 0
    if os.path.exists(log_path):
        with open(log_path, encoding="ascii") as fh:
            for line in fh:
                requests += 1
                total += int(line.split()[1])
    return requests, total
