"""``export``: copy a version's closure to another store, or write it back out as npz + json.

A closure export makes the destination a self-contained root: same ``dataset_id``, the version
document byte for byte (so the same hash), its manifests and shards, its keysets, and a fresh
commit log whose ``latest`` is the exported version. The root marker is written first (so a
re-run recognises its own partial export) and the commit last (so nothing half-copied is ever
referenced). Nothing unverified is copied or trusted (docs/format.md, "Integrity"):

* metadata (root marker, manifests, keysets, version document) is read through
  :func:`~shardlake.read.verified.read_verified` - checked against its digest, re-read on a
  mismatch, refused if it never checks out - written, and read back from the destination;
* every shard is checked on its way (every payload against the manifest's CRC-32, every tar
  header against the manifest, its size) and the destination's upload digests prove it stored
  the bytes sent (:mod:`~shardlake.lifecycle.shard_copy`); a copy that fails a check is aborted
  before it is visible and sent again.

Objects already present at the destination and verified (read back) are skipped, so a re-run after a
crash (even ``kill -9``) resumes, and the commit that makes the copy visible comes last.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow as pa

from ..errors import (
    AlreadyExistsError,
    ConflictError,
    FormatError,
    IntegrityError,
    KeyNotFoundError,
    NotFoundError,
    ShardlakeError,
    UsageError,
)
from ..executors.options import RunOptions
from ..executors.tasks import ExecutorSpec, Task, error_text, executor_for
from ..format.catalog import ObjectRef
from ..format.codec import Decoder
from ..format.documents import PartitionEntry, ShardEntry
from ..format.layout import ROOT_MARKER, keyset_key, revision_dir, version_key
from ..format.manifest import entry_mismatches, parse_manifest
from ..meta.commits import commit_state, read_state
from ..meta.gcwait import commit_beside_gc
from ..meta.keysets import Keyset, list_keyset_names, load_keyset, load_keyset_bytes
from ..meta.leases import Lease
from ..meta.rootmarker import check_foreign, ensure_root, parse_root_marker, read_root_marker
from ..meta.state import RootState
from ..meta.versions import StoredVersion, load_version, load_version_bytes, resolve_tag
from ..options import options_class
from ..progress.bar import Progress, plural
from ..query.dataset import Dataset
from ..read.manifests import read_entry_manifest
from ..read.verified import read_verified
from ..source.source_form import npz_bytes, sidecar_json
from ..store import Store
from .common import (
    FieldsJson,
    ShardRow,
    check_shard_payloads,
    rows_by_shard,
    run_partition_tasks,
    shards_progress,
)
from .shard_copy import copy_shard_verified
from .verify import check_shard_headers

__all__ = [
    "ExportOptions",
    "ExportReport",
    "NpzExportReport",
    "export",
]

T = TypeVar("T")
RowList = list[ShardRow]
# Copies of one shard before export gives up on it (each is checked on its way).
SHARD_COPIES = 3


@dataclass
class ExportReport:
    source: str
    dest: str
    version: str
    version_hash: str
    copied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    bytes_copied: int = 0
    keysets: list[str] = field(default_factory=list)
    committed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "dest": self.dest,
            "version": self.version,
            "version_hash": self.version_hash,
            "copied": len(self.copied),
            "skipped": len(self.skipped),
            "bytes_copied": self.bytes_copied,
            "keysets": self.keysets,
            "committed": self.committed,
        }


def _select_keysets(
    src: Store, version_hash: str, names: Sequence[str] | None
) -> list[tuple[Keyset, bytes]]:
    """The keysets to copy with their verified bytes: ``names``, or all bound to the version."""
    if names is None:
        names = list_keyset_names(src)
        loaded = [load_keyset_bytes(src, name) for name in names]
        return [(k, data) for k, data in loaded if k.version_hash == version_hash]
    out = []
    for name in names:
        try:
            keyset, data = load_keyset_bytes(src, name)
        except KeyNotFoundError:
            load_keyset(src, name)  # raises NotFoundError listing the keysets there
            raise
        if keyset.version_hash != version_hash:
            raise ConflictError(
                f"keyset {name!r} is bound to version {keyset.version_tag!r}, not the exported one"
            )
        out.append((keyset, data))
    return out


def _check_dest(src_marker: dict[str, Any], dest: Store, allow_foreign: bool) -> None:
    marker = read_root_marker(dest)
    if marker is None:
        check_foreign(dest, allow_foreign=allow_foreign)
        return
    if marker.get("dataset_id") != src_marker.get("dataset_id"):
        raise ConflictError(
            f"{dest.url} already holds a different dataset (id {marker.get('dataset_id')}, "
            f"exporting {src_marker.get('dataset_id')})"
        )


def _agreeing(parse: Callable[[bytes], T]) -> Callable[[bytes], T]:
    """A check for objects that carry no digest: accept bytes only once two reads agree."""
    previous: list[bytes] = []

    def check(data: bytes) -> T:
        if not previous or previous[-1] != data:
            previous.append(data)
            raise FormatError("two reads disagree (or only one read so far)")
        return parse(data)

    return check


def _read_marker(src: Store) -> tuple[dict[str, Any], bytes]:
    """The source's root marker and its bytes (no digest: two reads must agree)."""
    where = src.key_url(ROOT_MARKER)
    try:
        marker, data = read_verified(
            src, ROOT_MARKER, _agreeing(lambda d: parse_root_marker(d, where)), rereads=3
        )
    except KeyNotFoundError:
        raise NotFoundError(f"{src.url} is not a shardlake root (no {ROOT_MARKER})") from None
    return marker, data


