"""Giving freed memory back to the OS: the loader's set-up and its threads leave large
temporaries (Arrow buffers, decoded catalog columns) whose pages would otherwise stay resident."""

from __future__ import annotations

import contextlib
import ctypes
import sys

import pyarrow as pa

__all__ = ["trim_heap"]


def trim_heap() -> None:
    """Return freed heap pages (Arrow's pool, glibc's arenas) to the OS."""
    pa.default_memory_pool().release_unused()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
