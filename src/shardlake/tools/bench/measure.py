"""Measurement helpers shared by ``shardlake bench`` and ``benchmarks/*.py``: clocks, RSS, rates."""

from __future__ import annotations

import os
import platform
import resource
import sys
import threading
from typing import Any

MB = 1_000_000


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
    """

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.peak_rss = 0
        self.peak_pss = 0
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
        while not self._stop.is_set():
            self.sample()
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
