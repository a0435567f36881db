"""``RunOptions``: how an operation runs its tasks (workers, executor, progress), one definition
shared by every options object whose operation runs tasks (``PackOptions``, ``VerifyOptions``,
``OffsetsOptions``, ``ScrubOptions``, ``ExportOptions``, ``ForgetOptions``).

Each of those is a subclass, so ``root.pack(src, workers=4)`` and ``PackOptions(workers=4)``
keep working and every operation has the same three defaults.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import UsageError
from ..options import options_class
from .tasks import ExecutorSpec

__all__ = [
    "IO_WORKERS",
    "RunOptions",
]

# Tasks that mostly wait on the store (reads, copies, rewrites) run this many at once by default
# (threads; the memory bound of scrub/verify is workers x their batch bytes).
IO_WORKERS = 4


@options_class
@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How an operation runs its tasks; the same three fields, with the same defaults, in every
    options object that runs tasks.

    Parameters
    ----------
    workers
        Tasks run at once. None (default): the operation picks: the CPU count for pack's
        partition builds (they compress), ``IO_WORKERS`` (4) for operations that wait on the
        store (verify, verify-offsets, scrub, export, forget).
    executor
        Where tasks run: ``"thread"``, ``"process"``, ``"inline"``, a ``dask://host:port``
        address, ``"ray"`` or ``ray://host:port``, or a :class:`concurrent.futures.Executor`.
        None (default): processes for pack, threads for the others.
    progress
        Progress on standard error: True, False, or None (default) for "only when standard
        error is a terminal".
    """

    workers: int | None = None
    executor: ExecutorSpec = None
    progress: bool | None = None

    def worker_count(self, *, compute: bool = False) -> int:
        """``workers``, or the default for tasks that compute (the CPU count) or wait on the
        store (``IO_WORKERS``); refuses a count below 1."""
        if self.workers is None:
            return (os.cpu_count() or 1) if compute else IO_WORKERS
        if self.workers < 1:
            raise UsageError("workers must be >= 1", options=("workers",))
        return self.workers
