"""The thread engine: this rank's batches built on a thread pool in the training process.

The same plan, slots and per-batch work as the process engine (a DataLoader worker per slot,
:mod:`shardlake.torch.loader`), driven differently: one feeder thread walks the slots in step
order (step ``s`` is slot ``s % W``'s next batch, the order a DataLoader polls its workers),
taking each batch's payloads from the slot's reader (whose own thread pool fetches ahead,
bounded in bytes by ``ReadOptions.max_buffer_bytes``) and handing the batch's decompression,
checks and assembly to a pool of ``threads`` builder threads. Batches come back in step order.
The hot path (zstd decompression, memcpy into the batch tensors, the store's reads) releases
the GIL, so the threads use every core without passing batches between processes; the plan
and row table exist once per process.

A user ``transform`` runs in the builder threads and holds the GIL: with a heavy Python
transform, the process engine scales better.
"""

from __future__ import annotations

import collections
import itertools
import os
import queue
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch

from .collate import BatchJob, LocalBufferPool
from .heap import trim_heap
from .plan_types import Cursor, Layout

if TYPE_CHECKING:
    from .batches import SlotBatches
    from .dataset import ShardDataset

__all__ = [
    "ThreadBatches",
    "batch_buffers",
    "default_threads",
    "ordered_map",
]

_END = object()  # the feeder's last item
_POLL_S = 0.1  # how often a blocked feeder looks whether the consumer has gone
MIN_PART_ROWS = 4  # a batch is split among the builders in row ranges of at least this many


def default_threads() -> int:
    """Builder threads: one per core this process may use (at least 2, at most 16)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(2, min(16, cores))


def buffer_allocator(pin_memory: bool) -> Callable[[int], torch.UntypedStorage]:
    """Plain memory, or page-locked memory (faster copies to the GPU) where CUDA is available."""
    if pin_memory and not torch.cuda.is_available():
        warnings.warn(
            "pin_memory=True but CUDA is not available: batches use plain memory",
            stacklevel=3,
        )
        pin_memory = False
    if pin_memory:
        return lambda n: torch.empty(n, dtype=torch.uint8, pin_memory=True).untyped_storage()
    return torch.UntypedStorage


def batch_buffers(threads: int, ahead: int, pin_memory: bool, reuse: bool) -> LocalBufferPool:
    """The batch buffers of a thread-engine loader: those in flight (``ahead`` batches, one
    per builder thread) plus a few the training loop may still hold. A loader keeps them from
    one pass to the next: a fresh batch buffer costs a page fault per page on first touch."""
    size = max(1, ahead) + max(1, threads) + 4 if reuse else 0
    return LocalBufferPool(size, buffer_allocator(pin_memory))


class ThreadBatches:
    """Iterating yields the batches of ``layout``'s slots of this rank from ``cursor`` on.

    At most ``ahead`` batches are being built or waiting to be taken. Leaving the loop early
    (``break``, an error: the generator is closed) stops the feeder, the builders and the
    slots' readers before the iterator is gone.
    """

    def __init__(
        self,
        ds: ShardDataset,
        layout: Layout,
        cursor: Cursor,
        *,
        threads: int,
        ahead: int,
        pool: LocalBufferPool,
        timeout: float | None = None,
    ) -> None:
        self.ds = ds
        self.layout = layout
        self.cursor = cursor
        self.threads = max(1, threads)
        self.ahead = max(1, ahead)
        self.timeout = timeout or None
        self.pool = pool  # the loader's, kept from pass to pass (see batch_buffers)
        self._stop = threading.Event()

    def __iter__(self) -> Iterator[Any]:
        self._stop.clear()
        done: queue.Queue[Any] = queue.Queue(maxsize=self.ahead)
        builders = ThreadPoolExecutor(self.threads, thread_name_prefix="shardlake-build")
        feeder = threading.Thread(
            target=self._feed, args=(done, builders), name="shardlake-feed", daemon=True
        )
        feeder.start()
        try:
            while True:
                item = done.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item.result(timeout=self.timeout)
        finally:
            self._stop.set()
            while feeder.is_alive():  # unblock a feeder waiting on a full queue
                try:
                    item = done.get(timeout=_POLL_S)
                    if isinstance(item, (Future, _BatchParts)):
                        item.cancel()
                except queue.Empty:
                    pass
            builders.shutdown(wait=True, cancel_futures=True)

    def _put(self, done: queue.Queue[Any], item: Any) -> bool:
        while not self._stop.is_set():
            try:
                done.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _submit(
        self, builders: ThreadPoolExecutor, slot: SlotBatches, items: Any, busy: list[Future[Any]]
    ) -> Any:
        """One batch's work on the builders. While builders are idle (the first batch of a
        pass, the last ones) a batch is split into row ranges, one per thread, so that it
        uses every core; otherwise whole batches keep the builders busy at less cost.
        ``busy``: the builders' unfinished work, kept up to date here."""
        busy[:] = [f for f in busy if not f.done()]
        n = len(items[0])
        parts = min(self.threads - len(busy), n // MIN_PART_ROWS)
        job = slot.job(items) if parts > 1 else None
        if job is None:
            future = builders.submit(slot.build, items)
            busy.append(future)
            return future
        bounds = [n * k // parts for k in range(parts + 1)]
        # Row 0's range first: the other ranges wait for the batch it shapes.
        futures = [builders.submit(job.fill, lo, hi) for lo, hi in itertools.pairwise(bounds)]
        busy += futures
        return _BatchParts(job, futures)

    def _feed(self, done: queue.Queue[Any], builders: ThreadPoolExecutor) -> None:
        """Walk the slots in step order and submit each batch's work (runs in its own thread,
        which also closes the slots' readers: a generator is closed where it runs)."""
        slots: list[SlotBatches] = []
        iters: list[Iterator[Any] | None] = []
        try:
            for worker in range(self.layout.slots_per_rank):
                work = self.ds.slot_work(self.layout, worker, self.cursor, pool=self.pool)
                slots.append(work)
                iters.append(iter(work))
            rounds = 0
            busy: list[Future[Any]] = []
            while any(it is not None for it in iters) and not self._stop.is_set():
                if rounds == 1:
                    # Every slot has started reading: the readers' set-up temporaries (a few
                    # arrays the size of the slot's plan) go back to the OS.
                    trim_heap()
                rounds += 1
                for j, it in enumerate(iters):
                    if it is None:
                        continue
                    items = next(it, None)
                    if items is None:
                        iters[j] = None
                        continue
                    if not self._put(done, self._submit(builders, slots[j], items, busy)):
                        return
            self._put(done, _END)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            self._put(done, exc)
        finally:
            for it in iters:
                close = getattr(it, "close", None)
                if close is not None:
                    close()


class _BatchParts:
    """A batch being built in row ranges on the builder pool (see :class:`BatchJob`)."""

    def __init__(self, job: BatchJob, futures: list[Future[None]]) -> None:
        self.job = job
        self.futures = futures

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        for future in self.futures:  # in row order: the first failing row's error is raised
            future.result(timeout=timeout)
        return self.job.finish()

    def cancel(self) -> None:
        self.job.abandon()
        for future in self.futures:
            future.cancel()


def ordered_map(
    fn: Callable[[Any], Any], items: Iterable[Any], *, threads: int, ahead: int
) -> Iterator[Any]:
    """``fn`` of each item, computed on ``threads`` threads at most ``ahead`` items ahead of
    the consumer, yielded in the items' order (a generator: closing it cancels the rest)."""
    pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="shardlake-sample")
    pending: collections.deque[Future[Any]] = collections.deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for fut in pending:
            fut.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
