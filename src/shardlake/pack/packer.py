"""``pack``: source tree -> verified partition revisions -> one atomically published version.

Order of events (what makes a crash at any point harmless):

1. Check the root, the new tag and ``--base`` before any work.
2. Pass 1: discover and fingerprint the source (stat only).
3. Plan: partitions whose fingerprint, recipe and skip policy match the base are reused as-is;
   in a scoped pack (``--path-list`` / ``--partition``) base partitions outside the scope are
   carried over; otherwise vanished partitions are dropped.
4. Pass 2: build the other partitions in a :class:`concurrent.futures.Executor`. Workers write
   revisions (shards, then the manifest) straight to the store. Any failure -> PackWorkerError,
   nothing published; the finished revisions are reused by the next run.
5. Publish: version document, then the commit record (``latest``), both create-if-absent.
"""

from __future__ import annotations

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
    ConflictError,
    PackWorkerError,
    SourceError,
    UsageError,
    VersionNotFoundError,
)
from ..format.layout import check_name
from ..lifecycle.gc import describe_lock
from ..store import Store, open_store
from ..versions import (
    RootState,
    Version,
    check_new_tag,
    ensure_root,
    load_version,
    publish_version,
    read_state,
)
from .build import BuildResult, BuildTask, Recipe, build_partition
from .options import ExecutorSpec, PackOptions
from .progress import DEFAULT_HEARTBEAT_S, Progress
from .source import PartitionRule, SourcePartition, discover, read_path_list


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

    def summary(self) -> str:
        v = self.version
        return (
            f"published {v.tag} ({v.hash}): {len(v.partitions)} partitions, {v.samples} samples; "
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
    """``(executor, close)`` for ``--executor``: process (default), thread, inline, dask://HOST:PORT,
    or an Executor instance (used as-is, never shut down here)."""
    n = workers or os.cpu_count() or 1
    if n < 1:
        raise UsageError("--workers must be >= 1")
    if isinstance(spec, cf.Executor):
        return spec, lambda: None
    if spec in (None, "process"):
        pool = cf.ProcessPoolExecutor(max_workers=n, mp_context=_mp_context(mp_context))
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
                "--executor dask:// needs the 'dask' extra (pip install shardlake[dask])"
            ) from exc
        address = "tcp://" + spec.split("://", 1)[1]
        try:
            client = distributed.Client(address, timeout="30s")
        except OSError as exc:
            raise UsageError(
                f"--executor {spec}: cannot connect to the Dask scheduler ({exc})"
            ) from exc
        return client.get_executor(pure=False), client.close
    raise UsageError(f"--executor {spec!r}: use process, thread, inline or dask://HOST:PORT")


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
    workers, executor, mp_context = opts.workers, opts.executor, opts.mp_context
    partition_depth, partition_regex = opts.partition_depth, opts.partition_regex
    path_list, partitions = opts.path_list, opts.partitions
    shard_size, level, seed = opts.shard_size, opts.level, opts.seed
    keep_skipped, require_sidecars = opts.keep_skipped, opts.require_sidecars
    replace_all, source_namespace = opts.replace_all, opts.source_namespace
    quiet = not opts.progress
    check_name("tag", tag)
    if shard_size is not None and shard_size < 1:
        raise UsageError("--shard-size must be >= 1 byte")
    if level is not None and not 1 <= level <= 22:
        raise UsageError("--level must be between 1 and 22")
    scoped = path_list is not None or partitions is not None
    if replace_all and scoped:
        raise UsageError(
            "--replace-all rebuilds every partition; it cannot be combined with --path-list or --partition"
        )
    if not os.path.isdir(source):
        raise SourceError(f"{source}: source is not a directory")
    store = open_store(root_url, storage_options)
    if store.protocol == "memory":
        # memory:// lives in this process only: builds in other processes would write elsewhere.
        if executor in (None, "process"):
            executor = "thread"
        elif isinstance(executor, str) and executor.startswith(("dask://", "tcp://")):
            raise UsageError("a memory:// root cannot be packed by Dask workers (other processes)")

    # 1. Root, tag, base.
    ensure_root(store)
    state = read_state(store)
    check_new_tag(state, tag, store)
    base_version: Version | None = None
    if base is not None:
        try:
            base_version = load_version(store, base, state)
        except VersionNotFoundError as exc:
            raise VersionNotFoundError(f"unknown --base {base!r}: {exc}") from exc
    requested_rule = PartitionRule.from_options(partition_depth, partition_regex)
    namespace = source_namespace or os.path.abspath(source)
    base_doc = base_version.doc if base_version is not None else None
    base_recipe = Recipe.from_json(base_doc["recipe"]) if base_doc else Recipe()
    rule = requested_rule or (
        PartitionRule.from_json(base_doc["partition_rule"]) if base_doc else PartitionRule()
    )
    recipe = Recipe(
        level=level if level is not None else base_recipe.level,
        shard_size=shard_size if shard_size is not None else base_recipe.shard_size,
        seed=seed if seed is not None else base_recipe.seed,
    )
    if base_doc is not None and not replace_all:
        base_rule = PartitionRule.from_json(base_doc["partition_rule"])
        problems = []
        if base_rule != rule:
            problems.append(f"partition rule changed ({base_rule.describe()} -> {rule.describe()})")
        if base_doc.get("source_namespace") != namespace:
            problems.append(
                f"source location changed ({base_doc.get('source_namespace')} -> {namespace})"
            )
        if problems:
            raise UsageError(
                f"cannot pack incrementally on --base {base!r}: {'; '.join(problems)}. Pass "
                "--replace-all to rebuild every partition, or --source-namespace NS (the base's "
                "namespace) if the same source was only relocated"
            )
        if scoped and recipe != base_recipe:
            raise UsageError(
                f"a scoped pack (--path-list/--partition) must use the base's recipe {base_recipe.to_json()}"
            )

    # 2. Pass 1.
    if not quiet:
        print(f"shardlake pack: scanning {source}", file=progress_stream or sys.stderr, flush=True)
    paths: list[str] | None
    if path_list is None:
        paths = None
    elif isinstance(path_list, (str, os.PathLike)):
        paths = read_path_list(path_list)
    else:
        paths = list(path_list)
    tree = discover(source, rule, path_list=paths, only_partitions=partitions)
    tree.check_packable()
    if require_sidecars:
        for part in tree.partitions.values():
            missing = part.missing_sidecars
            if missing:
                raise SourceError(
                    f"{tree.root / missing[0]}: no sidecar (--require-sidecars; partition "
                    f"{_describe(part)} lacks {len(missing)})"
                )

    # 3. Plan.
    report_lists: dict[str, list[str]] = {k: [] for k in ("reused", "carried", "dropped")}
    entries: dict[str, dict[str, Any]] = {}
    base_parts: dict[str, dict[str, Any]] = {}
    if base_doc is not None and not replace_all:
        base_parts = {p["id"]: p for p in base_doc["partitions"]}
    reusable = (
        base_doc is not None
        and not replace_all
        and recipe == base_recipe
        and bool(base_doc.get("keep_skipped", False)) == keep_skipped
    )
    tasks: list[BuildTask] = []
    for part in tree.partitions.values():
        old = base_parts.get(part.id)
        if reusable and old is not None and old.get("source_fingerprint") == part.fingerprint():
            entries[part.id] = old
            report_lists["reused"].append(part.path)
        else:
            tasks.append(BuildTask(store, str(tree.root), part, recipe, keep_skipped))
    for pid, old in base_parts.items():
        if pid in tree.partitions:
            continue
        if scoped:
            entries[pid] = old
            report_lists["carried"].append(old["path"])
        else:
            report_lists["dropped"].append(old["path"])

    # 4. Pass 2.
    progress = Progress(
        sum(t.partition.samples for t in tasks),
        len(tasks),
        stream=progress_stream,
        quiet=quiet,
        heartbeat_s=heartbeat_s,
    )
    progress.message(
        f"{tree.samples} samples in {len(tree.partitions)} partitions; building {len(tasks)}, "
        f"reusing {len(report_lists['reused'])}, carrying {len(report_lists['carried'])}"
    )
    results = _run_builds(tasks, executor, workers, mp_context, progress, poll_s)
    built: list[str] = []
    manifest_only: list[str] = []
    resumed: list[str] = []
    skipped_samples = sum(int(entries[pid].get("skipped", 0)) for pid in entries)
    for task in tasks:
        result = results[task.partition.id]
        entries[task.partition.id] = result.entry
        skipped_samples += result.skipped
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
    for entry in entries.values():
        if entry["path"] in seen_paths:
            raise SourceError(
                f"partition path {entry['path']!r} appears twice (ids {seen_paths[entry['path']]}, {entry['id']})"
            )
        seen_paths[entry["path"]] = entry["id"]

    # 5. Publish.
    body = {
        "base": base_version.tag if base_version is not None else None,
        "recipe": recipe.to_json(),
        "partition_rule": rule.to_json(),
        "source_namespace": namespace,
        "keep_skipped": keep_skipped,
        "partitions": list(entries.values()),
    }
    version = _publish(store, tag, body, state, base_version.tag if base_version else None)
    return PackReport(
        version,
        built=built,
        manifest_only=manifest_only,
        resumed=resumed,
        reused=report_lists["reused"],
        carried=report_lists["carried"],
        dropped=report_lists["dropped"],
        skipped_samples=skipped_samples,
        seconds=time.monotonic() - started,
    )


