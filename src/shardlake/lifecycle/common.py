"""Helpers shared by the lifecycle operations: version closures and batched payload checks."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa

from ..errors import SHOW_MAX as SHOW_MAX  # the reports' cut-off, re-exported
from ..errors import FormatError, IntegrityError, KeyNotFoundError
from ..executors.tasks import ExecutorSpec, Task, error_text, run_tasks
from ..format.codec import Decoder
from ..format.documents import PartitionEntry
from ..format.layout import version_key
from ..format.manifest import ManifestMeta
from ..meta.versions import StoredVersion
from ..progress.bar import Progress
from ..read.manifests import read_entry_manifest
from ..read.payloads import CORRUPT_AT_REST, TRANSPORT, PayloadRef, read_payloads
from ..store import Store

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "FieldsJson",
    "Problem",
    "ShardRow",
    "check_shard_payloads",
    "problem_counts",
    "read_manifest_or_report",
    "rows_by_shard",
    "run_partition_tasks",
    "shards_progress",
    "task_problem",
    "unique_revisions",
    "version_closure",
]

# Payload bytes fetched per multi-range read: the memory bound of scrub/verify/export.
BATCH_BYTES = 32 * 2**20


class FieldsJson:
    """Mixin for a report dataclass whose JSON is exactly its fields (``asdict``)."""

    def to_json(self: DataclassInstance) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Problem:
    """One integrity finding, naming where it is."""

    partition: str
    shard: str  # store URL of the shard (or manifest)
    key: str | None
    offset: int | None
    message: str
    # CORRUPT_AT_REST (every read agreed) or TRANSPORT (reads disagreed / the store failed)
    kind: str = CORRUPT_AT_REST

    def __str__(self) -> str:
        where = self.shard
        if self.key is not None:
            where += f" key {self.key!r}"
        if self.offset is not None:
            where += f" offset {self.offset}"
        return f"{where}: {self.message} ({self.kind})"

    @property
    def corrupt_at_rest(self) -> bool:
        """Every read agreed on the wrong bytes: the stored object is bad (else: transport)."""
        return self.kind == CORRUPT_AT_REST

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "shard": self.shard,
            "key": self.key,
            "offset": self.offset,
            "message": self.message,
            "kind": self.kind,
        }


def manifest_problem(pid: str, manifest_url: str, exc: FormatError) -> Problem:
    """The problem of a manifest that could not be used: corrupt at rest unless its reads
    disagreed (a manifest damaged in transit on every read is not a damaged manifest)."""
    message = str(exc).removeprefix(f"{manifest_url}: ")
    return Problem(pid, manifest_url, None, None, message, getattr(exc, "kind", CORRUPT_AT_REST))


def read_manifest_or_report(
    store: Store, entry: PartitionEntry, problems: list[Problem]
) -> tuple[pa.Table, ManifestMeta] | None:
    """The manifest ``entry`` names, or None with why it is unusable appended to ``problems``."""
    try:
        return read_entry_manifest(store, entry)
    except FormatError as exc:
        problems.append(manifest_problem(entry.id, store.key_url(entry.manifest), exc))
        return None


def problem_counts(problems: Iterable[Problem]) -> dict[str, int]:
    """``{"corrupt_at_rest": n, "transport_errors": m}`` for a report's problems (verify's
    source differences are neither)."""
    kinds = [p.kind for p in problems]
    return {
        "corrupt_at_rest": kinds.count(CORRUPT_AT_REST),
        "transport_errors": kinds.count(TRANSPORT),
    }


def version_closure(store: Store, version: StoredVersion) -> dict[str, int | None]:
    """Every object ``version`` needs: key -> expected size (None where unknown)."""
    out: dict[str, int | None] = {version_key(version.tag, version.hash): None}
    out.update({ref.key: ref.size for ref in version.catalog_objects()})
    for entry in version.entries:
        out[entry.manifest] = None
        out.update((shard.key, shard.size) for shard in entry.shards)
    return out


def unique_revisions(versions: Iterable[StoredVersion]) -> list[PartitionEntry]:
    """Partition entries of ``versions``, each (partition, manifest) once."""
    seen: dict[tuple[str, str], PartitionEntry] = {}
    for version in versions:
        for entry in version.entries:
            seen.setdefault((entry.id, entry.manifest), entry)
    return list(seen.values())


class ShardRow(NamedTuple):
    """One manifest row's payload in its shard: the core columns the checks read."""

    key: str
    shard: int
    member: int
    offset: int
    size: int
    raw_size: int | None
    crc32: int
    source_sha256: str | None = None  # of the source npz at pack time (None: not recorded)


