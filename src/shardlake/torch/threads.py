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
    from .plan_types import ReadPlan

__all__ = [
    "Budget",
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


class Budget:
    """Batches a loader may have in flight (submitted to the builders, not yet taken by the
    training loop). A pass and the next epoch's pass started during its tail share one, so
    the prefetch counts against the same bound as the pass it follows."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.held = 0
        self._changed = threading.Condition()

    def take(self, stop: threading.Event) -> bool:
        """Wait for room for one batch (False: ``stop`` was set first)."""
        with self._changed:
            while self.held >= self.limit and not stop.is_set():
                self._changed.wait(_POLL_S)
            if stop.is_set():
                return False
            self.held += 1
            return True

    def give(self) -> None:
        with self._changed:
            self.held -= 1
            self._changed.notify_all()


class ThreadBatches:
    """Iterating yields the batches of ``layout``'s slots of this rank from ``cursor`` on.

    At most ``ahead`` batches are being built or waiting to be taken (counted in ``budget``,
    which a pass started during this one's tail shares). :meth:`start` starts the reads and
    builds before anyone iterates (the next epoch's prefetch); ``gated=True`` reads ahead but
    builds nothing until iteration begins (a ``transform`` may depend on what the training
    loop sets between epochs). Leaving the loop early (``break``, an error: the generator is
    closed) or :meth:`close` stops the feeder, the builders and the slots' readers. One pass:
    iterate it once.
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
        budget: Budget | None = None,
        gated: bool = False,
        keep_plan: bool = True,
    ) -> None:
        self.ds = ds
        self.layout = layout
        self.cursor = cursor
        self.threads = max(1, threads)
        self.ahead = max(1, ahead)
        self.timeout = timeout or None
        self.pool = pool  # the loader's, kept from pass to pass (see batch_buffers)
        # One more than ``ahead``: the feeder used to hold a built batch while the queue was full.
        self.budget = budget if budget is not None else Budget(self.ahead + 1)
        self.fed = threading.Event()  # set once every slot's batches are submitted (the tail)
        self._go = threading.Event()
        if not gated:
            self._go.set()
        self._stop = threading.Event()
        self._done: queue.Queue[Any] = queue.Queue()
        self._builders: ThreadPoolExecutor | None = None
        self._feeder: threading.Thread | None = None
        self._plan_lock = threading.Lock()
        self._keep_plan = keep_plan
        self._plan: ReadPlan | None = None
        self._planned = threading.Event()  # set once the plan is made (or the feeder ended)
        self._failed = False

    def failed(self) -> bool:
        """Whether a read or build of this pass has failed so far. A prefetch that failed is
        dropped, not taken: its pass runs again when asked for, so an error (a store outage
        during the tail) is met, or not, as it would be without the prefetch."""
        with self._done.mutex:
            items = list(self._done.queue)
        return self._failed or any(
            any(f.done() and not f.cancelled() and f.exception() is not None for f in _futures(i))
            for i in items
        )

    def start(self) -> None:
        """Start the feeder and the builders (iterating starts them too)."""
        if self._feeder is not None:
            return
        builders = ThreadPoolExecutor(self.threads, thread_name_prefix="shardlake-build")
        self._builders = builders
        self._feeder = threading.Thread(
            target=self._feed, args=(builders,), name="shardlake-feed", daemon=True
        )
        self._feeder.start()

    def keep_plan(self, wait: bool = False) -> None:
        """From now on, this pass's plan is the dataset's cached plan (a prefetch, once taken);
        ``wait``: until the feeder has made it (rather than planning the epoch a second time)."""
        if wait and self._feeder is not None:
            self._planned.wait()
        with self._plan_lock:
            self._keep_plan = True
            if self._plan is not None:
                self.ds.keep_plan(self.layout, self.cursor, self._plan)

    def _read_plan(self) -> ReadPlan:
        with self._plan_lock:
            keep = self._keep_plan
        ds = self.ds
        plan = ds.plan(self.layout, self.cursor) if keep else ds.plan_of(self.layout, self.cursor)
        with self._plan_lock:
            self._plan = plan
            if self._keep_plan and not keep:
                self.ds.keep_plan(self.layout, self.cursor, plan)
        self._planned.set()
        return plan

    def __iter__(self) -> Iterator[Any]:
        self.start()
        self._go.set()
        try:
            while True:
                item = self._done.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                self.budget.give()
                yield item.result(timeout=self.timeout)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the feeder, the builders and the readers; drop what was built and not taken."""
        self._stop.set()
        me = threading.current_thread()  # a finalizer may run in one of this pass's threads
        if self._feeder is not None and self._feeder is not me:
            self._feeder.join()
        while True:
            try:
                item = self._done.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, (Future, _BatchParts)):
                item.cancel()
                self.budget.give()
        if self._builders is not None:
            mine = me is self._feeder or me in getattr(self._builders, "_threads", ())
            self._builders.shutdown(wait=not mine, cancel_futures=True)

    def _wait_go(self) -> bool:
        while not self._go.wait(_POLL_S):
            if self._stop.is_set():
                return False
        return not self._stop.is_set()

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

    def _feed(self, builders: ThreadPoolExecutor) -> None:
        """Walk the slots in step order and submit each batch's work (runs in its own thread,
        which also closes the slots' readers: a generator is closed where it runs)."""
        slots: list[SlotBatches] = []
        iters: list[Iterator[Any] | None] = []
        walked = False
        try:
            plan = self._read_plan()
            for worker in range(self.layout.slots_per_rank):
                work = self.ds.slot_work(
                    self.layout, worker, self.cursor, pool=self.pool, plan=plan
                )
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
                    if not self._wait_go() or not self.budget.take(self._stop):
                        return
                    try:
                        self._done.put(self._submit(builders, slots[j], items, busy))
                    except BaseException:
                        self.budget.give()
                        raise
            walked = not self._stop.is_set()
            if walked:  # every read is done: a pass started now reads within the same budget
                self.fed.set()
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            self._failed = True
            self._done.put(exc)
        finally:
            self._planned.set()
            for it in iters:
                close = getattr(it, "close", None)
                if close is not None:
                    close()
            if walked:
                self._done.put(_END)


def _futures(item: Any) -> list[Future[Any]]:
    if isinstance(item, Future):
        return [item]
    return item.futures if isinstance(item, _BatchParts) else []


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
