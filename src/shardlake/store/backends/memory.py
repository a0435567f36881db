"""fsspec's in-process memory filesystem."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

from .base import Backend

__all__ = ["MemoryBackend"]


class MemoryBackend(Backend):
    """fsspec's in-process memory filesystem; a process-wide lock makes create atomic.

    Memory stores live in one process: a pickled memory store opened in a spawned process sees
    an empty store (a forked one sees a copy as of the fork).
    """

    protocols = ("memory",)
    networked = False
    _lock = threading.Lock()

    @classmethod
    def split_root(cls, protocol: str, rest: str, url: str) -> tuple[str, str]:
        path = "/" + rest.strip("/")
        return path.rstrip("/") or "/", f"{protocol}://{rest.strip('/')}"

    def write(self, path: str, data: bytes) -> None:
        with self._lock:
            self.fs.pipe_file(path, data)

    def create(self, path: str, data: bytes) -> None:
        with self._lock:
            if self.fs.isfile(path):
                raise FileExistsError(path)
            self.fs.pipe_file(path, data)

    @contextmanager
    def open_writer(self, path: str) -> Iterator[BinaryIO]:
        buffer = io.BytesIO()
        yield buffer
        self.write(path, buffer.getvalue())
