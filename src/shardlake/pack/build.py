"""Pass 2 of a pack: build one partition revision (shards + manifest), verifying every sample.

A build runs in a worker (process, thread or Dask worker) and writes straight to the store:

1. Read every sidecar and hash every included npz (SHA-256) -> ``data_rev`` (tensor content +
   recipe) and ``meta_rev`` (sidecar content). Skipped frames (``is_skipped: true``) are left
   out unless ``keep_skipped``.
2. If that revision already has a manifest (an earlier run, or the base version), its shards are
   complete (manifests are written after their shards): reuse them. A new ``meta_rev`` only
   writes a new manifest next to the existing shards - never new shards.
3. Otherwise encode every sample in seeded-shuffle order, **verify it** (decompress the payload
   and memcmp it with the encoded safetensors bytes; compare each tensor slice with the source
   array bytes, dtype and shape) and append it to the current shard, rolling at ``shard_size``.
   Shards stream through :meth:`Store.open_writer` (visible only when complete); the manifest
   is created last with create-if-absent.

The steps overlap: uncached source files are read a few samples ahead of the encoder, and shard
bytes go to the store from a background thread while the next samples are inflated, encoded
and verified.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import hashlib
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, cast

import numpy as np
import pyarrow as pa

from ..errors import (
    SHOW_MAX,
    AlreadyExistsError,
    IntegrityError,
    KeyNotFoundError,
    ObjectsGoneError,
    SourceError,
    SourceFilesError,
)
from ..format.codec import (
    CODEC_NAME,
    DEFAULT_LEVEL,
    Decoder,
    Encoder,
    encode_safetensors,
    payload_checksum,
)
from ..format.documents import PartitionEntry, ShardEntry
from ..format.layout import FORMAT_VERSION, manifest_key, revision_dir, shard_key
from ..format.manifest import CORE_COLUMNS, ManifestMeta, build_manifest_table, write_manifest
from ..format.tar import ShardWriter
from ..progress.bar import plural
from ..read.manifests import read_manifest
from ..source.npz import load_npz
from ..source.sidecar import is_skipped, read_sidecar
from ..source.tree import NPZ, SIDECAR, SourcePartition
from ..store import Store
from .revisions import data_revision, manifest_revision, meta_revision, shuffle_order, verify_sample

__all__ = [
    "BuildResult",
    "BuildTask",
    "EncodedSample",
    "Recipe",
    "RevisionSource",
    "build_partition",
    "build_revision",
    "encode_verified",
    "load_npz",
]


DEFAULT_SHARD_SIZE = 1 << 30
# Keep npz bytes from the hashing pass for the encoding pass up to this much per partition.
READ_CACHE_BYTES = 256 << 20
# Uncached npz files are read this many samples ahead of the encoder (overlaps source I/O).
READ_AHEAD = 8


@dataclass(frozen=True)
class Recipe:
    """Everything besides the source that decides the shard bytes (part of ``data_rev``)."""

    level: int = DEFAULT_LEVEL
    shard_size: int = DEFAULT_SHARD_SIZE
    seed: int = 0
    codec: str = CODEC_NAME
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Recipe:
        return cls(
            level=int(doc["level"]),
            shard_size=int(doc["shard_size"]),
            seed=int(doc["seed"]),
            codec=str(doc.get("codec", CODEC_NAME)),
            format_version=int(doc.get("format_version", FORMAT_VERSION)),
        )


@dataclass(frozen=True)
class BuildTask:
    """One partition build, picklable for process pools and Dask."""

    store: Store
    source_root: str
    partition: SourcePartition
    recipe: Recipe
    keep_skipped: bool = False


@dataclass
class BuildResult:
    """What a build produced: the version-document entry plus counters for the report."""

    entry: PartitionEntry
    built: bool  # shards were written by this build
    manifest_written: bool
    skipped: int = 0
    stats: dict[str, float] = field(default_factory=dict)


class _BackgroundHandle:
    """A write-only handle whose writes run on one background thread, in order.

    Shard uploads (a local file, or multipart parts to S3/GCS) then overlap the encoding of the
    next samples. At most ``depth`` writes are queued; the first write error is re-raised on the
    next call (and by :meth:`drain`), so nothing is silently lost.
    """

    def __init__(self, handle: BinaryIO, depth: int = 8) -> None:
        self._handle = handle
        self._queue: queue.Queue[bytes | None] = queue.Queue(depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="shardlake-shard-writer")
        self._thread.daemon = True
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._handle.write(chunk)
                except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
                    self._error = exc

    def write(self, data: bytes) -> int:
        if self._error is not None:
            raise self._error
        self._queue.put(data)
        return len(data)

    def drain(self) -> None:
        """Wait for every queued write; re-raise the first write error."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if self._error is not None:
            raise self._error


