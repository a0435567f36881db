"""``pack``: source tree -> verified partition revisions -> one atomically published version.

The stages, in order (what makes a crash at any point harmless); this module drives them:

1. Settings (:mod:`.plan`): check the options, the root, the new tag and ``--base`` before any
   work.
2. Discover (:mod:`.plan` over :mod:`.source`): pass 1 fingerprints the source (stat only).
3. Plan (:mod:`.plan`): partitions whose fingerprint, recipe and skip policy match the base are reused as-is;
   in a scoped pack (``--path-list`` / ``--partition``) base partitions outside the scope are
   carried over; otherwise vanished partitions are dropped.
4. Build (:mod:`.build`, run here): pass 2 builds the other partitions in a :class:`concurrent.futures.Executor`. Workers write
   revisions (shards, then the manifest) straight to the store. Any failure -> PackWorkerError,
   nothing published; the finished revisions are reused by the next run.
5. Publish (:mod:`.publish`): version document, then the commit record (``latest``), both create-if-absent.
"""

from __future__ import annotations

import ast
import concurrent.futures as cf
import contextlib
import dataclasses
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..errors import (
    PackWorkerError,
    SourceError,
    UsageError,
)
from ..meta.versions import (
    Version,
)
from ..progress.bar import DEFAULT_HEARTBEAT_S, Progress
from ..source.tree import SourcePartition
from ..store import Store, open_store
from .build import BuildResult, BuildTask, build_partition
from .options import ExecutorSpec, PackOptions
from .plan import PackPlan, check_options, plan_builds, resolve_settings, scan_source
from .publish import publish


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


@dataclass
class PackReport:
    """The published version plus what the pack did."""

    version: Version
    built: list[str] = field(default_factory=list)  # partition paths whose shards were written
    manifest_only: list[str] = field(default_factory=list)  # new manifest over existing shards
    resumed: list[str] = field(default_factory=list)  # revision already complete in the root
    reused: list[str] = field(default_factory=list)  # unchanged since the base: not even read
    carried: list[str] = field(default_factory=list)  # outside a scoped pack's scope
    dropped: list[str] = field(default_factory=list)  # in the base, gone from the source
    skipped_samples: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The report as the ``pack --json`` document."""
        v = self.version
        return {
            "tag": v.tag,
            "hash": v.hash,
            "samples": v.samples,
            "partitions": v.partition_count,
            "built": self.built,
            "manifest_only": self.manifest_only,
            "resumed": self.resumed,
            "reused": self.reused,
            "carried": self.carried,
            "dropped": self.dropped,
            "skipped_samples": self.skipped_samples,
            "seconds": round(self.seconds, 3),
        }

    def summary(self) -> str:
        v = self.version
        return (
            f"published {v.tag} ({v.hash}): {v.partition_count} partitions, {v.samples} samples; "
            f"built {len(self.built)}, manifest-only {len(self.manifest_only)}, "
            f"resumed {len(self.resumed)}, reused {len(self.reused)}, carried {len(self.carried)}, "
            f"dropped {len(self.dropped)}; skipped frames {self.skipped_samples}; "
            f"{self.seconds:.1f}s"
        )


def _mp_context(name: str | None) -> Any:
    if name is None:
        # forkserver: workers do not inherit the parent's threads (s3fs loops, servers) or locks.
        name = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(name)
    if name == "forkserver":
        ctx.set_forkserver_preload(["shardlake.pack.build"])
    return ctx


def make_executor(
    spec: ExecutorSpec, workers: int | None, mp_context: str | None = None
) -> tuple[cf.Executor, Callable[[], None]]:
    """``(executor, close)`` for an executor spec: process (default), thread, inline, dask://HOST:PORT,
    or an Executor instance (used as-is, never shut down here)."""
    n = workers or os.cpu_count() or 1
    if n < 1:
        raise UsageError("workers must be >= 1", options=("workers",))
    if isinstance(spec, cf.Executor):
        return spec, lambda: None
    if spec in (None, "process"):
        ctx = _mp_context(mp_context)
        check_main_guard(ctx.get_start_method())
        pool = cf.ProcessPoolExecutor(max_workers=n, mp_context=ctx)
        return pool, lambda: pool.shutdown(wait=True, cancel_futures=True)
    if spec == "thread":
        tpool = cf.ThreadPoolExecutor(max_workers=n, thread_name_prefix="shardlake-pack")
        return tpool, lambda: tpool.shutdown(wait=True, cancel_futures=True)
    if spec == "inline":
        return InlineExecutor(), lambda: None
    if isinstance(spec, str) and spec.startswith(("dask://", "tcp://")):
        try:
            import distributed
        except ImportError as exc:
            raise UsageError(
                "a dask:// executor needs the 'dask' extra (pip install shardlake[dask])"
            ) from exc
        address = "tcp://" + spec.split("://", 1)[1]
        try:
            client = distributed.Client(address, timeout="30s")
        except OSError as exc:
            raise UsageError(
                f"executor {spec}: cannot connect to the Dask scheduler ({exc})",
                options=("executor",),
            ) from exc
        return client.get_executor(pure=False), client.close
    raise UsageError(
        f"executor {spec!r}: use process, thread, inline or dask://HOST:PORT",
        options=("executor",),
    )


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
    script's top-level ``pack`` call would run again in each worker, and the pool breaks.
    """
    if start_method == "fork":
        return
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py") or _script_has_main_guard(path):
        return
    raise UsageError(
        f"pack builds in worker processes, and each one re-imports your script {path}, which "
        'has no `if __name__ == "__main__":` guard, so every worker would run the script '
        'again; put the script\'s top-level code under `if __name__ == "__main__":`, or pack '
        'with executor="thread" (or executor="inline") to build in this process',
        options=("executor",),
    )


