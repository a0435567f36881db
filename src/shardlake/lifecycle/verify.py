"""``verify`` (the conversion gate) and ``verify-offsets`` (manifests vs tar headers).

``verify`` proves a version equals its source tree: membership both ways (every non-skipped
source sample present, nothing extra; ``allow_missing`` means exactly that many missing), every
sample decoded and compared bit-exactly (names, order, dtype, shape, bytes) to its source npz,
and the partition count. A sample whose stored bytes match the shard's checksum but differ from
the source is the source differing (``source changed``: the file changed since pack, or cannot be
read), not corruption at rest: that stays what ``scrub`` also finds.

``verify-offsets`` parses every shard's tar headers independently of the manifest and checks
each manifest row's member index, name, payload offset and size against them, and each
manifest's embedded metadata against the version entry naming it (a swapped manifest shows).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import (
    SHOW_MAX,
    FormatError,
    IntegrityError,
    KeyNotFoundError,
    ShardlakeError,
    SourceError,
    UsageError,
)
from ..executors.options import RunOptions
from ..executors.tasks import Task, executor_for
from ..format.codec import Decoder, arrays_equal_exact
from ..format.documents import PartitionEntry, ShardEntry
from ..format.layout import member_name
from ..format.manifest import CORE_COLUMNS, METADATA_MISMATCH, entry_mismatches
from ..format.tar import iter_members
from ..meta.catalog import catalog_mismatch, catalog_rows, rows_by_partition
from ..meta.versions import load_version
from ..options import options_class
from ..progress.bar import Progress, plural
from ..read.payloads import TRANSPORT
from ..source.npz import load_npz
from ..source.tree import scoped_frame_keys
from ..store import Store
from .common import (
    Problem,
    ShardRow,
    check_shard_payloads,
    problem_counts,
    read_manifest_or_report,
    rows_by_shard,
    run_partition_tasks,
    shards_progress,
    task_problem,
)

__all__ = [
    "OffsetsOptions",
    "OffsetsReport",
    "VerifyOptions",
    "VerifyReport",
    "check_shard_headers",
    "member_problem",
    "verify_offsets",
    "verify_version",
]

NPZ = ".npz"
SIDECAR = ".json"
# The kind of a problem whose shard bytes are intact (checksum matched) but whose source differs.
SOURCE_CHANGED = "source changed"


@dataclass
class VerifyReport:
    version: str
    source: str = ""
    partitions: int = 0
    expected_partitions: int | None = None
    source_samples: int = 0
    version_samples: int = 0
    compared: int = 0
    allow_missing: int = 0
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            not self.extra
            and not self.problems
            and len(self.missing) == self.allow_missing
            and (self.expected_partitions is None or self.partitions == self.expected_partitions)
        )

    def failures(self) -> list[str]:
        out = []
        if len(self.missing) != self.allow_missing:
            out.append(
                f"{plural(len(self.missing), 'source sample')} missing, expected exactly {self.allow_missing}"
            )
        if self.extra:
            out.append(f"{plural(len(self.extra), 'sample')} not in the source")
        if self.problems:
            counts = verify_counts(self.problems)
            out.append(
                f"{plural(len(self.problems), 'sample')} differ or are unreadable "
                f"({counts['corrupt_at_rest']} corrupt at rest, "
                f"{plural(counts['transport_errors'], 'transport error')}, "
                f"{counts['source_changed']} source changed)"
            )
        if self.expected_partitions is not None and self.partitions != self.expected_partitions:
            out.append(
                f"{plural(self.partitions, 'partition')}, expected {self.expected_partitions}"
            )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "version": self.version,
            "source": self.source,
            "partitions": self.partitions,
            "expected_partitions": self.expected_partitions,
            "source_samples": self.source_samples,
            "version_samples": self.version_samples,
            "compared": self.compared,
            "missing": len(self.missing),
            "missing_keys": self.missing[:SHOW_MAX],
            "extra": len(self.extra),
            "extra_keys": self.extra[:SHOW_MAX],
            "problems": [p.to_json() for p in self.problems[:SHOW_MAX]],
            "problem_count": len(self.problems),
            **verify_counts(self.problems),
            "failures": self.failures(),
        }


def verify_counts(problems: Sequence[Problem]) -> dict[str, int]:
    """:func:`problem_counts` plus ``source_changed``: samples intact in their shard that
    differ from (or cannot be read in) the source."""
    changed = sum(1 for p in problems if p.kind == SOURCE_CHANGED)
    return {**problem_counts(problems), "source_changed": changed}


def _source_samples(source: Store, keep_skipped: bool) -> tuple[set[str], set[str]]:
    """``(expected, optional)`` keys of the source tree; skipped frames are optional."""
    keys = source.list("")
    npz = {k[: -len(NPZ)] for k in keys if k.endswith(NPZ)}
    sidecars = {k[: -len(SIDECAR)] for k in keys if k.endswith(SIDECAR)}
    expected: set[str] = set()
    optional: set[str] = set()
    for key in npz:
        skipped = False
        if key in sidecars and not keep_skipped:
            try:
                doc = json.loads(source.read(key + SIDECAR))
                skipped = isinstance(doc, dict) and doc.get("is_skipped") is True
            except ValueError:
                skipped = False  # a malformed sidecar: the sample is expected, compare shows it
        (optional if skipped else expected).add(key)
    return expected, optional


def _scoped(
    source: Store, opts: VerifyOptions, expected: set[str], optional: set[str]
) -> tuple[set[str], set[str]]:
    """``expected`` and ``optional`` narrowed to ``opts.only_keys``, or to the frames pack's
    scoping options (``path_list``, ``include``, ``exclude``) select."""
    if opts.only_keys is not None:
        wanted = set(opts.only_keys)
        return expected & wanted, optional & wanted
    if opts.path_list is None and not opts.include and not opts.exclude:
        return expected, optional
    wanted = scoped_frame_keys(
        expected | optional,
        # absolute path-list entries map through the tree's own path where it is local
        source=source.root if source.protocol == "file" else None,
        path_list=opts.path_list,
        strip_prefix=opts.strip_prefix,
        include=opts.include,
        exclude=opts.exclude,
    )
    return expected & wanted, optional & wanted


@options_class
@dataclass(frozen=True)
class VerifyOptions(RunOptions):
    """How ``verify`` compares a version with its source tree.

    Parameters
    ----------
    version
        The version to check (a tag or ``latest``).
    allow_missing
        Accept exactly this many source frames absent from the version.
    expected_partitions
        Fail unless the version has exactly this many partitions.
    path_list, strip_prefix, include, exclude
        Scope the source as pack did (a path-list file; its prefix; glob patterns).
    only_keys
        Compare only these sample keys (``path_list`` computes them).
    workers, executor, progress
        How it runs (:class:`~shardlake.RunOptions`: one task per partition, 4 threads by default).
    """

    version: str = "latest"
    allow_missing: int | None = None
    expected_partitions: int | None = None
    path_list: str | os.PathLike[str] | None = None
    strip_prefix: str | None = None
    include: Sequence[str] = ()
    exclude: Sequence[str] = ()
    only_keys: Collection[str] | None = None


def verify_version(store: Store, source: Store, options: VerifyOptions) -> VerifyReport:
    """Compare ``options.version`` with the source tree in the opened store ``source``; see
    :class:`VerifyReport`. One task per partition runs on ``options.executor``."""
    opts = options
    if opts.allow_missing is not None and opts.allow_missing < 0:
        raise UsageError("allow_missing must be >= 0", options=("allow_missing",))
    version, allow_missing = opts.version, opts.allow_missing
    expected_partitions, progress, workers = (
        opts.expected_partitions,
        opts.progress,
        opts.worker_count(),
    )
    spec = executor_for(store, opts.executor, "verified")
    spec = executor_for(source, spec, "verified")
    ver = load_version(store, version)
    report = VerifyReport(ver.tag, source.url, ver.partition_count, expected_partitions)
    report.allow_missing = allow_missing or 0
    expected, optional = _scoped(source, opts, *_source_samples(source, ver.record.keep_skipped))
    if not expected and not optional:
        raise SourceError(f"{source.url}: no .npz files here; is this the source tree?")
    report.source_samples = len(expected)
    present: set[str] = set()
    entries = ver.entries
    bar = Progress(ver.samples, "verify", groups=len(entries), enabled=progress)
    known = expected | optional
    tasks = [
        Task(f"{e.path} ({e.id})", _verify_partition, (store, source, e), e.samples)
        for e in entries
    ]
    # One task per partition: the worker reads the manifest, every payload and its source npz;
    # the client keeps only keys, so membership is decided here, the same for any executor.
    results, failures = run_partition_tasks(tasks, spec, workers, bar)
    for index, entry in enumerate(entries):
        if index in failures:
            murl = store.key_url(entry.manifest)
            report.problems.append(task_problem(entry.id, murl, failures[index]))
            continue
        result: _PartitionResult = results[index]
        report.problems.extend(result.problems)
        present.update(result.present)
        for key, problem, compared in result.rows:
            present.add(key)
            if key not in known:
                report.extra.append(key)
                continue
            if problem is not None:
                report.problems.append(problem)
            report.compared += compared
    report.version_samples = len(present)
    report.missing = sorted(expected - present)
    report.extra.sort()
    return report


@dataclass
class _PartitionResult:
    problems: list[Problem] = field(default_factory=list)
    present: list[str] = field(default_factory=list)  # keys of rows naming no shard
    # (key, problem, compared) of every row: membership is decided by the client
    rows: list[tuple[str, Problem | None, bool]] = field(default_factory=list)


def _verify_partition(store: Store, source: Store, entry: PartitionEntry) -> _PartitionResult:
    """One task: every payload of one partition decoded and compared with its source npz; an
    unreadable manifest or a row naming a shard the entry lacks is reported."""
    out = _PartitionResult()
    pid = entry.id
    read = read_manifest_or_report(store, entry, out.problems)
    if read is None:
        return out
    table, _meta = read
    murl = store.key_url(entry.manifest)
    for index, rows in sorted(rows_by_shard(table).items()):
        if not 0 <= index < len(entry.shards):
            message = f"shard index {index} is not in the version entry"
            out.problems.append(Problem(pid, murl, rows[0].key, None, message))
            out.present.extend(r.key for r in rows)
            continue
        out.rows.extend(_check_shard(store, source, pid, entry.shards[index].key, rows))
    return out


def _check_shard(
    store: Store, source: Store, pid: str, shard: str, rows: list[ShardRow]
) -> list[tuple[str, Problem | None, bool]]:
    """``(key, problem, compared)`` of every payload of one shard, decoded and compared with
    its source npz."""
    out: list[tuple[str, Problem | None, bool]] = []
    decoder = Decoder()
    url = store.key_url(shard)
    for row, payload, problem in check_shard_payloads(store, pid, shard, rows, decode=False):
        key = row.key
        if problem is not None or payload is None:
            out.append((key, problem or Problem(pid, url, key, row.offset, "no payload"), False))
            continue
        where = f"{url} key {key!r} offset {row.offset}"
        try:
            arrays = decoder.decode(payload, where)
        except ShardlakeError as exc:
            out.append((key, Problem(pid, url, key, row.offset, str(exc)), False))
            continue
        # The payload matched the shard's checksum: from here on a difference is the source's.
        source_url = source.key_url(key + NPZ)
        try:
            blob = source.read(key + NPZ)
            original = load_npz(blob, source_url)
        except ShardlakeError as exc:
            message = f"source file {source_url} cannot be read: {exc}"
            out.append((key, Problem(pid, url, key, row.offset, message, SOURCE_CHANGED), False))
            continue
        diff = _compare(arrays, original)
        problem = None
        if diff:
            message = f"source file {source_url} differs: {diff}{_sha_note(row, blob)}"
            problem = Problem(pid, url, key, row.offset, message, SOURCE_CHANGED)
        out.append((key, problem, True))
    return out


def _sha_note(row: ShardRow, blob: bytes) -> str:
    """What the source checksum recorded at pack time says about today's file."""
    if not row.source_sha256:
        return ""
    today = hashlib.sha256(blob).hexdigest()
    if today == row.source_sha256:
        return f"; its sha256 is still {today[:16]} as at pack time"
    return f"; changed since pack: sha256 {row.source_sha256[:16]} at pack time, {today[:16]} now"