class _ShardSink:
    """The current shard: an open :meth:`Store.open_writer` block plus its :class:`ShardWriter`."""

    def __init__(self, store: Store, key: str) -> None:
        self.key = key
        self._cm: AbstractContextManager[BinaryIO] = store.open_writer(key)
        self._handle = _BackgroundHandle(self._cm.__enter__())
        self.writer = ShardWriter(cast(BinaryIO, self._handle))

    def finish(self) -> ShardEntry:
        """Close the shard (visible from now on); its entry for the version document."""
        self.writer.close()
        self._handle.drain()
        self._cm.__exit__(None, None, None)
        return ShardEntry(self.key, self.writer.bytes_written, self.writer.members)

    def abort(self, exc: BaseException) -> None:
        tb: TracebackType | None = exc.__traceback__
        # The original error is what matters; a failing abort must not hide it.
        with contextlib.suppress(BaseException):
            self._handle.drain()
        with contextlib.suppress(BaseException):
            self._cm.__exit__(type(exc), exc, tb)


def _shards_of(store: Store, pid: str, data_rev: str, table: Any) -> tuple[ShardEntry, ...]:
    members: dict[int, int] = {}
    for shard in table.column("shard").to_pylist():
        members[shard] = members.get(shard, 0) + 1
    out = []
    for index in sorted(members):
        key = shard_key(pid, data_rev, index)
        out.append(ShardEntry(key, store.size(key), members[index]))
    return tuple(out)


@dataclass
class _Sources:
    """Pass 1 over a partition: included samples, their hashes and sidecars, cached bytes."""

    included: list[tuple[str, str]] = field(default_factory=list)  # (key, sha256)
    sidecars: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    cache: dict[str, bytes] = field(default_factory=dict)
    skipped: int = 0


