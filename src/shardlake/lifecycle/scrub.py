"""``scrub``: re-read every payload of one or all versions and check CRC-32 and zstd frames.

A mismatch is re-read (bounded) before it is reported, and each problem says whether it is
corrupt at rest (every read agreed) or a transport error (see :mod:`shardlake.read.payloads`).

Memory stays bounded: payloads are fetched per shard in multi-range batches of at most
:data:`~shardlake.lifecycle.common.BATCH_BYTES`, checked and dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..executors.options import RunOptions
from ..executors.tasks import Task, executor_for
from ..format.documents import PartitionEntry
from ..meta.commits import read_state
from ..meta.rootindex import index_problems
from ..meta.versions import versions_for
from ..options import options_class
from ..progress.bar import Progress
from ..store import Store
from .common import (
    FieldsJson,
    Problem,
    check_shard_payloads,
    problem_counts,
    read_manifest_or_report,
    rows_by_shard,
    run_partition_tasks,
    task_problem,
    unique_revisions,
)

__all__ = [
    "ScrubOptions",
    "ScrubReport",
    "scrub",
]


@dataclass
class PartitionScrub(FieldsJson):
    partition: str
    samples: int = 0
    bytes: int = 0
    problems: int = 0


@dataclass
class ScrubReport:
    versions: list[str]
    partitions: list[PartitionScrub] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    # How index.json differs from the commit log and keysets (checked where the store lists).
    index_problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.index_problems

    @property
    def samples(self) -> int:
        return sum(p.samples for p in self.partitions)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.partitions)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "versions": self.versions,
            "samples": self.samples,
            "bytes": self.bytes,
            "partitions": [p.to_json() for p in self.partitions],
            "problems": [p.to_json() for p in self.problems],
            "index_problems": self.index_problems,
            **problem_counts(self.problems),
        }


def _scrub_partition(
    store: Store, entry: PartitionEntry, kwargs: dict[str, Any]
) -> tuple[PartitionScrub, list[Problem]]:
    """One task: every payload of one partition revision (memory: one batch at a time)."""
    pid = entry.id
    part = PartitionScrub(pid)
    problems: list[Problem] = []
    read = read_manifest_or_report(store, entry, problems)
    if read is None:
        part.problems += 1
        return part, problems
    table, _meta = read
    murl = store.key_url(entry.manifest)
    shards = entry.shards
    for shard_index, rows in sorted(rows_by_shard(table).items()):
        if not 0 <= shard_index < len(shards):
            message = f"shard index {shard_index} is not in the version entry"
            problems.append(Problem(pid, murl, rows[0].key, None, message))
            part.problems += 1
            continue
        key = shards[shard_index].key
        for row, _payload, problem in check_shard_payloads(store, pid, key, rows, **kwargs):
            part.samples += 1
            part.bytes += row.size
            if problem is not None:
                part.problems += 1
                problems.append(problem)
    return part, problems


@options_class
@dataclass(frozen=True)
class ScrubOptions(RunOptions):
    """What ``scrub`` re-reads and how.

    Parameters
    ----------
    version
        The version to check (a tag or ``latest``).
    all_versions
        Check every live version instead.
    batch_bytes
        About this many payload bytes read per request (default: the reader's).
    workers, executor, progress
        How it runs (:class:`~shardlake.RunOptions`: one task per partition revision, 4 threads by
        default; zstd and CRC-32 release the GIL).
    """

    version: str = "latest"
    all_versions: bool = False
    batch_bytes: int | None = None


def scrub(store: Store, options: ScrubOptions) -> ScrubReport:
    """Check every payload of ``options.version`` (or every live version); see
    :class:`ScrubReport`. One task per partition revision; memory per task stays below
    ``batch_bytes``. The report does not depend on the executor."""
    progress, batch_bytes = options.progress, options.batch_bytes
    workers = options.worker_count()
    spec = executor_for(store, options.executor, "scrubbed")
    versions = versions_for(store, options.version, options.all_versions)
    report = ScrubReport([v.tag for v in versions])
    entries = unique_revisions(versions)
    bar = Progress(sum(e.samples for e in entries), "scrub", groups=len(entries), enabled=progress)
    kwargs: dict[str, Any] = {} if batch_bytes is None else {"batch_bytes": batch_bytes}
    tasks = [
        Task(f"{e.path} ({e.id})", _scrub_partition, (store, e, kwargs), e.samples) for e in entries
    ]
    results, failures = run_partition_tasks(tasks, spec, workers, bar)
    for index, entry in enumerate(entries):
        if index in failures:
            part = PartitionScrub(entry.id, problems=1)
            problems = [task_problem(entry.id, store.key_url(entry.manifest), failures[index])]
        else:
            part, problems = results[index]
        report.partitions.append(part)
        report.problems.extend(problems)
    if store.backend.read_only is None:  # over HTTP the index is the listing: nothing to compare
        report.index_problems = index_problems(store, read_state(store))
    return report