def _describe(part: SourcePartition) -> str:
    return f"{part.path} ({part.id})"


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, BrokenProcessPool):
        return "worker process died (killed or out of memory)"
    name = type(exc).__name__
    if name == "KilledWorker":
        return f"Dask worker died ({exc})"
    return f"{name}: {exc}" if not isinstance(exc, SourceError) else str(exc)


def pack_with_report(
    source: str | os.PathLike[str],
    root_url: str | Store,
    *,
    tag: str,
    base: str | None = None,
    options: PackOptions | None = None,
    storage_options: dict[str, Any] | None = None,
    progress_stream: TextIO | None = None,
    heartbeat_s: float = DEFAULT_HEARTBEAT_S,
    poll_s: float = 1.0,
    **overrides: Any,
) -> PackReport:
    """Pack ``source`` into the root at ``root_url`` and publish it as ``tag``; see module docs.

    ``options`` holds every other setting; keyword ``overrides`` replace single fields of it.
    """
    started = time.monotonic()
    opts = dataclasses.replace(options or PackOptions(), **overrides)
    check_options(source, tag, opts)
    store = open_store(root_url, storage_options)
    executor = _executor_for(store, opts.executor)
    settings = resolve_settings(store, source, tag, base, opts)
    if opts.progress:
        print(f"shardlake pack: scanning {source}", file=progress_stream or sys.stderr, flush=True)
    tree = scan_source(source, settings.rule, opts)
    plan = plan_builds(store, tree, settings, opts)
    progress = Progress(
        sum(t.partition.samples for t in plan.tasks),
        "shardlake pack",
        groups=len(plan.tasks),
        enabled=opts.progress,
        stream=progress_stream,
        heartbeat_s=heartbeat_s,
    )
    progress.message(
        f"{tree.samples} samples in {len(tree.partitions)} partitions; building "
        f"{len(plan.tasks)}, reusing {len(plan.reused)}, carrying {len(plan.carried)}"
    )
    with progress:
        results = _run_builds(plan.tasks, executor, opts.workers, opts.mp_context, progress, poll_s)
    outcome = _collect(plan, results)
    base_tag = settings.base_version.tag if settings.base_version is not None else None
    body = {
        "base": base_tag,
        "recipe": settings.recipe.to_json(),
        "partition_rule": settings.rule.to_json(),
        "source_namespace": settings.namespace,
        "keep_skipped": opts.keep_skipped,
        "partitions": [e.to_json() for e in plan.entries.values()],
    }
    version = publish(store, tag, body, settings.state, base_tag)
    return PackReport(
        version,
        **outcome,
        reused=plan.reused,
        carried=plan.carried,
        dropped=plan.dropped,
        seconds=time.monotonic() - started,
    )


def _executor_for(store: Store, spec: ExecutorSpec) -> ExecutorSpec:
    """memory:// lives in this process only: builds in other processes would write elsewhere."""
    if store.protocol != "memory":
        return spec
    if spec in (None, "process"):
        return "thread"
    if isinstance(spec, str) and spec.startswith(("dask://", "tcp://")):
        raise UsageError("a memory:// root cannot be packed by Dask workers (other processes)")
    return spec