def _compare(got: dict[str, Any], want: dict[str, Any]) -> str | None:
    if list(got) != list(want):
        return f"arrays {list(got)} differ from the source's {list(want)}"
    for name, array in want.items():
        if not arrays_equal_exact(got[name], array):
            return (
                f"array {name!r} differs from the source "
                f"({got[name].dtype}{list(got[name].shape)} vs {array.dtype}{list(array.shape)})"
            )
    return None


class _RangeFile(io.RawIOBase):
    """A seekable read-only file over :meth:`Store.read_range` (tarfile seeks over payloads)."""

    def __init__(self, store: Store, key: str) -> None:
        self._store, self._key = store, key
        self._size = store.size(key)
        self._pos = 0
        self.digest = hashlib.sha256()  # of every (position, bytes) read: do two reads agree?

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        end = min(self._size, self._pos + len(view))
        if end <= self._pos:
            return 0
        data = self._store.read_range(self._key, self._pos, end)
        self.digest.update(self._pos.to_bytes(8, "little") + data)
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)


@dataclass
class OffsetsReport:
    version: str
    partitions: int = 0
    shards: int = 0
    rows: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "version": self.version,
            "partitions": self.partitions,
            "shards": self.shards,
            "rows": self.rows,
            "problems": [p.to_json() for p in self.problems],
        }


