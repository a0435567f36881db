"""Functions the conformance suite runs in other processes (importable by spawned children)."""

from __future__ import annotations

import os
import time

from ..errors import AlreadyExistsError
from ..store import Store


def warm_up(seconds: float = 0.2) -> int:
    """Import the heavy backends once so later timed tasks start at once; returns the pid."""
    import gcsfs.core  # noqa: F401
    import s3fs  # noqa: F401

    time.sleep(seconds)  # keep this worker busy so the pool starts all of them
    return os.getpid()


def create_at(store: Store, key: str, payload: bytes, start_at: float) -> str:
    """Wait until the wall-clock ``start_at``, then race to create ``key``: "won" or "lost"."""
    store.fs  # noqa: B018 - build the filesystem before the start line, not after
    delay = start_at - time.time()
    if delay > 0:
        time.sleep(delay)
    try:
        store.create(key, payload)
    except AlreadyExistsError:
        return "lost"
    return "won"


def read_key(store: Store, key: str) -> bytes:
    return store.read(key)


def write_key(store: Store, key: str, data: bytes) -> None:
    store.write(key, data)


def stream_then_hang(store: Store, key: str, nbytes: int, ready_path: str) -> None:
    """Stream ``nbytes`` into ``key`` without closing, signal ``ready_path``, then wait to be killed."""
    chunk = b"k" * (256 * 1024)
    with store.open_writer(key) as out:
        written = 0
        while written < nbytes:
            piece = chunk[: min(len(chunk), nbytes - written)]
            out.write(piece)
            written += len(piece)
        out.flush()
        with open(ready_path, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)


__all__ = [
    "create_at",
    "read_key",
    "stream_then_hang",
    "warm_up",
    "write_key",
]
