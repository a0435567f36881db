"""The writer's local spill directories: named by host and process, removed however it ends.

A spill holds a writer's compressed samples until it publishes (``pack/writer``). It is
removed when the writer leaves its ``with`` block, published or not; when the process is
ended by SIGTERM (a handler removes every live spill, then lets SIGTERM end the process as
it would have); and, for a process killed outright (SIGKILL, power loss), by the next writer
that starts on the same host: its name holds the host and the process id, and a spill whose
process is gone is stale.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import weakref
from types import FrameType

__all__ = [
    "SPILL_PREFIX",
    "Spill",
    "remove_stale_spills",
]

SPILL_PREFIX = "shardlake-writer-"
# <prefix><host>-<pid>-<random>: tempfile's random part holds no '-'; a host name may.
_NAME = re.compile(rf"^{SPILL_PREFIX}(?P<host>.+)-(?P<pid>\d+)-[a-z0-9_]+$")

_live: set[str] = set()  # spill paths of this process's open writers
_lock = threading.Lock()
_installed = False  # our SIGTERM handler is in place (it replaced the default)


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def remove_stale_spills(directory: str) -> list[str]:
    """Remove the spills in ``directory`` left by dead writer processes of this host; their names."""
    host = _host()
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        match = _NAME.match(name)
        if match is None or match["host"] != host:
            continue  # not a spill, or another host's (its process cannot be checked here)
        pid = int(match["pid"])
        if pid == os.getpid() or _alive(pid):
            continue
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
        removed.append(name)
    return removed


def _on_sigterm(signum: int, _frame: FrameType | None) -> None:
    """Remove every live spill, then end the process by SIGTERM as the default would."""
    for path in list(_live):
        shutil.rmtree(path, ignore_errors=True)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


class Spill:
    """One writer's spill directory (``path``): created, stale ones removed; :meth:`cleanup`."""

    def __init__(self, directory: str | os.PathLike[str] | None) -> None:
        parent = os.fspath(directory or tempfile.gettempdir())
        remove_stale_spills(parent)
        self.path = tempfile.mkdtemp(prefix=f"{SPILL_PREFIX}{_host()}-{os.getpid()}-", dir=parent)
        global _installed
        with _lock:
            _live.add(self.path)
            # Only where SIGTERM would kill us outright: a handler of the program's own stays.
            if (
                not _installed
                and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
            ):
                signal.signal(signal.SIGTERM, _on_sigterm)
                _installed = True
        # Also at garbage collection and at interpreter exit, should cleanup() never be called.
        self._remove = weakref.finalize(self, _remove, self.path)

    def cleanup(self) -> None:
        self._remove()


def _remove(path: str) -> None:
    global _installed
    shutil.rmtree(path, ignore_errors=True)
    with _lock:
        _live.discard(path)
        if _live or not _installed:
            return
        if threading.current_thread() is not threading.main_thread():
            return  # signal.signal works in the main thread only; the handler is harmless
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _installed = False
