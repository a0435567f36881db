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
"""

from __future__ import annotations

import contextlib
import hashlib
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa

from ..errors import AlreadyExistsError, IntegrityError, SourceError
from ..format.codec import (
    CODEC_NAME,
    DEFAULT_LEVEL,
    Decoder,
    Encoder,
    decode_safetensors,
    payload_checksum,
)
from ..format.layout import FORMAT_VERSION, manifest_key, revision_dir, shard_key, short_hash
from ..format.manifest import (
    CORE_COLUMNS,
    ManifestMeta,
    build_manifest_table,
    read_manifest,
    write_manifest,
)
from ..format.npz import load_npz
from ..format.tar import ShardWriter
from ..store import Store
from ..versions import canonical_json
from .sidecar import is_skipped, read_sidecar
from .source import NPZ, SIDECAR, SourcePartition

DEFAULT_SHARD_SIZE = 1 << 30
# Keep npz bytes from the hashing pass for the encoding pass up to this much per partition.
READ_CACHE_BYTES = 256 << 20


@dataclass(frozen=True)
class Recipe:
    """Everything besides the source that decides the shard bytes (part of ``data_rev``)."""

    level: int = DEFAULT_LEVEL
    shard_size: int = DEFAULT_SHARD_SIZE
    seed: int = 0
    codec: str = CODEC_NAME
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "codec": self.codec,
            "level": self.level,
            "shard_size": self.shard_size,
            "seed": self.seed,
            "format_version": self.format_version,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Recipe:
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

    entry: dict[str, Any]
    built: bool  # shards were written by this build
    manifest_written: bool
    skipped: int = 0
    stats: dict[str, float] = field(default_factory=dict)


def shuffle_order(keys: list[str], seed: int) -> list[str]:
    """The seeded shuffle of a partition's keys: sort by a keyed hash of each key.

    It depends only on the seed and the key itself, so adding a sample does not reorder the
    others and any implementation can reproduce it.
    """
    return sorted(keys, key=lambda k: (hashlib.sha256(f"{seed}\0{k}".encode()).digest(), k))


def data_revision(recipe: Recipe, partition_path: str, hashes: list[tuple[str, str]]) -> str:
    """``data_rev``: hash of the recipe and the sorted ``(key, source sha256)`` pairs."""
    body = "\n".join(f"{k}\0{h}" for k, h in sorted(hashes))
    return short_hash("data-rev", canonical_json(recipe.to_json()), partition_path, body, length=24)


def meta_revision(sidecars: list[tuple[str, dict[str, Any] | None]]) -> str:
    """``meta_rev``: hash of the included samples' sidecars (canonical JSON, by key)."""
    h = hashlib.sha256()
    for key, doc in sorted(sidecars, key=lambda kv: kv[0]):
        body = canonical_json(doc) if doc is not None else b"null"
        h.update(short_hash(key, body, length=64).encode())
    return short_hash("meta-rev", h.hexdigest(), length=24)


def manifest_revision(data_rev: str, meta_rev: str) -> str:
    return short_hash("manifest-rev", data_rev, meta_rev, length=24)