def _source_manifest(src: Store, entry: PartitionEntry) -> tuple[pa.Table, bytes]:
    """The manifest ``entry`` names, verified: against the entry's digest where it records one
    (two agreeing reads where it does not), its metadata and row count against the entry."""
    key = entry.manifest
    where = src.key_url(key)
    digest = entry.manifest_sha256

    def parse(data: bytes) -> pa.Table:
        if digest is not None and hashlib.sha256(data).hexdigest() != digest:
            raise FormatError(f"{where}: manifest does not match the version entry's sha256")
        table, meta = parse_manifest(data, where)
        problems = entry_mismatches(entry, table, meta)
        if problems:
            raise FormatError(f"{where}: " + "; ".join(problems))
        return table

    check = parse if digest is not None else _agreeing(parse)
    try:
        return read_verified(src, key, check, rereads=2 if digest is not None else 3)
    except KeyNotFoundError:
        raise FormatError(f"{where}: manifest is missing") from None


def _source_catalog_object(src: Store, ref: ObjectRef) -> bytes:
    """A catalog object's bytes from ``src``, checked against the digest the record holds."""

    def check(data: bytes) -> bytes:
        try:
            ref.check(data, src.key_url(ref.key))
        except IntegrityError as exc:
            raise FormatError(str(exc)) from exc  # FormatError: read_verified re-reads it
        return data

    return read_verified(src, ref.key, check)[0]


def _put_verified(dest: Store, key: str, data: bytes, report: ExportReport) -> None:
    """Make ``dest`` hold exactly ``data`` (already verified at the source) at ``key``, and prove
    it by reading it back; a copy that does not read back is refused."""

    def same(got: bytes) -> bytes:
        if got != data:
            raise FormatError(f"{dest.key_url(key)}: copy does not read back as written")
        return got

    try:
        read_verified(dest, key, same, rereads=0)
        report.skipped.append(key)
        return
    except (KeyNotFoundError, FormatError):
        pass  # absent, or not (yet) the right bytes: write it
    dest.write(key, data)
    read_verified(dest, key, same)
    report.copied.append(key)
    report.bytes_copied += len(data)


def _shard_problem(dest: Store, pid: str, shard: ShardEntry, rows: RowList) -> str | None:
    """What is wrong with the shard copy at ``dest`` (None when it is intact): its size, every
    listed payload against the manifest's CRC-32, every tar header against the manifest."""
    key, size = shard.key, shard.size
    try:
        if dest.size(key) != size:
            return f"size differs from {size}"
    except KeyNotFoundError:
        return "missing"
    for _row, _payload, problem in check_shard_payloads(dest, pid, key, rows, decode=False):
        if problem is not None:
            return str(problem)
    headers = check_shard_headers(dest, pid, shard, rows)
    return str(headers[0]) if headers else None


def _export_shard(
    src: Store, dest: Store, pid: str, shard: ShardEntry, rows: RowList, report: ExportReport
) -> None:
    """Copy one shard unless an intact copy is there, checked on its way (a copy that fails a
    check never becomes visible); a source that fails every copy is refused."""
    key = shard.key
    if _shard_problem(dest, pid, shard, rows) is None:
        report.skipped.append(key)
        return
    problem = None
    for _attempt in range(SHARD_COPIES):
        problem = copy_shard_verified(src, dest, pid, shard, rows)
        if problem is None:
            report.copied.append(key)
            report.bytes_copied += shard.size
            return
    dest.delete(key)  # never leave a bad copy (an earlier run's) for a resume to trust
    raise IntegrityError(f"export of {src.key_url(key)} failed verification (source): {problem}")