@options_class
@dataclass(frozen=True)
class OffsetsOptions(RunOptions):
    """What ``verify-offsets`` checks (``version``, a tag or ``latest``) and how it runs
    (:class:`~shardlake.RunOptions`: one task per partition, 4 threads by default)."""

    version: str = "latest"


def verify_offsets(store: Store, options: OffsetsOptions) -> OffsetsReport:
    """Check manifests against tar headers and version entries; see the module docs.

    One task per partition runs on ``executor`` (default: ``workers`` threads)."""
    progress, workers = options.progress, options.worker_count()
    spec = executor_for(store, options.executor, "verified")
    ver = load_version(store, options.version)
    report = OffsetsReport(ver.tag)
    entries = ver.entries
    bar = shards_progress(entries, "verify-offsets", progress)
    # The catalog must agree with the manifests it indexes (one read of it, not one per row).
    catalog: dict[str, Any] | None = None
    try:
        catalog = rows_by_partition(catalog_rows(store, ver, CORE_COLUMNS))
    except (FormatError, IntegrityError) as exc:
        report.problems.append(Problem("", store.url, None, None, f"catalog: {exc}"))
    tasks = []
    for e in entries:
        # A compact copy: a zero-copy slice would ship the whole catalog with every task.
        rows = None if catalog is None else catalog.get(e.id)
        rows = None if rows is None else rows.take(list(range(rows.num_rows)))
        args = (store, e, catalog is not None, rows)
        tasks.append(Task(f"{e.path} ({e.id})", _offsets_partition, args, len(e.shards)))
    results, failures = run_partition_tasks(tasks, spec, workers, bar)
    for index, entry in enumerate(entries):
        report.partitions += 1
        if index in failures:
            murl = store.key_url(entry.manifest)
            report.problems.append(task_problem(entry.id, murl, failures[index]))
            continue
        shards, nrows, problems = results[index]
        report.shards += shards
        report.rows += nrows
        report.problems.extend(problems)
    return report