def _flat_bytes(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def verify_sample(
    st: bytes,
    payload: bytes,
    arrays: dict[str, np.ndarray[Any, Any]],
    decoder: Decoder,
    where: str,
) -> None:
    """Check that ``payload`` decodes to exactly ``arrays`` (names, order, dtypes, shapes, bytes).

    Cheap by construction: one zstd decompression, one memcmp against the encoded safetensors
    bytes, then each tensor's slice of those bytes against the source array's buffer. The npz is
    not read again.
    """
    if decoder.decompress(payload, where) != st:
        raise IntegrityError(f"{where}: payload does not decompress to the encoded bytes")
    decoded = decode_safetensors(st, where)
    if list(decoded) != list(arrays):
        raise IntegrityError(f"{where}: encoded array names/order differ from the source")
    for name, src in arrays.items():
        got = decoded[name]
        if got.dtype != src.dtype or got.shape != src.shape:
            raise IntegrityError(
                f"{where}: array {name!r} decodes as {got.dtype.str}{got.shape}, "
                f"source is {src.dtype.str}{src.shape}"
            )
        if not np.array_equal(_flat_bytes(got), _flat_bytes(src)):
            raise IntegrityError(f"{where}: array {name!r} bytes differ after encoding")


class _ShardSink:
    """The current shard: an open :meth:`Store.open_writer` block plus its :class:`ShardWriter`."""

    def __init__(self, store: Store, key: str) -> None:
        self.key = key
        self._cm: AbstractContextManager[BinaryIO] = store.open_writer(key)
        self.writer = ShardWriter(self._cm.__enter__())

    def finish(self) -> int:
        self.writer.close()
        self._cm.__exit__(None, None, None)
        return self.writer.bytes_written

    def abort(self, exc: BaseException) -> None:
        tb: TracebackType | None = exc.__traceback__
        # The original error is what matters; a failing abort must not hide it.
        with contextlib.suppress(BaseException):
            self._cm.__exit__(type(exc), exc, tb)


def _shards_of(store: Store, pid: str, data_rev: str, table: Any) -> list[dict[str, Any]]:
    members: dict[int, int] = {}
    for shard in table.column("shard").to_pylist():
        members[shard] = members.get(shard, 0) + 1
    out = []
    for index in sorted(members):
        key = shard_key(pid, data_rev, index)
        out.append({"key": key, "size": store.size(key), "members": members[index]})
    return out


def build_partition(task: BuildTask) -> BuildResult:
    """Build (or reuse) the revision of one partition; see the module docs for the steps."""
    store, part, recipe = task.store, task.partition, task.recipe
    root = Path(task.source_root)
    pid = part.id

    # Step 1: sidecars and content hashes.
    included: list[tuple[str, str]] = []  # (key, sha256)
    sidecars: dict[str, dict[str, Any] | None] = {}
    cache: dict[str, bytes] = {}
    cached = 0
    skipped = 0
    for f in part.files:
        doc = read_sidecar(root / (f.key + SIDECAR)) if f.sidecar_size is not None else None
        if is_skipped(doc) and not task.keep_skipped:
            skipped += 1
            continue
        path = root / (f.key + NPZ)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise SourceError(f"{path}: cannot read ({exc.strerror or exc})") from exc
        included.append((f.key, hashlib.sha256(data).hexdigest()))
        sidecars[f.key] = doc
        if cached + len(data) <= READ_CACHE_BYTES:
            cache[f.key] = data
            cached += len(data)
    data_rev = data_revision(recipe, part.path, included)
    meta_rev = meta_revision(list(sidecars.items()))
    manifest_rev = manifest_revision(data_rev, meta_rev)
    mkey = manifest_key(pid, data_rev, manifest_rev)
    meta = ManifestMeta(pid, part.path, data_rev, meta_rev, manifest_rev, recipe.to_json())
    sha_of = dict(included)
    entry = {
        "id": pid,
        "path": part.path,
        "data_rev": data_rev,
        "meta_rev": meta_rev,
        "manifest_rev": manifest_rev,
        "manifest": mkey,
        "samples": len(included),
        "skipped": skipped,
        "source_fingerprint": part.fingerprint(),
        "npz_fingerprint": part.npz_fingerprint(),
    }

    # Step 2: reuse a complete revision of the same tensor content.
    existing = sorted(
        k
        for k in store.list(revision_dir(pid, data_rev) + "/")
        if k.rsplit("/", 1)[-1].startswith("manifest-")
    )
    # A revision directory may also hold subset manifests written by `remove`; reuse only a
    # manifest that lists exactly this partition's samples. None left (gc) -> rebuild.
    found = _full_manifest(store, sorted(existing, key=lambda k: k != mkey), data_rev, sha_of)
    if found is not None:
        source_key, table = found
        written = False
        if source_key != mkey:
            # Sidecar-only change: same rows (same shards, members, offsets), new sidecar columns.
            core = table.select([c for c in CORE_COLUMNS if c != "has_sidecar"]).to_pylist()
            new = build_manifest_table(
                core, [sidecars[r["key"]] for r in core], where=str(root / part.path)
            )
            written = _create_manifest(store, mkey, write_manifest(new, meta))
            table = new
        entry["payload_bytes"] = int(sum(table.column("size").to_pylist()))
        entry["shards"] = _shards_of(store, pid, data_rev, table)
        return BuildResult(entry, built=False, manifest_written=written, skipped=skipped)

    # Step 3: encode, verify, write shards.
    encoder, decoder = Encoder(recipe.level), Decoder()
    order = shuffle_order([k for k, _ in included], recipe.seed)
    rows: list[dict[str, Any]] = []
    shards: list[dict[str, Any]] = []
    sink: _ShardSink | None = None
    payload_bytes = 0
    try:
        for key in order:
            path = root / (key + NPZ)
            where = str(path)
            blob: bytes | None = cache.pop(key, None)
            if blob is None:
                try:
                    blob = path.read_bytes()
                except OSError as exc:
                    raise SourceError(f"{where}: cannot read ({exc.strerror or exc})") from exc
                if hashlib.sha256(blob).hexdigest() != sha_of[key]:
                    raise SourceError(
                        f"{where}: changed while it was being packed; re-run the pack"
                    )
            arrays = load_npz(blob, where)
            st, payload = encoder.encode(arrays, where)
            verify_sample(st, payload, arrays, decoder, where)
            if (
                sink is not None
                and sink.writer.members
                and (sink.writer.size_with(key, len(payload)) > recipe.shard_size)
            ):
                size = sink.finish()
                shards.append({"key": sink.key, "size": size, "members": sink.writer.members})
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
                    "raw_size": len(st),
                    "crc32": payload_checksum(payload),
                    "source_sha256": sha_of[key],
                }
            )
            payload_bytes += len(payload)
        if sink is not None:
            size = sink.finish()
            shards.append({"key": sink.key, "size": size, "members": sink.writer.members})
            sink = None
    except BaseException as exc:
        if sink is not None:
            sink.abort(exc)
        raise
    table = build_manifest_table(
        rows, [sidecars[r["key"]] for r in rows], where=str(root / part.path)
    )
    written = _create_manifest(store, mkey, write_manifest(table, meta))
    entry["payload_bytes"] = payload_bytes
    entry["shards"] = shards
    return BuildResult(entry, built=True, manifest_written=written, skipped=skipped)


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
