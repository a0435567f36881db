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

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..errors import SHOW_MAX, ObjectsGoneError, PackWorkerError, SourceError, SourceFilesError
from ..executors.tasks import (
    InlineExecutor,
    Task,
    error_text,
    executor_for,
    make_executor,
    run_tasks,
)
from ..format.layout import DATA_DIR
from ..meta.leases import Lease, gone_error
from ..meta.publish import VersionBody
from ..meta.versions import StoredVersion, Version
from ..progress.bar import Progress, plural
from ..source.tree import SourcePartition
from ..store import Store
from .build import BuildResult, BuildTask, build_partition
from .options import ExecutorSpec, PackOptions
from .plan import PackPlan, PackSettings, check_options, plan_builds, resolve_settings, scan_source
from .publish import NOTHING, publish

__all__ = ["InlineExecutor", "PackReport", "make_executor", "pack"]


@dataclass
class PackReport:
    """The published version plus what the pack did."""

    record: StoredVersion  # the published version's stored record (its partition entries)
    built: list[str] = field(default_factory=list)  # partition paths whose shards were written
    manifest_only: list[str] = field(default_factory=list)  # new manifest over existing shards
    resumed: list[str] = field(default_factory=list)  # revision already complete in the root
    reused: list[str] = field(default_factory=list)  # unchanged since the base: not even read
    carried: list[str] = field(default_factory=list)  # outside a scoped pack's scope
    dropped: list[str] = field(default_factory=list)  # in the base, gone from the source
    skipped_samples: int = 0
    seconds: float = 0.0

    @property
    def version(self) -> Version:
        """The version the pack published (``latest`` names it)."""
        return Version.of(self.record, is_latest=True)

    def to_json(self) -> dict[str, Any]:
        """The report as the ``pack --json`` document."""
        v = self.record
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
        v = self.record
        return (
            f"published {v.tag} ({v.hash}): {plural(v.partition_count, 'partition')}, {plural(v.samples, 'sample')}; "
            f"built {len(self.built)}, manifest-only {len(self.manifest_only)}, "
            f"resumed {len(self.resumed)}, reused {len(self.reused)}, carried {len(self.carried)}, "
            f"dropped {len(self.dropped)}; skipped frames {self.skipped_samples}; "
            f"{self.seconds:.1f}s"
        )


def _describe(part: SourcePartition) -> str:
    return f"{part.path} ({part.id})"


def pack(
    store: Store,
    source: str | os.PathLike[str],
    *,
    tag: str,
    base: str | None,
    options: PackOptions,
    progress_stream: TextIO | None = None,
) -> PackReport:
    """Pack ``source`` into the root ``store`` and publish it as ``tag``; see module docs.

    ``base`` reuses the unchanged partitions of that version; ``options`` holds every other
    setting."""
    started = time.monotonic()
    opts = options
    heartbeat_s = opts.heartbeat_s
    check_options(source, tag, opts)
    executor = _executor_for(store, opts.executor)
    settings = resolve_settings(store, source, tag, base, opts)
    stream = progress_stream or sys.stderr
    if opts.progress or (opts.progress is None and stream.isatty()):  # None: a terminal only
        print(f"shardlake pack: scanning {source}", file=stream, flush=True)
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
        f"{plural(tree.samples, 'sample')} in {plural(len(tree.partitions), 'partition')}; building "
        f"{len(plan.tasks)}, reusing {len(plan.reused)}, carrying {len(plan.carried)}"
    )
    # gc keeps what this pack writes while it runs (docs/storage.md, "gc beside writers").
    covers = [f"{DATA_DIR}/{t.partition.id}/" for t in plan.tasks]
    with Lease(store, "pack", tag=tag, covers=covers) as lease:
        version, outcome = _build_and_publish(
            store, tag, plan, settings, opts, executor, progress, lease
        )
    return PackReport(
        version,
        **outcome,
        reused=plan.reused,
        carried=plan.carried,
        dropped=plan.dropped,
        seconds=time.monotonic() - started,
    )


def _build_and_publish(
    store: Store,
    tag: str,
    plan: PackPlan,
    settings: PackSettings,
    opts: PackOptions,
    executor: ExecutorSpec,
    progress: Progress,
    lease: Lease,
) -> tuple[StoredVersion, dict[str, Any]]:
    with progress:
        try:
            results = _run_builds(
                plan.tasks, executor, opts.workers, opts.mp_context, progress, opts.poll_s
            )
        except ObjectsGoneError as exc:  # a build's objects were removed under it
            raise gone_error(
                store, exc.missing, since_seq=settings.state.seq, lease=lease, what=NOTHING
            ) from exc
    outcome = _collect(plan, results)
    body = VersionBody(
        tag=tag,
        base=settings.base_version.tag if settings.base_version is not None else None,
        partitions=tuple(plan.entries.values()),
        recipe=settings.recipe.to_json(),
        partition_rule=settings.rule.to_json(),
        source_namespace=settings.namespace,
        keep_skipped=opts.keep_skipped,
    )
    version = publish(store, body, settings.state, lease)
    return version, outcome


def _executor_for(store: Store, spec: ExecutorSpec) -> ExecutorSpec:
    return executor_for(store, spec, "packed")


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
    jobs = [Task(_describe(t.partition), build_partition, (t,), t.partition.samples) for t in tasks]
    done, failed = run_tasks(
        jobs,
        spec,
        workers,
        progress,
        mp_context_name=mp_context,
        preload=["shardlake.pack.build"],
        poll_s=poll_s,
    )
    gone = [k for _i, exc in failed if isinstance(exc, ObjectsGoneError) for k in exc.missing]
    if gone:
        raise ObjectsGoneError(f"{plural(len(failed), 'partition build')} failed", missing=gone)
    if failed:
        # Every bad source file of every failed build, one line each (up to SHOW_MAX).
        lines: list[str] = []
        bad_files = 0
        for i, exc in failed:
            if isinstance(exc, SourceFilesError):
                lines.extend(exc.problems)
                bad_files += len(exc.problems)
            else:
                lines.append(f"{jobs[i].label}: {error_text(exc)}")
        files = f" ({plural(bad_files, 'bad source file')})" if bad_files else ""
        more = f"; ... and {len(lines) - SHOW_MAX} more" if len(lines) > SHOW_MAX else ""
        raise PackWorkerError(
            f"{len(failed)} of {plural(len(tasks), 'partition build')} failed{files}; nothing was "
            "published: " + "; ".join(lines[:SHOW_MAX]) + more
        )
    return {t.partition.id: r for t, r in zip(tasks, done, strict=True)}
