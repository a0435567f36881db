"""Executors and a task runner shared by pack and the read passes (scrub, verify, export).

One place for the executor spec (``process``, ``thread``, ``inline``, ``dask://HOST:PORT`` or an
Executor), so pack and lifecycle (peers) run tasks the same way: submitted from the client,
progress and ETA on the client, every failure reported by task, never silently lost.
"""

from __future__ import annotations

import ast
import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from ..errors import SourceError, UsageError
from ..progress.bar import Progress
from ..store import Store
from .ray_executor import RayExecutor, is_ray

__all__ = [
    "ExecutorSpec",
    "InlineExecutor",
    "Task",
    "error_text",
    "executor_for",
    "make_executor",
    "run_tasks",
]

ExecutorSpec = str | cf.Executor | None


class InlineExecutor(cf.Executor):
    """Runs each task at submit time in the calling thread (tests, debugging, spies)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        future: cf.Future[Any] = cf.Future()
        future.set_running_or_notify_cancel()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - delivered through the future
            if isinstance(exc, KeyboardInterrupt):
                raise
            future.set_exception(exc)
        return future


def mp_context(name: str | None, preload: Sequence[str] = ()) -> Any:
    if name is None:
        # forkserver: workers do not inherit the parent's threads (s3fs loops, servers) or locks.
        name = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(name)
    if name == "forkserver":
        if preload:
            ctx.set_forkserver_preload(list(preload))
        _start_forkserver_deaf_to_ctrl_c()
    return ctx


def _start_forkserver_deaf_to_ctrl_c() -> None:
    """Start the fork server with SIGINT blocked (a signal mask survives fork and exec).

    Ctrl-C reaches the whole process group: a fork server still importing its preload modules
    would die with a traceback, and the pool would fail with EOFError instead of the clean
    interrupt. The server starts with SIGINT blocked, then ignores it (multiprocessing does so
    once its preload is imported); its workers inherit the blocked mask and the parent stops them
    on Ctrl-C (run_tasks). The disposition here is never SIG_IGN: that is process-wide, so a
    Ctrl-C taken meanwhile by another thread (the lease's, a pool's) would be lost and the pack
    would run on to publish. Blocked in this thread only, it reaches this process's handler."""
    if threading.current_thread() is not threading.main_thread():
        return  # the mask must be the main thread's; the server starts on first use
    from multiprocessing import forkserver, resource_tracker

    # The resource tracker's start unblocks SIGINT in this thread when it is done: start it
    # first, so that the server below inherits the block.
    resource_tracker.ensure_running()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def is_dask(spec: ExecutorSpec) -> bool:
    return isinstance(spec, str) and spec.startswith(("dask://", "tcp://"))


def make_executor(
    spec: ExecutorSpec,
    workers: int | None,
    mp_context_name: str | None = None,
    *,
    preload: Sequence[str] = (),
) -> tuple[cf.Executor, Callable[[], None]]:
    """``(executor, close)`` for an executor spec: process (default), thread, inline, dask://HOST:PORT,
    ray (this process's Ray instance, else a local one), ray://HOST:PORT, or an Executor instance
    (used as-is, never shut down here)."""
    n = workers or os.cpu_count() or 1
    if n < 1:
        raise UsageError("workers must be >= 1", options=("workers",))
    if isinstance(spec, cf.Executor):
        return spec, lambda: None
    if spec in (None, "process"):
        ctx = mp_context(mp_context_name, preload)
        check_main_guard(ctx.get_start_method())
        pool = cf.ProcessPoolExecutor(max_workers=n, mp_context=ctx)
        return pool, lambda: pool.shutdown(wait=True, cancel_futures=True)
    if spec == "thread":
        tpool = cf.ThreadPoolExecutor(max_workers=n, thread_name_prefix="shardlake")
        return tpool, lambda: tpool.shutdown(wait=True, cancel_futures=True)
    if spec == "inline":
        return InlineExecutor(), lambda: None
    if is_ray(spec):
        ray_pool = RayExecutor(str(spec), n)
        return ray_pool, ray_pool.shutdown
    if is_dask(spec):
        try:
            import distributed
        except ImportError as exc:
            raise UsageError(
                "a dask:// executor needs the 'dask' extra (pip install shardlake[dask])"
            ) from exc
        address = "tcp://" + str(spec).split("://", 1)[1]
        try:
            client = distributed.Client(address, timeout="30s")
        except OSError as exc:
            raise UsageError(
                f"executor {spec}: cannot connect to the Dask scheduler ({exc})",
                options=("executor",),
            ) from exc
        return client.get_executor(pure=False), client.close
    raise UsageError(
        f"executor {spec!r}: use process, thread, inline, dask://HOST:PORT, ray or ray://HOST:PORT",
        options=("executor",),
    )


def executor_for(store: Store, spec: ExecutorSpec, verb: str = "packed") -> ExecutorSpec:
    """memory:// lives in this process only: tasks in other processes would see another store."""
    if store.protocol != "memory":
        return spec
    if spec in (None, "process"):
        return "thread"
    if is_dask(spec) or is_ray(spec):
        raise UsageError(
            f"a memory:// root cannot be {verb} by Dask or Ray workers (other processes)"
        )
    return spec


