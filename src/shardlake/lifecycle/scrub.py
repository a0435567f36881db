"""``scrub``: re-read every payload of one or all versions and check CRC-32 and zstd frames.

A mismatch is re-read (bounded) before it is reported, and each problem says whether it is
corrupt at rest (every read agreed) or a transport error (see :mod:`shardlake.read.payloads`).

Memory stays bounded: payloads are fetched per shard in multi-range batches of at most
:data:`~shardlake.lifecycle.common.BATCH_BYTES`, checked and dropped.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..progress.bar import Progress
from ..store import Store, open_store
from .common import (
    DEFAULT_WORKERS,
    Problem,
    ShardRow,
    check_shard_payloads,
    problem_counts,
    read_manifest_or_report,
    rows_by_shard,
    unique_revisions,
    versions_for,
)


@dataclass
class PartitionScrub:
    partition: str
    samples: int = 0
    bytes: int = 0
    problems: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "samples": self.samples,
            "bytes": self.bytes,
            "problems": self.problems,
        }


@dataclass
class ScrubReport:
    versions: list[str]
    partitions: list[PartitionScrub] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

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
            **problem_counts(self.problems),
        }


def _scrub_shard(
    store: Store, pid: str, shard_key: str, rows: list[ShardRow], kwargs: dict[str, Any]
) -> tuple[int, int, list[Problem]]:
    samples = size = 0
    problems: list[Problem] = []
    for row, _payload, problem in check_shard_payloads(store, pid, shard_key, rows, **kwargs):
        samples += 1
        size += row.size
        if problem is not None:
            problems.append(problem)
    return samples, size, problems


def scrub(
    url: str | Store,
    version: str | None = "latest",
    *,
    all_versions: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: bool | None = None,
    batch_bytes: int | None = None,
    workers: int = DEFAULT_WORKERS,
) -> ScrubReport:
    """Check every payload of ``version`` (or every live version); see :class:`ScrubReport`.

    ``workers`` shards are checked at once (threads: zstd and CRC-32 release the GIL, and
    object-store reads overlap); memory stays below ``workers`` x ``batch_bytes``.
    """
    store = open_store(url, storage_options)
    versions = versions_for(store, version, all_versions)
    report = ScrubReport([v.tag for v in versions])
    entries = unique_revisions(versions)
    bar = Progress(sum(e.samples for e in entries), "scrub", enabled=progress)
    kwargs: dict[str, Any] = {} if batch_bytes is None else {"batch_bytes": batch_bytes}
    tasks: list[tuple[PartitionScrub, str, list[ShardRow]]] = []
    for entry in entries:
        pid = entry.id
        part = PartitionScrub(pid)
        report.partitions.append(part)
        murl = store.key_url(entry.manifest)
        read = read_manifest_or_report(store, entry, report.problems)
        if read is None:
            part.problems += 1
            continue
        table, _meta = read
        shards = entry.shards
        for shard_index, rows in sorted(rows_by_shard(table).items()):
            if not 0 <= shard_index < len(shards):
                message = f"shard index {shard_index} is not in the version entry"
                report.problems.append(Problem(pid, murl, rows[0].key, None, message))
                part.problems += 1
                continue
            tasks.append((part, shards[shard_index].key, rows))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [
            pool.submit(_scrub_shard, store, part.partition, key, rows, kwargs)
            for part, key, rows in tasks
        ]
        for (part, _key, _rows), future in zip(tasks, futures, strict=True):
            samples, size, problems = future.result()
            part.samples += samples
            part.bytes += size
            part.problems += len(problems)
            report.problems.extend(problems)
            bar.update(samples)
    bar.close()
    return report