def _collect(plan: PackPlan, results: dict[str, BuildResult]) -> dict[str, Any]:
    """Fold build results into the plan's entries; the report's build outcome fields."""
    built: list[str] = []
    manifest_only: list[str] = []
    resumed: list[str] = []
    skipped = sum(e.skipped for e in plan.entries.values())
    for task in plan.tasks:
        result = results[task.partition.id]
        plan.entries[task.partition.id] = result.entry
        skipped += result.skipped
        if result.built:
            built.append(task.partition.path)
        elif result.manifest_written:
            manifest_only.append(task.partition.path)
        else:
            resumed.append(task.partition.path)
    # A key belongs to exactly one partition (the rule is a function of the key, and the base
    # used the same rule); keys were unique within each partition at discovery. So unique
    # partition paths make keys unique across the version: O(total keys) overall.
    seen_paths: dict[str, str] = {}
    for entry in plan.entries.values():
        if entry.path in seen_paths:
            raise SourceError(
                f"partition path {entry.path!r} appears twice (ids {seen_paths[entry.path]}, {entry.id})"
            )
        seen_paths[entry.path] = entry.id
    return {
        "built": built,
        "manifest_only": manifest_only,
        "resumed": resumed,
        "skipped_samples": skipped,
    }


def _run_builds(
    tasks: list[BuildTask],
    spec: ExecutorSpec,
    workers: int | None,
    mp_context: str | None,
    progress: Progress,
    poll_s: float,
) -> dict[str, BuildResult]:
    """Run every build; any failure -> :class:`PackWorkerError` naming the partitions."""
    results: dict[str, BuildResult] = {}
    if not tasks:
        return results
    executor, close = make_executor(
        spec, min(workers or os.cpu_count() or 1, len(tasks)), mp_context
    )
    failures: list[str] = []
    pending: dict[cf.Future[BuildResult], BuildTask] = {}
    interrupted = False
    stop = threading.Event()
    try:
        with _sigint_sets(stop):
            _wait_builds(tasks, executor, pending, results, failures, progress, poll_s, stop)
    except KeyboardInterrupt:
        interrupted = True
        for future in pending:
            future.cancel()
        raise
    finally:
        if interrupted and isinstance(executor, cf.ProcessPoolExecutor):
            # Do not wait for running builds on Ctrl-C: stop the workers now.
            for proc in list(getattr(executor, "_processes", {}).values()):
                proc.terminate()
        close()
    if failures:
        raise PackWorkerError(
            f"{len(failures)} of {len(tasks)} partition build(s) failed; nothing was published: "
            + "; ".join(failures)
        )
    return results


@contextlib.contextmanager
def _sigint_sets(stop: threading.Event) -> Iterator[None]:
    """Turn Ctrl-C into ``stop.set()`` while builds run (main thread only).

    A KeyboardInterrupt raised asynchronously inside ``concurrent.futures`` can leave a future's
    lock held, so a build thread blocks forever on completion; the wait loop raises it instead,
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


def _wait_builds(
    tasks: list[BuildTask],
    executor: cf.Executor,
    pending: dict[cf.Future[BuildResult], BuildTask],
    results: dict[str, BuildResult],
    failures: list[str],
    progress: Progress,
    poll_s: float,
    stop: threading.Event,
) -> None:
    """Submit every build and collect results until done or ``stop`` (Ctrl-C) is set."""
    for task in tasks:
        if stop.is_set():
            raise KeyboardInterrupt
        pending[executor.submit(build_partition, task)] = task

    def in_flight() -> list[str]:
        running = [_describe(t.partition) for f, t in pending.items() if f.running()]
        return running or [_describe(t.partition) for t in pending.values()]

    while pending:
        if stop.is_set():
            raise KeyboardInterrupt
        done, _ = cf.wait(list(pending), timeout=min(poll_s, 0.25), return_when=cf.FIRST_COMPLETED)
        for future in done:
            task = pending.pop(future)
            try:
                result = future.result()
            except BaseException as exc:  # noqa: BLE001 - every failure is reported by partition
                if isinstance(exc, KeyboardInterrupt):
                    raise
                failures.append(f"{_describe(task.partition)}: {_error_text(exc)}")
                continue
            results[task.partition.id] = result
            progress.update(task.partition.samples, groups=1)
        progress.poll(in_flight)


def pack(
    source: str | os.PathLike[str],
    root_url: str | Store,
    *,
    tag: str,
    base: str | None = None,
    **options: Any,
) -> Version:
    """Pack ``source`` into ``root_url`` and publish ``tag``; returns the published version.

    Options are those of :func:`pack_with_report` (``workers``, ``executor``, ``shard_size``,
    ``partition_depth``/``partition_regex``, ``path_list``, ``partitions``, ...).
    """
    return pack_with_report(source, root_url, tag=tag, base=base, **options).version