@options_class
@dataclass(frozen=True)
class ExportOptions(RunOptions):
    """What ``export`` copies and how.

    Parameters
    ----------
    version
        The version to copy; ``None``: the version of the one keyset given, else ``latest``.
    keysets
        A root export carries these keysets; an npz export selects the samples of (at most)
        one.
    format
        ``"root"``: a self-contained root whose latest is the version; ``"npz"``:
        ``<key>.npz`` + ``<key>.json`` files.
    allow_foreign
        A root export may go into a location that already holds other objects (refused by
        default; gc leaves them alone).
    workers, executor, progress
        How it runs (:class:`~shardlake.RunOptions`: one copy task per partition, 4 threads by default;
        ``workers`` and ``executor`` apply to a root export).
    """

    version: str | None = None
    keysets: Sequence[str] | None = None
    format: str = "root"
    allow_foreign: bool = False


def export(src: Store, dest: Store, options: ExportOptions) -> ExportReport | NpzExportReport:
    """Copy a version of the root ``src`` to ``dest`` as :class:`ExportOptions` says."""
    keysets = list(options.keysets or [])
    version = options.version
    if version is None:
        version = load_keyset(src, keysets[0]).version_tag if len(keysets) == 1 else "latest"
    if options.format == "npz":
        if options.executor is not None:
            raise UsageError(
                "an npz export runs here: executor is for root exports", options=("executor",)
            )
        if len(keysets) > 1:
            raise UsageError("an npz export takes at most one keyset", options=("keysets",))
        keyset = keysets[0] if keysets else None
        return export_npz(src, dest, version, keyset, options.progress)
    if options.format != "root":
        raise UsageError(
            f"export format {options.format!r}: use 'root' or 'npz'", options=("format",)
        )
    return export_version(src, dest, version, options)


def export_version(src: Store, dest: Store, version: str, options: ExportOptions) -> ExportReport:
    """Copy ``version``'s closure from ``src`` to ``dest``; see the module docs.

    Partitions are copied by one task each on ``options.executor`` (default: ``workers``
    threads)."""
    keysets, allow_foreign = options.keysets, options.allow_foreign
    dest.require_writable("export into it")
    spec = executor_for(dest, executor_for(src, options.executor, "exported"), "exported")
    src_marker, marker_bytes = _read_marker(src)
    ver, doc_bytes = load_version_bytes(src, *resolve_tag(src, version))
    chosen = _select_keysets(src, ver.hash, keysets)
    _check_dest(src_marker, dest, allow_foreign)
    # The marker goes first and byte for byte (same dataset_id and created_at), so a re-run
    # recognises its own partial export and the copy is indistinguishable from the source.
    dest.ensure_create_enforced()
    with contextlib.suppress(AlreadyExistsError):
        dest.create(ROOT_MARKER, marker_bytes)
    ensure_root(dest, dataset_id=str(src_marker["dataset_id"]), allow_foreign=True)
    # gc at the destination keeps what this export copies until it is committed.
    covers = [revision_dir(e.id, e.data_rev) + "/" for e in ver.entries]
    covers += [ref.key for ref in ver.catalog_objects()] + [version_key(ver.tag, ver.hash)]
    with Lease(dest, "export", tag=ver.tag, covers=covers):
        return _copy_and_commit(src, dest, ver, doc_bytes, chosen, spec, options)


def _copy_and_commit(
    src: Store,
    dest: Store,
    ver: StoredVersion,
    doc_bytes: bytes,
    chosen: list[tuple[Keyset, bytes]],
    spec: ExecutorSpec,
    options: ExportOptions,
) -> ExportReport:
    progress, workers = options.progress, options.worker_count()
    report = ExportReport(src.url, dest.url, ver.tag, ver.hash)
    entries = ver.entries
    bar = shards_progress(entries, "export", progress)
    # One task per partition: the worker reads from src and writes to dest itself, so the
    # bytes never pass through the client.
    tasks = [
        Task(f"{e.path} ({e.id})", _export_partition, (src, dest, e), len(e.shards))
        for e in entries
    ]
    results, failures = run_partition_tasks(tasks, spec, workers, bar)
    for index in range(len(entries)):
        if index not in failures:
            part: ExportReport = results[index]
            report.copied.extend(part.copied)
            report.skipped.extend(part.skipped)
            report.bytes_copied += part.bytes_copied
    if failures:
        _raise_failures(tasks, failures)
    for keyset, data in chosen:
        _put_verified(dest, keyset_key(keyset.name), data, report)
        report.keysets.append(keyset.name)
    for ref in ver.catalog_objects():  # before the record that references them
        _put_verified(dest, ref.key, _source_catalog_object(src, ref), report)
    _put_verified(dest, version_key(ver.tag, ver.hash), doc_bytes, report)
    report.committed = commit_beside_gc(
        dest,
        read_state(dest),
        lambda _current: _commit_export(src, dest, ver),
        what="nothing was committed - re-run the export (the verified copies are kept)",
    )
    return report