def _offsets_partition(
    store: Store, entry: PartitionEntry, have_catalog: bool, catalog: Any
) -> tuple[int, int, list[Problem]]:
    """One task: ``(shards, rows, problems)`` of one partition's manifest against its entry,
    the catalog rows and every shard's tar headers."""
    pid = entry.id
    out: list[Problem] = []
    murl = store.key_url(entry.manifest)
    read = read_manifest_or_report(store, entry, out)
    if read is None:
        return 0, 0, out
    table, meta = read
    problems = entry_mismatches(entry, table, meta)
    out.extend(Problem(pid, murl, None, None, message) for message in problems)
    if problems and problems[0].startswith(METADATA_MISMATCH):
        return 0, 0, out
    differs = catalog_mismatch(catalog, table) if have_catalog else None
    if differs is not None and not problems:
        out.append(Problem(pid, murl, None, None, differs))
    groups = rows_by_shard(table)
    for index in sorted(set(groups) - set(range(len(entry.shards)))):
        message = f"shard index {index} is not in the version entry"
        out.append(Problem(pid, murl, groups[index][0].key, None, message))
    nrows = 0
    for index, shard in enumerate(entry.shards):
        rows = groups.get(index, [])
        nrows += len(rows)
        out.extend(check_shard_headers(store, pid, shard, rows))
    return len(entry.shards), nrows, out


