"""One progress module: a tqdm bar on a terminal, plain periodic lines in a log."""

from __future__ import annotations

import io

from shardlake.progress.bar import Progress, human_bytes


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_gets_plain_periodic_lines_and_a_final_one() -> None:
    now = [0.0]
    out = io.StringIO()
    bar = Progress(10, "scrub", enabled=True, stream=out, interval_s=5, clock=lambda: now[0])
    for _ in range(9):
        now[0] += 1
        bar.update()
    lines = out.getvalue().splitlines()
    assert lines == ["scrub: 1/10 samples (10.0%), 1.0 samples/s, elapsed 0:00:01, ETA 0:00:09",
                     "scrub: 6/10 samples (60.0%), 1.0 samples/s, elapsed 0:00:06, ETA 0:00:04"]  # fmt: skip
    bar.close()
    assert out.getvalue().splitlines()[-1].startswith("scrub: 9/10 samples")
    assert "\r" not in out.getvalue()  # no terminal control in a log


def test_terminal_gets_a_live_bar_with_rate_and_eta() -> None:
    out = _Terminal()
    with Progress(4, "export", unit="shards", stream=out) as bar:  # None: on for a terminal
        bar.update(2)
        bar.message("halfway")
    text = out.getvalue()
    assert "export" in text and "4/4" not in text.split("halfway")[0]
    assert "\r" in text and "shards/s" in text and "halfway" in text


def test_off_unless_asked_when_not_a_terminal() -> None:
    out = io.StringIO()
    with Progress(3, "verify", stream=out) as bar:
        bar.update(3)
    assert out.getvalue() == ""
    assert human_bytes(1536) == "1.5 KiB" and human_bytes(12) == "12 B"