def rows_by_shard(table: pa.Table) -> dict[int, list[ShardRow]]:
    """Core manifest rows grouped by shard index, each group sorted by payload offset."""
    columns = [table.column(name).to_pylist() for name in ShardRow._fields]
    groups: dict[int, list[ShardRow]] = {}
    for values in zip(*columns, strict=True):
        row = ShardRow(*values)
        groups.setdefault(row.shard, []).append(row)
    for rows in groups.values():
        rows.sort(key=lambda r: r.offset)
    return groups


def check_shard_payloads(
    store: Store,
    pid: str,
    shard_key: str,
    rows: Sequence[ShardRow],
    *,
    decode: bool = True,
    batch_bytes: int = BATCH_BYTES,
    on_bytes: Any = None,
) -> Iterator[tuple[ShardRow, bytes | None, Problem | None]]:
    """Read ``rows``' payloads from one shard in bounded batches and check each.

    Payloads go through the one read path (:func:`shardlake.read.read_payloads`): a mismatch is
    re-read before it is reported, and each problem says whether it is corrupt at rest or a
    transport error. Yields ``(row, payload, problem)``: the payload when it is intact, else a
    :class:`Problem` naming shard, key and offset. A missing shard yields one problem per row.
    """
    decoder = Decoder()
    url = store.key_url(shard_key)
    start = 0
    while start < len(rows):
        end, size = start, 0
        while end < len(rows) and (end == start or size + rows[end].size <= batch_bytes):
            size += rows[end].size
            end += 1
        batch = rows[start:end]
        try:
            results = read_payloads(store, [payload_ref(shard_key, row) for row in batch])
        except KeyNotFoundError:
            for i, row in enumerate(rows[start:]):
                msg = (
                    "shard is missing" if i == 0 and start == 0 else "shard is missing (see above)"
                )
                yield row, None, Problem(pid, url, row.key, row.offset, msg)
            return
        for row, result in zip(batch, results, strict=True):
            problem, kind = result.problem, result.kind
            if result.payload is not None and decode:
                problem = _decode_problem(decoder, result.payload, row)
                kind = CORRUPT_AT_REST  # the bytes match the manifest's CRC: they are stored so
            if on_bytes is not None:
                on_bytes(len(result.payload or b""))
            if problem is None:
                yield row, result.payload, None
            else:
                where = (pid, url, row.key, row.offset)
                yield row, None, Problem(*where, problem, kind or CORRUPT_AT_REST)
        start = end


def payload_ref(shard_key: str, row: ShardRow) -> PayloadRef:
    """The read-path reference of one manifest row's payload."""
    return PayloadRef(shard_key, row.offset, row.size, row.crc32, row.key)


def _decode_problem(decoder: Decoder, payload: bytes, row: ShardRow) -> str | None:
    try:
        raw = decoder.decompress(payload)
    except IntegrityError as exc:
        return str(exc).split(": ", 1)[-1]
    if row.raw_size is not None and len(raw) != row.raw_size:
        return f"decompressed size {len(raw)}, manifest says {row.raw_size}"
    return None


def shards_progress(entries: Sequence[PartitionEntry], what: str, enabled: bool | None) -> Progress:
    """A bar counting the shards of ``entries``, one group per partition."""
    return Progress(
        sum(len(e.shards) for e in entries),
        what,
        unit="shards",
        groups=len(entries),
        enabled=enabled,
    )


def run_partition_tasks(
    tasks: Sequence[Task],
    executor: ExecutorSpec,
    workers: int,
    bar: Progress,
) -> tuple[list[Any], dict[int, BaseException]]:
    """Run per-partition tasks (default: ``workers`` threads); ``(results, failures by task
    index)``. The caller reports each failure by partition: nothing is silently lost."""
    spec = "thread" if executor is None else executor
    with bar:
        results, failures = run_tasks(tasks, spec, max(1, workers), bar)
    return results, dict(failures)


def task_problem(pid: str, where: str, exc: BaseException) -> Problem:
    """A task that died (worker killed, store unreachable): reported against its partition."""
    return Problem(pid, where, None, None, f"check did not finish: {error_text(exc)}", TRANSPORT)
