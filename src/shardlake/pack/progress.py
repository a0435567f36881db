"""Pack progress on stderr: weighted by samples (partitions differ 1000x in size), with an ETA
and a heartbeat naming the partitions in flight when nothing has finished for a while."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

DEFAULT_HEARTBEAT_S = 60.0
DEFAULT_INTERVAL_S = 2.0


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class Progress:
    """Counts finished samples and partitions; prints at most every ``interval_s`` seconds.

    ``heartbeat_s``: when no partition finished for that long, one line names the partitions
    still in flight (and again every ``heartbeat_s``). ``quiet`` prints nothing.
    """

    def __init__(
        self,
        total_samples: int,
        total_partitions: int,
        *,
        stream: TextIO | None = None,
        quiet: bool = False,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total_samples = max(0, total_samples)
        self.total_partitions = total_partitions
        self.samples = 0
        self.partitions = 0
        self.reused = 0
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.heartbeat_s = heartbeat_s
        self.interval_s = interval_s
        self.clock = clock
        self.started = clock()
        self._last_done = self.started
        self._last_print = float("-inf")
        self._last_heartbeat = self.started
        self.heartbeats = 0

    def _print(self, line: str) -> None:
        if not self.quiet:
            print(f"shardlake pack: {line}", file=self.stream, flush=True)

    def line(self) -> str:
        elapsed = self.clock() - self.started
        pct = 100.0 * self.samples / self.total_samples if self.total_samples else 100.0
        rate = self.samples / elapsed if elapsed > 0 else 0.0
        remaining = self.total_samples - self.samples
        eta = format_duration(remaining / rate) if rate > 0 else "?"
        return (
            f"{self.partitions}/{self.total_partitions} partitions, "
            f"{self.samples}/{self.total_samples} samples ({pct:.1f}%), "
            f"{rate:.1f} samples/s, elapsed {format_duration(elapsed)}, ETA {eta}"
        )

    def message(self, text: str) -> None:
        self._print(text)

    def partition_done(self, samples: int, *, reused: bool = False) -> None:
        self.samples += samples
        self.partitions += 1
        self.reused += int(reused)
        now = self.clock()
        self._last_done = self._last_heartbeat = now
        if now - self._last_print >= self.interval_s or self.partitions == self.total_partitions:
            self._last_print = now
            self._print(self.line())

    def poll(self, in_flight: Callable[[], list[str]]) -> None:
        """Call periodically; prints the heartbeat when nothing finished for ``heartbeat_s``."""
        now = self.clock()
        if (
            now - self._last_done >= self.heartbeat_s
            and now - self._last_heartbeat >= self.heartbeat_s
        ):
            self._last_heartbeat = now
            self.heartbeats += 1
            names = in_flight()
            shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
            self._print(
                f"still working: nothing finished for {format_duration(now - self._last_done)}; "
                f"in flight: {shown or 'none'} ({self.line()})"
            )