def check_shard_headers(
    store: Store,
    pid: str,
    shard: ShardEntry,
    rows: list[ShardRow],
    *,
    rereads: int | None = None,
) -> list[Problem]:
    """Problems of one shard's tar headers against its manifest rows (empty: all agree).

    A shard with problems is read again (up to ``rereads`` times; default: the store's
    ``integrity_rereads``, the one re-read policy of every read): problems are reported only
    when no read is clean, as corrupt at rest when every read found the same ones, else as
    transport errors (a header damaged in transit is not a damaged shard).
    """
    seen: list[tuple[list[Problem], str]] = []
    if rereads is None:
        rereads = store.retry.integrity_rereads
    for _ in range(1 + rereads):
        problems, read_digest = _shard_header_problems(store, pid, shard, rows)
        if not problems:
            return []
        seen.append((problems, read_digest))
    if all(found == seen[0] for found in seen):
        return seen[-1][0]
    return [dataclasses.replace(p, kind=TRANSPORT) for p in seen[-1][0]]


def _shard_header_problems(
    store: Store, pid: str, shard: ShardEntry, rows: list[ShardRow]
) -> tuple[list[Problem], str]:
    """The problems found in one read of the shard's headers, and a digest of what was read."""
    key = shard.key
    url = store.key_url(key)
    try:
        raw = _RangeFile(store, key)
    except KeyNotFoundError:
        return [Problem(pid, url, None, None, "shard is missing")], ""
    return _header_problems(raw, pid, url, shard, rows), raw.digest.hexdigest()


def _header_problems(
    raw: _RangeFile, pid: str, url: str, shard: ShardEntry, rows: list[ShardRow]
) -> list[Problem]:
    out: list[Problem] = []
    if raw._size != shard.size:
        out.append(
            Problem(
                pid,
                url,
                None,
                None,
                f"shard is {plural(raw._size, 'byte')}, version says {shard.size}",
            )
        )
    members: list[tuple[str, int, int]] = []
    try:
        with io.BufferedReader(raw, buffer_size=64 * 1024) as fh:
            for m in iter_members(fh, url):
                members.append((m.name, m.offset, m.size))
    except (FormatError, IntegrityError, OSError, EOFError) as exc:
        message = f"tar headers unreadable after {plural(len(members), 'member')}: {exc}"
        out.append(Problem(pid, url, None, None, message))
    for row in sorted(rows, key=lambda r: r.member):
        problem = member_problem(row, members, raw._size)
        if problem is not None:
            out.append(Problem(pid, url, row.key, row.offset, problem))
    return out


def member_problem(
    row: ShardRow, members: list[tuple[str, int, int]], shard_size: int
) -> str | None:
    """What is wrong with one manifest row against the tar header it names (None: agrees)."""
    index, offset, size = row.member, row.offset, row.size
    if not 0 <= index < len(members):
        return f"member {index} is not in the shard ({plural(len(members), 'member')}; truncated?)"
    name, t_offset, t_size = members[index]
    if name != member_name(row.key):
        return f"member {index} is {name!r}, expected {member_name(row.key)!r}"
    if (t_offset, t_size) != (offset, size):
        return (
            f"manifest says offset {offset} size {size}, tar header says offset {t_offset} "
            f"size {t_size}"
        )
    if offset + size > shard_size:
        return f"payload ends past the shard end ({plural(shard_size, 'byte')}; truncated)"
    return None
