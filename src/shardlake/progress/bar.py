"""Progress of long operations (pack, export, verify, scrub, gc, bench) on standard error.

On a terminal a live tqdm bar shows count, rate and ETA; when standard error is a log file or
a pipe, one plain line is printed at most every ``interval_s`` seconds (and at the end), so
logs stay readable. A heartbeat names the work still in flight when nothing finished for
``heartbeat_s`` seconds (a partition build can take minutes).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from tqdm import tqdm

__all__ = [
    "DEFAULT_HEARTBEAT_S",
    "Progress",
    "human_bytes",
    "plural",
]

DEFAULT_INTERVAL_S = 2.0
DEFAULT_HEARTBEAT_S = 60.0


def format_duration(seconds: float) -> str:
    """``H:MM:SS``."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 partition``, ``3 partitions`` (``nouns``: the irregular plural, ``batches``)."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def human_bytes(n: int) -> str:
    """``123 B``, ``4.5 MiB``, ..."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


class Progress:
    """Counts finished units (samples, shards, objects) of one operation and shows them.

    Parameters
    ----------
    total
        Units the operation will process (None: not known beforehand; a count is shown).
    what
        The operation's name, leading every line (``"scrub"``, ``"shardlake pack"``).
    unit
        What is counted (``"samples"``).
    groups, group_unit
        Optionally a second count shown beside the first, e.g. 12 ``"partitions"``.
    enabled
        True: show; False: silent; None: only when ``stream`` is a terminal.
    stream
        Where to write (default: standard error).
    interval_s
        Least seconds between two plain lines.
    heartbeat_s
        Seconds without progress after which :meth:`poll` names the work in flight.
    clock
        Monotonic clock (tests pass a fake one).
    """

    def __init__(
        self,
        total: int | None,
        what: str,
        *,
        unit: str = "samples",
        groups: int | None = None,
        group_unit: str = "partitions",
        enabled: bool | None = None,
        stream: TextIO | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = None if total is None else max(0, total)  # None: not known (a count)
        self.what = what
        self.unit = unit
        self.groups_total = groups
        self.group_unit = group_unit
        self.done = 0
        self.groups = 0
        self.heartbeats = 0
        self.stream = stream if stream is not None else sys.stderr
        is_tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = is_tty if enabled is None else enabled
        self.interval_s = interval_s
        self.heartbeat_s = heartbeat_s
        self.clock = clock
        self.started = self._last_done = self._last_heartbeat = clock()
        self._last_line = float("-inf")
        self._bar: tqdm[None] | None = None
        if self.enabled and is_tty:
            self._bar = tqdm(
                total=self.total, desc=what, unit=f" {unit}", file=self.stream, dynamic_ncols=True
            )

    def line(self) -> str:
        """The plain progress line: counts, percentage, rate, elapsed time and ETA."""
        elapsed = self.clock() - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        groups = (
            f"{self.groups}/{self.groups_total} {self.group_unit}, "
            if self.groups_total is not None
            else ""
        )
        if self.total is None:
            return (
                f"{groups}{self.done} {self.unit}, {rate:.1f} {self.unit}/s, "
                f"elapsed {format_duration(elapsed)}"
            )
        pct = 100.0 * self.done / self.total if self.total else 100.0
        eta = format_duration((self.total - self.done) / rate) if rate > 0 else "?"
        return (
            f"{groups}{self.done}/{self.total} {self.unit} ({pct:.1f}%), "
            f"{rate:.1f} {self.unit}/s, elapsed {format_duration(elapsed)}, ETA {eta}"
        )

    def message(self, text: str) -> None:
        """Print one line (above the bar on a terminal)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(f"{self.what}: {text}", file=self.stream)
        else:
            print(f"{self.what}: {text}", file=self.stream, flush=True)

    def update(self, n: int = 1, *, groups: int = 0) -> None:
        """``n`` more units (and ``groups`` more groups) finished."""
        self.done += n
        self.groups += groups
        now = self.clock()
        self._last_done = self._last_heartbeat = now
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            if self.groups_total is not None:
                self._bar.set_postfix_str(f"{self.groups}/{self.groups_total} {self.group_unit}")
            return
        finished = (self.total is not None and self.done >= self.total) or (
            self.groups_total is not None and self.groups >= self.groups_total
        )
        if now - self._last_line >= self.interval_s or finished:
            self._last_line = now
            self.message(self.line())

    def poll(self, in_flight: Callable[[], list[str]]) -> None:
        """Call periodically; names the work in flight when nothing finished for a while."""
        now = self.clock()
        if (
            now - self._last_done < self.heartbeat_s
            or now - self._last_heartbeat < self.heartbeat_s
        ):
            return
        self._last_heartbeat = now
        self.heartbeats += 1
        names = in_flight()
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        self.message(
            f"still working: nothing finished for {format_duration(now - self._last_done)}; "
            f"in flight: {shown or 'none'} ({self.line()})"
        )

    def close(self) -> None:
        """End the bar (a terminal) or print the final line (a log) if it was not printed."""
        if self._bar is not None:
            self._bar.close()
        elif self.enabled and self._last_line < self._last_done:
            self._last_line = self._last_done
            self.message(self.line())

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