PUBLISH_ATTEMPTS = 10


def _publish(
    store: Store, tag: str, body: dict[str, Any], state: RootState, base: str | None
) -> Version:
    """Publish, tolerating unrelated commits that landed while the (possibly hours-long) pack ran.

    Another commit since ``state`` is retried against the new state as long as the tag is still
    free and the base is still live: the version document is self-contained, so it does not
    depend on what else was published meanwhile. A taken tag is a conflict: exactly one of two
    racing packs of the same tag wins.
    """
    for _ in range(PUBLISH_ATTEMPTS):
        try:
            return publish_version(store, tag, body, state)
        except ConflictError as exc:
            state = read_state(store)
            if state.gc_locked():
                raise ConflictError(
                    f"{store.url}: {describe_lock(state.gc_lock)}; nothing was published by this "
                    "run - re-run after that (finished revisions are reused), or run "
                    "`shardlake gc --break-lock` if that gc is dead"
                ) from exc
            if tag in state.versions or tag in state.retired:
                raise ConflictError(
                    f"{store.url}: version tag {tag!r} was published by another writer while "
                    "this pack ran; nothing was published by this run"
                ) from exc
            if base is not None and base not in state.versions:
                raise ConflictError(
                    f"{store.url}: base version {base!r} was retired while this pack ran; "
                    "nothing was published - re-run (finished revisions are reused)"
                ) from exc
    raise ConflictError(
        f"{store.url}: the commit log kept moving ({PUBLISH_ATTEMPTS} attempts); nothing was "
        "published - re-run (finished revisions are reused)"
    )


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
            progress.partition_done(task.partition.samples, reused=not result.built)
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