def _read_source(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SourceError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def _hash_sources(task: BuildTask, root: Path) -> _Sources:
    """Read every sidecar, hash every included npz, keep up to READ_CACHE_BYTES of them.

    A file that cannot be read does not stop the pass: every bad file of the partition is
    named in one :class:`SourceFilesError`."""
    out = _Sources()
    bad: list[str] = []
    cached = 0
    for f in task.partition.files:
        doc = None
        if f.sidecar_size is not None:
            try:
                doc = read_sidecar(root / (f.key + SIDECAR))
            except SourceError as exc:
                bad.append(str(exc))
        if is_skipped(doc) and not task.keep_skipped:
            out.skipped += 1
            continue
        try:
            data = _read_source(root / (f.key + NPZ))
        except SourceError as exc:
            bad.append(str(exc))
            continue
        out.included.append((f.key, hashlib.sha256(data).hexdigest()))
        out.sidecars[f.key] = doc
        if cached + len(data) <= READ_CACHE_BYTES:
            out.cache[f.key] = data
            cached += len(data)
    if bad:
        raise _bad_files(root, bad, [key for key, _sha in out.included])
    return out


def _bad_files(root: Path, found: list[str], unchecked: list[str]) -> SourceFilesError:
    """The error naming ``found`` and every other bad frame among ``unchecked``, so one pack
    run reports all of a partition's bad files, not the first."""
    problems = list(found)
    for key in unchecked:
        where = str(root / (key + NPZ))
        try:
            encode_safetensors(load_npz(_read_source(root / (key + NPZ)), where), where)
        except SourceError as exc:
            problems.append(str(exc))
    problems.sort()
    shown = "; ".join(problems[:SHOW_MAX])
    more = f"; ... and {len(problems) - SHOW_MAX} more" if len(problems) > SHOW_MAX else ""
    return SourceFilesError(
        f"{plural(len(problems), 'source file')} cannot be packed: {shown}{more}", problems=problems
    )


def build_partition(task: BuildTask) -> BuildResult:
    """Build (or reuse) the revision of one partition; see the module docs for the steps."""
    part = task.partition
    root = Path(task.source_root)
    src = _hash_sources(task, root)
    level = task.recipe.level

    def encoded(order: list[str]) -> Iterator[EncodedSample]:
        encoder, decoder = Encoder(level), Decoder()
        for done, (key, blob) in enumerate(_prefetched(root, src, order), start=1):
            where = str(root / (key + NPZ))
            try:
                arrays = load_npz(blob, where)
                st, payload = encoder.encode(arrays, where)
            except SourceError as exc:
                # name every bad frame of the partition in one run, not the first
                raise _bad_files(root, [str(exc)], order[done:]) from exc
            verify_sample(st, payload, arrays, decoder, where)
            yield EncodedSample(key, payload, len(st))

    return build_revision(
        task.store,
        task.recipe,
        RevisionSource(part.id, part.path, src.included, src.sidecars, src.skipped),
        encoded,
        where=str(root / part.path),
        source_fingerprint=part.fingerprint(),
        npz_fingerprint=part.npz_fingerprint(),
    )


@dataclass(frozen=True)
class EncodedSample:
    """One sample, encoded and verified: its key, payload and safetensors size."""

    key: str
    payload: bytes
    raw_size: int


@dataclass
class RevisionSource:
    """What decides a partition revision: its samples' source hashes and sidecars.

    ``included`` holds ``(key, sha256 of the sample's npz form)``; pack hashes the npz files,
    the writer the canonical npz form of the arrays it is given (``source_form.source_sha256``).
    """

    pid: str
    path: str
    included: list[tuple[str, str]]
    sidecars: dict[str, dict[str, Any] | None]
    skipped: int = 0


def encode_verified(
    encoder: Encoder, decoder: Decoder, arrays: dict[str, np.ndarray[Any, Any]], where: str
) -> tuple[bytes, bytes]:
    """``(safetensors bytes, payload)`` of ``arrays``, the payload verified against them."""
    st, payload = encoder.encode(arrays, where)
    verify_sample(st, payload, arrays, decoder, where)
    return st, payload


def build_revision(
    store: Store,
    recipe: Recipe,
    src: RevisionSource,
    encoded: Callable[[list[str]], Iterable[EncodedSample]],
    *,
    where: str,
    source_fingerprint: str | None = None,
    npz_fingerprint: str | None = None,
) -> BuildResult:
    """Build (or reuse) one partition revision: the steps pack and the writer share.

    ``encoded(order)`` yields the verified samples in ``order`` (the seeded shuffle); it is
    called only when the revision has to be built.
    """
    pid = src.pid
    data_rev = data_revision(recipe, src.path, src.included)
    meta_rev = meta_revision(list(src.sidecars.items()))
    manifest_rev = manifest_revision(data_rev, meta_rev)
    mkey = manifest_key(pid, data_rev, manifest_rev)
    meta = ManifestMeta(pid, src.path, data_rev, meta_rev, manifest_rev, recipe.to_json())
    # payload_bytes and shards are set once the shards are written (or found).
    entry = PartitionEntry(
        id=pid,
        path=src.path,
        data_rev=data_rev,
        meta_rev=meta_rev,
        manifest_rev=manifest_rev,
        manifest=mkey,
        samples=len(src.included),
        skipped=src.skipped,
        payload_bytes=0,
        shards=(),
        source_fingerprint=source_fingerprint,
        npz_fingerprint=npz_fingerprint,
    )
    try:
        reused = _reuse_revision(store, src, meta, entry, where)
    except KeyNotFoundError:
        reused = None  # removed (by gc) while it was looked at: build it again
    if reused is not None:
        return reused
    order = shuffle_order([k for k, _ in src.included], recipe.seed)
    rows, shards = _write_shards(store, recipe, src, data_rev, encoded(order))
    table = build_manifest_table(rows, [src.sidecars[r["key"]] for r in rows], where=where)
    data = write_manifest(table, meta)
    written = _create_manifest(store, mkey, data)
    entry = replace(entry, payload_bytes=sum(r["size"] for r in rows), shards=tuple(shards))
    if written:  # publish checks its read-back against the bytes written
        entry = replace(entry, manifest_sha256=hashlib.sha256(data).hexdigest())
    return BuildResult(entry, built=True, manifest_written=written, skipped=src.skipped)


def _reuse_revision(
    store: Store,
    src: RevisionSource,
    meta: ManifestMeta,
    entry: PartitionEntry,
    where: str,
) -> BuildResult | None:
    """Reuse a complete revision of the same tensor content (new manifest if sidecars changed)."""
    pid, data_rev, mkey = src.pid, meta.data_rev, entry.manifest
    existing = sorted(
        k
        for k in store.list(revision_dir(pid, data_rev) + "/")
        if k.rsplit("/", 1)[-1].startswith("manifest-")
    )
    # A revision directory may also hold subset manifests written by `remove`; reuse only a
    # manifest that lists exactly this partition's samples. None left (gc) -> rebuild.
    sha_of = dict(src.included)
    found = _full_manifest(store, sorted(existing, key=lambda k: k != mkey), data_rev, sha_of)
    if found is None:
        return None
    source_key, table = found
    written = False
    if source_key != mkey:
        # Sidecar-only change: same rows (same shards, members, offsets), new sidecar columns.
        core = table.select([c for c in CORE_COLUMNS if c != "has_sidecar"]).to_pylist()
        new = build_manifest_table(core, [src.sidecars[r["key"]] for r in core], where=where)
        written = _create_manifest(store, mkey, write_manifest(new, meta))
        table = new
    entry = replace(
        entry,
        payload_bytes=int(sum(table.column("size").to_pylist())),
        shards=_shards_of(store, pid, data_rev, table),
    )
    return BuildResult(entry, built=False, manifest_written=written, skipped=src.skipped)


def _prefetched(
    root: Path, src: _Sources, order: list[str], window: int = READ_AHEAD
) -> Iterator[tuple[str, bytes]]:
    """``(key, npz bytes)`` in ``order``; uncached files are read ``window`` samples ahead.

    A file re-read after pass 1 must still hash to its pass-1 SHA-256 (else it changed).
    """
    sha_of = dict(src.included)

    def load(key: str) -> bytes:
        path = root / (key + NPZ)
        blob = _read_source(path)
        if hashlib.sha256(blob).hexdigest() != sha_of[key]:
            raise SourceError(f"{path}: changed while it was being packed; re-run the pack")
        return blob

    with cf.ThreadPoolExecutor(2, thread_name_prefix="shardlake-read") as pool:
        ahead: collections.deque[tuple[str, cf.Future[bytes] | bytes]] = collections.deque()
        keys = iter(order)
        try:
            while True:
                while len(ahead) < window and (key := next(keys, None)) is not None:
                    cached = src.cache.pop(key, None)
                    ahead.append((key, cached if cached is not None else pool.submit(load, key)))
                if not ahead:
                    return
                key, item = ahead.popleft()
                yield key, item.result() if isinstance(item, cf.Future) else item
        finally:
            for _, item in ahead:
                if isinstance(item, cf.Future):
                    item.cancel()


def _rolls(sink: _ShardSink, key: str, payload_size: int, shard_size: int) -> bool:
    """Whether adding this member would push a non-empty shard past ``shard_size``."""
    return sink.writer.members > 0 and sink.writer.size_with(key, payload_size) > shard_size


def _write_shards(
    store: Store,
    recipe: Recipe,
    src: RevisionSource,
    data_rev: str,
    samples: Iterable[EncodedSample],
) -> tuple[list[dict[str, Any]], list[ShardEntry]]:
    """Append every verified sample in order, rolling shards; ``(manifest rows, shards)``."""
    pid = src.pid
    sha_of = dict(src.included)
    rows: list[dict[str, Any]] = []
    shards: list[ShardEntry] = []
    sink: _ShardSink | None = None
    try:
        for sample in samples:
            key, payload = sample.key, sample.payload
            if sink is not None and _rolls(sink, key, len(payload), recipe.shard_size):
                shards.append(sink.finish())
                sink = None
            if sink is None:
                sink = _ShardSink(store, shard_key(pid, data_rev, len(shards)))
            member, offset = sink.writer.add(key, payload)
            rows.append(
                {
                    "key": key,
                    "partition": pid,
                    "shard": len(shards),
                    "member": member,
                    "offset": offset,
                    "size": len(payload),
                    "raw_size": sample.raw_size,
                    "crc32": payload_checksum(payload),
                    "source_sha256": sha_of[key],
                }
            )
        if sink is not None:
            shards.append(sink.finish())
            sink = None
    except BaseException as exc:
        if sink is not None:
            sink.abort(exc)
            if isinstance(exc, KeyNotFoundError):  # its staging removed under it
                raise ObjectsGoneError(
                    f"partition {src.path}: {sink.key} was removed while it was written",
                    missing=[sink.key],
                ) from exc
        raise
    if len(rows) != len(sha_of):
        raise IntegrityError(
            f"partition {src.path}: {len(rows)} of {plural(len(sha_of), 'sample')} encoded"
        )
    return rows, shards


def _full_manifest(
    store: Store, candidates: list[str], data_rev: str, sha_of: dict[str, str]
) -> tuple[str, pa.Table] | None:
    """The first candidate manifest of ``data_rev`` whose rows are exactly ``sha_of``."""
    for key in candidates:
        table, meta = read_manifest(store, key)
        keys = table.column("key").to_pylist()
        shas = table.column("source_sha256").to_pylist()
        if meta.data_rev == data_rev and dict(zip(keys, shas, strict=True)) == sha_of:
            return key, table
    return None


def _create_manifest(store: Store, key: str, data: bytes) -> bool:
    """Create the manifest; an identical revision already there (a racing build) is fine."""
    try:
        store.create(key, data)
        return True
    except AlreadyExistsError:
        read_manifest(store, key)  # must at least be a readable manifest
        return False