def error_text(exc: BaseException) -> str:
    if isinstance(exc, BrokenProcessPool):
        return "worker process died (killed or out of memory)"
    name = type(exc).__name__
    if name == "KilledWorker":
        return f"Dask worker died ({exc})"
    if name == "RayTaskError" or name.startswith("RayTaskError("):
        return f"Ray task failed ({getattr(exc, 'cause', exc)!r})"
    return f"{name}: {exc}" if not isinstance(exc, SourceError) else str(exc)


@dataclass(frozen=True)
class Task:
    """One unit of work: ``fn(*args)`` on a worker; ``label`` names it in failures and
    progress, ``weight`` is its share of the progress bar (samples)."""

    label: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    weight: int = 1


def run_tasks(
    tasks: Sequence[Task],
    spec: ExecutorSpec,
    workers: int | None,
    progress: Progress,
    *,
    mp_context_name: str | None = None,
    preload: Sequence[str] = (),
    poll_s: float = 1.0,
) -> tuple[list[Any], list[tuple[int, BaseException]]]:
    """Run every task; ``(results, failures)``: results in task order (None where it failed),
    failures as ``(task index, exception)`` (see :func:`error_text`). Ctrl-C cancels what is pending and stops pool workers."""
    results: list[Any] = [None] * len(tasks)
    failures: list[tuple[int, BaseException]] = []
    if not tasks:
        return results, failures
    n = min(workers or os.cpu_count() or 1, len(tasks))
    executor, close = make_executor(spec, n, mp_context_name, preload=preload)
    pending: dict[cf.Future[Any], int] = {}
    interrupted = False
    stop = threading.Event()
    try:
        with _sigint_sets(stop):
            try:
                _wait(tasks, executor, pending, results, failures, progress, poll_s, stop)
                if stop.is_set():  # a Ctrl-C while the last task finished: still a Ctrl-C
                    raise KeyboardInterrupt
            except Exception:
                if stop.is_set():  # a pool broken by the same Ctrl-C is that Ctrl-C
                    raise KeyboardInterrupt from None
                raise
    except KeyboardInterrupt:
        interrupted = True
        for future in pending:
            future.cancel()
        raise
    finally:
        if interrupted and isinstance(executor, cf.ProcessPoolExecutor):
            # Do not wait for running tasks on Ctrl-C: stop the workers now.
            for proc in list(getattr(executor, "_processes", {}).values()):
                proc.terminate()
        close()
    failures.sort(key=lambda f: f[0])
    return results, failures


@contextlib.contextmanager
def _sigint_sets(stop: threading.Event) -> Iterator[None]:
    """Turn Ctrl-C into ``stop.set()`` while tasks run (main thread only).

    A KeyboardInterrupt raised asynchronously inside ``concurrent.futures`` can leave a future's
    lock held, so a worker thread blocks forever on completion; the wait loop raises it instead,
    at a safe point.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda _sig, _frame: stop.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _wait(
    tasks: Sequence[Task],
    executor: cf.Executor,
    pending: dict[cf.Future[Any], int],
    results: list[Any],
    failures: list[tuple[int, BaseException]],
    progress: Progress,
    poll_s: float,
    stop: threading.Event,
) -> None:
    for index, task in enumerate(tasks):
        if stop.is_set():
            raise KeyboardInterrupt
        pending[executor.submit(task.fn, *task.args)] = index

    def in_flight() -> list[str]:
        running = [tasks[i].label for f, i in pending.items() if f.running()]
        return running or [tasks[i].label for i in pending.values()]

    while pending:
        if stop.is_set():
            raise KeyboardInterrupt
        done, _ = cf.wait(list(pending), timeout=min(poll_s, 0.25), return_when=cf.FIRST_COMPLETED)
        for future in done:
            index = pending.pop(future)
            try:
                results[index] = future.result()
            except BaseException as exc:  # noqa: BLE001 - every failure is reported by task
                if isinstance(exc, KeyboardInterrupt):
                    raise
                failures.append((index, exc))
                continue
            progress.update(tasks[index].weight, groups=1)
        progress.poll(in_flight)


def _script_has_main_guard(path: str) -> bool:
    """Whether the script compares ``__name__`` with ``"__main__"`` anywhere (unreadable: yes)."""
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            names = [node.left, *node.comparators]
            if any(isinstance(n, ast.Name) and n.id == "__name__" for n in names) and any(
                isinstance(n, ast.Constant) and n.value == "__main__" for n in names
            ):
                return True
    return False


def check_main_guard(start_method: str | None) -> None:
    """Refuse a process pool that would re-run an unguarded main script in every worker.

    spawn and forkserver workers re-import ``__main__`` from its file; without the guard the
    script's top-level call (a pack, a verify) would run again in each worker, and the pool breaks.
    """
    if start_method == "fork":
        return
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py") or _script_has_main_guard(path):
        return
    raise UsageError(
        f"shardlake runs its tasks in worker processes, and each one re-imports your script "
        f'{path}, which has no `if __name__ == "__main__":` guard, so every worker would run '
        'the script again; put the script\'s top-level code under `if __name__ == "__main__":`, '
        'or use executor="thread" (or executor="inline") to work in this process',
        options=("executor",),
    )
