"""Ctrl-C at any moment of ``shardlake pack``: exit 130, one line, nothing published.

A terminal's Ctrl-C reaches the whole process group (the fork server and pool workers too), so
the test signals the group, as a terminal does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardlake import open_store
from shardlake.tools.synth import synth_corpus

# The console script (``shardlake = shardlake.cli:run``), saying "go" once it has taken SIGINT.
_CLI = """
import signal, sys
real = signal.signal
def announcing(signum, handler):
    previous = real(signum, handler)
    if signum == signal.SIGINT and signal.signal is announcing:
        signal.signal = real
        print("go", file=sys.stderr, flush=True)
    return previous
signal.signal = announcing
from shardlake.cli import run
run()
"""


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:  # the process or thread is gone
        return ""


def _fork_server(pid: int) -> bool:
    """Whether ``pid`` has started its fork server (a child running multiprocessing.forkserver)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in _read(task / "children").split():
            if "forkserver" in _read(Path(f"/proc/{child}/cmdline")):
                return True
    return False


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("ctrl_c") / "src"
    # Large enough that pack is still running 2 s in on a quiet machine (CI).
    synth_corpus(src, 6, [500] * 6, seed=3, neighbors=32, lanes=16)
    return src


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
@pytest.mark.parametrize("when", ["at-once", "0.1", "0.3", "0.6", "1.0", "workers-start", "2.0"])
def test_ctrl_c_at_any_moment_of_pack_exits_130_with_one_line(
    source: Path, tmp_path: Path, when: str
) -> None:
    root = tmp_path / "root"
    argv = ["pack", str(source), str(root), "--tag", "v1", "--quiet", "--workers", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLI, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: the signal reaches it and its children only
    )
    assert proc.stderr is not None
    try:
        assert proc.stderr.readline() == "go\n"
        if when == "workers-start":  # the fork server imports its preload (an EOFError once)
            deadline = time.monotonic() + 60
            while not _fork_server(proc.pid) and proc.poll() is None:
                assert time.monotonic() < deadline
                time.sleep(0.002)
            time.sleep(0.05)
        elif when != "at-once":
            time.sleep(float(when))
        assert proc.poll() is None, "pack finished before the Ctrl-C: make the corpus larger"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert (proc.returncode, err.splitlines()) == (
        130,
        ["shardlake pack: interrupted; nothing was published"],
    ), f"{when}: {err}"
    if root.exists():
        store = open_store(str(root))
        assert store.list("commits/") == [] and store.list("versions/") == []


_SERVER_MASK = """
import signal, sys, threading, time
from multiprocessing import forkserver
from shardlake.executors.tasks import mp_context
# A thread that does not block SIGINT, as pack's lease and pools are: were the disposition
# SIG_IGN while the server starts, a Ctrl-C this thread took would be lost.
threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
handler = signal.getsignal(signal.SIGINT)
mp_context(None, ["shardlake.pack"])
status = open(f"/proc/{forkserver._forkserver._forkserver_pid}/status").read()
blocked = int(status.split("SigBlk:")[1].split()[0], 16)
print(bool(blocked & (1 << (signal.SIGINT - 1))), signal.getsignal(signal.SIGINT) is handler)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_the_fork_server_starts_with_sigint_blocked_not_ignored_here() -> None:
    """The fork server inherits a blocked SIGINT (multiprocessing's resource tracker unblocks it
    in the calling thread: started first), and this process never ignores SIGINT meanwhile: a
    Ctrl-C then was lost when another thread took it, and pack ran on to publish (exit 0)."""
    out = subprocess.run(
        [sys.executable, "-c", _SERVER_MASK], capture_output=True, text=True, timeout=120
    )
    assert out.stdout.split() == ["True", "True"], out.stderr