def _export_partition(src: Store, dest: Store, entry: PartitionEntry) -> ExportReport:
    """One task: a partition's manifest and shards copied and verified at ``dest``."""
    part = ExportReport(src.url, dest.url, "", "")
    table, manifest_bytes = _source_manifest(src, entry)
    _put_verified(dest, entry.manifest, manifest_bytes, part)
    groups = rows_by_shard(table)
    for index, shard in enumerate(entry.shards):
        _export_shard(src, dest, entry.id, shard, groups.get(index, []), part)
    return part


def _raise_failures(tasks: Sequence[Task], failures: dict[int, BaseException]) -> None:
    """Nothing is committed; the copies that verified stay, so a re-run resumes."""
    if len(failures) == 1:
        exc = next(iter(failures.values()))
        if isinstance(exc, ShardlakeError):
            raise exc
    raise IntegrityError(
        f"{len(failures)} of {plural(len(tasks), 'partition')} failed to export; nothing was committed: "
        + "; ".join(f"{tasks[i].label}: {error_text(exc)}" for i, exc in sorted(failures.items()))
    )


def _commit_export(src: Store, dest: Store, ver: StoredVersion) -> bool:
    """Publish the copied version at ``dest`` (False: an earlier run already did)."""
    state = read_state(dest)
    if state.versions.get(ver.tag) == ver.hash and state.latest == ver.tag:
        return False
    if ver.tag in state.versions or ver.tag in state.retired:
        raise ConflictError(f"{dest.url}: already has a different version tagged {ver.tag!r}")
    versions = dict(state.versions)
    versions[ver.tag] = ver.hash
    new = RootState(state.seq + 1, versions, state.retired, ver.tag)
    commit_state(
        dest, state, new, "export", {"tag": ver.tag, "version": ver.hash, "source": src.url}
    )
    return True


@dataclass
class NpzExportReport(FieldsJson):
    dest: str
    version: str
    samples: int = 0
    sidecars: int = 0
    bytes_written: int = 0


def export_npz(
    src: Store, dest: Store, version: str, keyset: str | None, progress: bool | None
) -> NpzExportReport:
    """Write ``<key>.npz`` (+ ``<key>.json`` sidecar) for every sample of ``version``.

    Arrays come back bit-exact (names, order, dtype, shape, bytes); sidecars are rebuilt from
    the manifest columns (see :func:`shardlake.source.source_form.sidecar_of`).
    """
    dest.require_writable("export into it")
    ver = load_version(src, version)
    wanted: set[str] | None = None
    if keyset is not None:
        wanted = set(Dataset(src, ver).select(keyset=keyset).wanted_keys() or ())
    report = NpzExportReport(dest.url, ver.tag)
    decoder = Decoder()
    bar = Progress(len(wanted) if wanted is not None else ver.samples, "export", enabled=progress)
    for entry in ver.entries:
        pid = entry.id
        table, _meta = read_entry_manifest(src, entry)
        full = {r["key"]: r for r in table.to_pylist() if wanted is None or r["key"] in wanted}
        for index, rows in sorted(rows_by_shard(table).items()):
            rows = [r for r in rows if r.key in full]
            shard = entry.shards[index].key
            for row, payload, problem in check_shard_payloads(src, pid, shard, rows, decode=False):
                if problem is not None or payload is None:
                    raise IntegrityError(str(problem or f"{src.key_url(shard)} key {row.key!r}"))
                arrays = decoder.decode(payload, f"{src.key_url(shard)} key {row.key!r}")
                data = npz_bytes(arrays)
                dest.write(row.key + ".npz", data)
                report.samples += 1
                report.bytes_written += len(data)
                side = sidecar_json(full[row.key])
                if side is not None:
                    dest.write(row.key + ".json", side)
                    report.sidecars += 1
                    report.bytes_written += len(side)
                bar.update()
    bar.close()
    return report
