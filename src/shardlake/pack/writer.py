"""``Root.writer``: write a version from Python, sample by sample, through pack's publish.

Each :meth:`Writer.write` checks the sample (key, arrays, sidecar), encodes it, **verifies**
the payload against the arrays (as pack does) and appends it to its partition's local spill
file, keeping only a small index entry in memory (key, offset, sizes, CRC, source hash,
sidecar). :meth:`Writer.finish_partition` builds a partition at once, in the background, and
removes its spill file; on a clean exit every partition not finished yet is built with pack's own :func:`~shardlake.pack.build.build_revision`
(same content addressing, seeded shuffle, shard rolling, manifest, revision reuse) from the
spill, one payload at a time, and the version is published by :func:`~shardlake.pack.publish.
publish` (one commit, create-if-absent). An exception (or Ctrl-C) inside the ``with`` block
publishes nothing; revisions already in the store are left for gc, the spill is removed (also
on SIGTERM, and a killed writer's by the next writer: ``pack/spill``). A writer writes only
inside its ``with`` block: the block's clean exit is what publishes.

Why a spill and not shards as samples arrive: a revision's shards hold its samples in the seeded
shuffle order of *all* its keys and live under its ``data_rev`` (a hash of all its samples), so
neither is known before the partition's last sample. The spill keeps memory bounded (one sample
at a time) and makes the writer's shards byte-identical to pack's (docs/format.md).

A sample's ``source_sha256`` is the SHA-256 of its canonical npz form
(:func:`~shardlake.source.source_form.source_sha256`): pack over npz files written in that form
(``npz_bytes(arrays, compress=False)``) gives the same ``data_rev``.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import json
import os
import threading
import time
import warnings
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, BinaryIO

import numpy as np

from ..errors import IntegrityError, ObjectsGoneError, SourceError, UsageError, options_class
from ..format.codec import Decoder, Encoder, check_array
from ..format.documents import PartitionEntry
from ..format.layout import DATA_DIR, partition_id
from ..meta.leases import Lease, gone_error
from ..meta.publish import check_new_tag
from ..meta.state import RootState
from ..meta.versions import StoredVersion
from ..read.manifests import read_entry_manifest
from ..source.sidecar import is_skipped, parse_sidecar
from ..source.source_form import source_sha256
from ..source.tree import PartitionRule
from ..store import Store
from .build import (
    BuildResult,
    EncodedSample,
    Recipe,
    RevisionSource,
    build_revision,
    encode_verified,
)
from .packer import PackReport
from .plan import recipe_over, resolve_root
from .publish import publish
from .spill import Spill

__all__ = [
    "EncodedRecord",
    "RaggedFieldWarning",
    "WriteOptions",
    "WriteSettings",
    "Writer",
    "check_key",
    "encode_record",
    "partition_of_key",
    "publish_written",
    "resolve_write_settings",
]

# The partition rule a writer version records: a key's parent path (``partition=`` overrides).
PARENT_RULE = PartitionRule(depth=None, regex=r"^(?P<partition>.+)/[^/]+$")
DEFAULT_BUILD_WORKERS = 4
MAX_OPEN_SPILLS = 64


class RaggedFieldWarning(UserWarning):
    """A writer's array whose dtype or shape differs between samples (legal; the loader then
    needs a ``transform=`` that pads or crops)."""


@options_class
@dataclass(frozen=True)
class WriteOptions:
    """How :meth:`Root.writer <shardlake.Root.writer>` and ``write_bag`` write.

    Parameters
    ----------
    shard_size, level, seed
        The recipe (target shard bytes, zstd level, in-partition shuffle seed), as pack's.
        Default: the base version's recipe, else pack's defaults. With a base they must equal
        the base's (carried partitions were made with it).
    keep_skipped
        Keep samples whose ``meta`` says ``is_skipped: true`` (left out by default, as pack does).
    workers
        Partitions built in parallel (threads) when the writer closes.
    encode_threads
        Threads encoding and verifying samples (default 1: in :meth:`Writer.write` itself).
        Above 1, ``write`` checks the sample and returns while it is encoded: do not modify its
        arrays afterwards; an encoding error is raised by a later ``write`` or at the end, naming
        the key. Memory: at most ``2 * encode_threads`` samples in flight.
    spill_dir
        Local directory for the spill file of encoded payloads (default: the system temp dir).
        It holds the compressed samples until the writer closes. A writer starting here
        removes the spills of dead writer processes of this host.
    allow_foreign
        Publish the first version into a location holding objects shardlake did not write.
    """

    shard_size: int | None = None
    level: int | None = None
    seed: int | None = None
    keep_skipped: bool = False
    workers: int | None = None
    encode_threads: int = 1
    spill_dir: str | os.PathLike[str] | None = None
    allow_foreign: bool = False


@dataclass(frozen=True)
class WriteSettings:
    """Root state, base and recipe, resolved before the first sample."""

    state: RootState
    base_version: StoredVersion | None
    recipe: Recipe

    @property
    def rule(self) -> PartitionRule | None:
        """The base's partition rule, which places every key written over it; None without a
        base (a key's parent path, or ``partition=``)."""
        if self.base_version is None:
            return None
        return PartitionRule.from_json(self.base_version.record.partition_rule)


def resolve_write_settings(
    store: Store, tag: str, base: str | None, opts: WriteOptions
) -> WriteSettings:
    """Check the options, the root, the new tag and the base; the recipe to write with."""
    if opts.shard_size is not None and opts.shard_size < 1:
        raise UsageError("shard_size must be >= 1 byte", options=("shard_size",))
    if opts.level is not None and not 1 <= opts.level <= 22:
        raise UsageError("the zstd level must be between 1 and 22", options=("level",))
    check_new_tag(RootState(), tag, store)  # the name, before touching the store
    state, base_version = resolve_root(store, tag, base, allow_foreign=opts.allow_foreign)
    base_recipe = Recipe.from_json(base_version.record.recipe) if base_version else Recipe()
    recipe = recipe_over(base_recipe, opts.level, opts.shard_size, opts.seed)
    if base_version is not None and recipe != base_recipe:
        raise UsageError(
            f"writing on base {base!r} uses its recipe {base_recipe.to_json()} (its partitions "
            "are carried forward); leave shard_size, level and seed unset",
            options=("shard_size", "level", "seed"),
        )
    return WriteSettings(state, base_version, recipe)


def check_key(key: object, what: str = "key") -> str:
    """A sample key (or partition path) must be a relative ``/`` path: the npz path it exports to."""
    if not isinstance(key, str):
        raise SourceError(f"{what} {key!r} is not a string")
    bad = ""
    if not key:
        bad = "it is empty"
    elif key.startswith("/") or key.endswith("/"):
        bad = "it starts or ends with '/'"
    elif "\\" in key or any(ord(c) < 32 or ord(c) == 127 for c in key):
        bad = "it holds a backslash or a control character"
    elif any(part in ("", ".", "..") for part in key.split("/")):
        bad = "it has an empty, '.' or '..' path segment"
    if bad:
        raise SourceError(f"{what} {key!r} is not a valid relative path ({bad})")
    return key


def partition_of_key(
    key: str, partition: str | None = None, rule: PartitionRule | None = None
) -> str:
    """The partition path of ``key``. Over a base (``rule``: the base's partition rule) the one
    the rule gives, as pack over the base would; ``partition``, if given, must agree. Without a
    base: ``partition`` if given, else the key's parent path."""
    if rule is not None:
        owner = rule.partition_of(key + ".npz")
        if owner is None:
            raise SourceError(
                f"sample {key!r}: the base's {rule.describe()} puts the key in no partition "
                "(a writer over a base keeps its partition rule)"
            )
        if partition is not None and check_key(partition, "partition") != owner:
            raise SourceError(
                f"sample {key!r}: partition={partition!r}, but the base's {rule.describe()} "
                f"puts the key in partition {owner!r} (a writer over a base keeps its rule)"
            )
        return owner
    if partition is not None:
        return check_key(partition, "partition")
    parent = key.rpartition("/")[0]
    if not parent:
        raise SourceError(
            f"sample {key!r}: the key has no parent path to take the partition from; "
            "give partition= (or a key like 'log1/000123')"
        )
    return parent


def sample_arrays(key: str, arrays: object) -> dict[str, np.ndarray[Any, Any]]:
    """``arrays`` checked: a non-empty mapping of names to storable NumPy arrays."""
    where = f"sample {key!r}"
    if not isinstance(arrays, Mapping):
        raise SourceError(f"{where}: arrays must be a mapping of names to NumPy arrays")
    if not arrays:
        raise SourceError(f"{where}: no arrays (an empty write)")
    out: dict[str, np.ndarray[Any, Any]] = {}
    for name, array in arrays.items():
        if not isinstance(name, str) or not name:
            raise SourceError(f"{where}: array name {name!r} is not a non-empty string")
        if isinstance(array, np.generic):
            array = np.asarray(array)
        if not isinstance(array, np.ndarray):
            raise SourceError(
                f"{where}: array {name!r} is a {type(array).__name__}, not a NumPy array"
            )
        check_array(name, array, where)
        out[name] = array
    return out


def sample_sidecar(key: str, meta: object) -> dict[str, Any] | None:
    """``meta`` as pack would read it back from a ``.json`` sidecar (checked the same way)."""
    if meta is None:
        return None
    where = f"sample {key!r}"
    if not isinstance(meta, Mapping):
        raise SourceError(
            f"{where}: meta must be a JSON object (a dict), not {type(meta).__name__}"
        )
    try:
        data = json.dumps(dict(meta), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise SourceError(f"{where}: meta is not JSON ({exc})") from exc
    return parse_sidecar(data, where)


@dataclass
class EncodedRecord:
    """One checked, encoded and verified sample (``payload`` None: skipped by its sidecar)."""

    key: str
    partition: str
    sha256: str
    sidecar: dict[str, Any] | None
    payload: bytes | None
    raw_size: int


def encode_record(
    key: object,
    arrays: object,
    meta: object,
    partition: str | None,
    recipe_level: int,
    keep_skipped: bool,
    coders: tuple[Encoder, Decoder] | None = None,
    rule: PartitionRule | None = None,
) -> EncodedRecord:
    """Check, encode and verify one sample (what the writer and ``write_bag`` do per record);
    ``rule``: the base's partition rule (see :func:`partition_of_key`)."""
    skey = check_key(key)
    path = partition_of_key(skey, partition, rule)
    sidecar = sample_sidecar(skey, meta)
    checked = sample_arrays(skey, arrays)
    if is_skipped(sidecar) and not keep_skipped:
        return EncodedRecord(skey, path, "", sidecar, None, 0)
    encoder, decoder = coders or (Encoder(recipe_level), Decoder())
    st, payload = encode_verified(encoder, decoder, checked, f"sample {skey!r}")
    return EncodedRecord(skey, path, source_sha256(checked), sidecar, payload, len(st))


_Encoded = tuple[str, bytes, int]  # source sha256, payload, safetensors size


@dataclass
class _SpillPartition:
    """A partition being written: its spill file and its samples' index entries into it."""

    path: str
    file: str
    size: int = 0
    index: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)  # off,size,raw,crc
    included: list[tuple[str, str]] = field(default_factory=list)
    sidecars: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    skipped: int = 0
    build: cf.Future[BuildResult] | None = None  # set once the partition is finished


class Writer:
    """Write samples into a new version; publish it when the ``with`` block exits cleanly.

    Made by :meth:`Root.writer <shardlake.Root.writer>`::

        with root.writer("v3", base="v2") as w:
            w.write("log1/000123", {"ego": ego, "lanes": lanes}, meta={"is_skipped": False})
            w.delete_partition("log7")
        report = w.report  # a PackReport
    """

    def __init__(
        self,
        store: Store,
        tag: str,
        *,
        base: str | None = None,
        options: WriteOptions | None = None,
        op: str = "write",
    ) -> None:
        self._started = time.monotonic()
        self._store = store
        self._tag = tag
        self._opts = options or WriteOptions()
        self._settings = resolve_write_settings(store, tag, base, self._opts)
        self._rule = self._settings.rule
        self._base_paths = (
            {e.path for e in self._settings.base_version.entries}
            if self._settings.base_version is not None
            else set()
        )
        self._parts: dict[str, _SpillPartition] = {}
        self._partition_of: dict[str, str] = {}  # every key written -> its partition
        self._deleted: set[str] = set()
        self._fields: dict[str, tuple[str, str, tuple[int, ...]]] = {}  # first key, dtype, shape
        self._ragged: set[str] = set()  # array names already warned about
        self._local = threading.local()  # zstd contexts are per thread
        self._lock = threading.Lock()
        threads = max(1, self._opts.encode_threads)
        self._pool = (
            cf.ThreadPoolExecutor(threads, thread_name_prefix="shardlake-encode")
            if threads > 1
            else None
        )
        self._hasher = cf.ThreadPoolExecutor(1, thread_name_prefix="shardlake-hash")
        self._inflight: collections.deque[
            tuple[_SpillPartition, str, dict[str, Any] | None, cf.Future[_Encoded]]
        ] = collections.deque()
        self._max_inflight = 2 * threads
        self._spill: Spill | None = None  # made by __enter__, removed however the writer ends
        # Open spill handles, least recently used first (many partitions: few descriptors).
        self._handles: collections.OrderedDict[str, BinaryIO] = collections.OrderedDict()
        self._builder = cf.ThreadPoolExecutor(
            max(1, self._opts.workers or DEFAULT_BUILD_WORKERS),
            thread_name_prefix="shardlake-build",
        )
        self._state = "open"  # open -> published | aborted
        self._report: PackReport | None = None
        # gc keeps what this writer writes while its block runs (each partition's prefix is
        # added before its build writes there); released when it publishes or aborts.
        self._lease = Lease(store, op, tag=tag)

    # --- the context manager -------------------------------------------------------------

    def __enter__(self) -> Writer:
        if self._state == "open" and self._spill is None:
            self._spill = Spill(self._opts.spill_dir)
            self._lease.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.abort()
            return
        self.close()

    @property
    def tag(self) -> str:
        return self._tag

    @property
    def report(self) -> PackReport:
        """What the writer published (after a clean exit); the report type pack returns."""
        if self._report is None:
            raise UsageError(
                f"writer for {self._tag!r} has not published (it is "
                f"{'still open' if self._state == 'open' else 'aborted'})"
            )
        return self._report

    @property
    def samples(self) -> int:
        """Samples written so far (skipped ones included)."""
        return len(self._partition_of)

    # --- writing -------------------------------------------------------------------------

    def write(
        self,
        key: str,
        arrays: Mapping[str, np.ndarray[Any, Any]],
        meta: Mapping[str, Any] | None = None,
        partition: str | None = None,
    ) -> None:
        """Encode, verify and stage one sample.

        ``key`` is a relative ``/`` path (``log1/000123``); its partition is the key's parent
        path unless ``partition`` is given; over a base, the partition the base's partition
        rule gives (``partition``, if given, must agree). ``arrays`` maps names to NumPy arrays (numeric,
        bool, string or bytes; object arrays are refused); ``meta`` is the sidecar (a JSON
        object). Errors name the key; after one, leaving the ``with`` block publishes nothing.
        """
        self._check_open()
        skey = check_key(key)
        path = partition_of_key(skey, partition, self._rule)
        sidecar = sample_sidecar(skey, meta)
        checked = sample_arrays(skey, arrays)
        with self._lock:
            if skey in self._partition_of:
                raise SourceError(
                    f"sample {skey!r}: duplicate key (already written to this version)"
                )
            if path in self._deleted:
                raise UsageError(f"sample {skey!r}: partition {path!r} was deleted in this writer")
            part = self._parts.get(path)
            if part is None:
                spill = os.path.join(self._check_open().path, f"{len(self._parts):08d}.spill")
                part = self._parts[path] = _SpillPartition(path, spill)
            elif part.build is not None:
                raise UsageError(f"sample {skey!r}: partition {path!r} was finished already")
            self._partition_of[skey] = path
            if is_skipped(sidecar) and not self._opts.keep_skipped:
                part.skipped += 1
                return
        self._check_fields(skey, checked)
        if self._pool is None:
            # The source hash runs beside the encoding (both release the GIL on big buffers);
            # both are done before write() returns, so the caller may reuse its arrays.
            sha = self._hasher.submit(source_sha256, checked)
            try:
                _, payload, raw_size = self._encode(skey, checked, hashed=False)
            finally:
                digest = sha.result()
            self._stage(part, skey, sidecar, (digest, payload, raw_size))
            return
        self._inflight.append((part, skey, sidecar, self._pool.submit(self._encode, skey, checked)))
        while len(self._inflight) > self._max_inflight:
            self._stage_next()

    def _check_fields(self, key: str, arrays: dict[str, np.ndarray[Any, Any]]) -> None:
        """Warn (once per array name) when a numeric array's dtype or shape differs from the
        first written sample's: legal, but the loader batches such samples only through a
        ``transform=`` that pads or crops them. String arrays become lists: any shape goes."""
        for name, array in arrays.items():
            if array.dtype.kind in "US" or name in self._ragged:
                continue
            seen = self._fields.setdefault(name, (key, array.dtype.str, array.shape))
            if seen[1:] != (array.dtype.str, array.shape):
                self._ragged.add(name)
                first, dtype, shape = seen
                warnings.warn(
                    f"writer for {self._tag!r}: array {name!r} is "
                    f"{array.dtype.str}{list(array.shape)} in sample {key!r}, "
                    f"{dtype}{list(shape)} in sample {first!r}; the loader batches samples "
                    "whose arrays differ only with a transform= that pads or crops them",
                    RaggedFieldWarning,
                    stacklevel=3,
                )

    def _encode(
        self, key: str, arrays: dict[str, np.ndarray[Any, Any]], hashed: bool = True
    ) -> _Encoded:
        coders = getattr(self._local, "coders", None)
        if coders is None:
            coders = self._local.coders = (Encoder(self._settings.recipe.level), Decoder())
        st, payload = encode_verified(coders[0], coders[1], arrays, f"sample {key!r}")
        return source_sha256(arrays) if hashed else "", payload, len(st)

    def _stage_next(self) -> None:
        part, key, sidecar, future = self._inflight.popleft()
        self._stage(part, key, sidecar, future.result())

    def _stage(
        self, part: _SpillPartition, key: str, sidecar: dict[str, Any] | None, encoded: _Encoded
    ) -> None:
        """Append a verified payload to the spill; only its index entry stays in memory."""
        sha, payload, raw_size = encoded
        with self._lock:
            handle = self._handles.pop(part.path, None)
            if handle is None:
                handle = open(part.file, "ab")  # noqa: SIM115 - kept open across writes
                if len(self._handles) >= MAX_OPEN_SPILLS:
                    self._handles.popitem(last=False)[1].close()
            self._handles[part.path] = handle
            offset = part.size
            handle.write(payload)
            part.size += len(payload)
            part.index[key] = (offset, len(payload), raw_size, zlib.crc32(payload))
            part.included.append((key, sha))
            part.sidecars[key] = sidecar

    def delete_partition(self, name: str) -> None:
        """Leave the base's partition ``name`` (a partition path) out of the new version: every
        key the base's partition rule puts in it (a nested base partition, e.g. ``name/sub``
        that an older writer made under a depth rule, goes with it)."""
        self._check_open()
        path = check_key(name, "partition")
        if path in self._parts:
            raise UsageError(f"partition {path!r} was written in this writer; it cannot be deleted")
        owners = {rule_owner(p, self._rule) for p in self._base_paths}
        if path not in self._base_paths and path not in owners:
            raise UsageError(
                f"partition {path!r} is not in the base version"
                + ("" if self._settings.base_version else " (this writer has no base)")
            )
        self._deleted.add(path)

    def finish_partition(self, name: str) -> None:
        """Declare partition ``name`` complete: it is built now, in the background, and its
        spill file removed; writing to it again is refused. Optional: at the end every
        partition not finished is built. Writing partition after partition and finishing each
        keeps the spill to the partitions still open."""
        self._check_open()
        path = check_key(name, "partition")
        part = self._parts.get(path)
        if part is None:
            raise UsageError(f"partition {path!r} has no samples in this writer")
        if part.build is None:
            while self._inflight:  # its samples may still be encoding
                self._stage_next()
            self._start_build(part)

    def _start_build(self, part: _SpillPartition) -> None:
        with self._lock:
            handle = self._handles.pop(part.path, None)
            if handle is not None:
                handle.close()
            part.build = self._builder.submit(self._build, part)

    # --- ending --------------------------------------------------------------------------

    def abort(self) -> None:
        """Publish nothing; drop the spill (revisions already in the store are gc's)."""
        if self._state == "open":
            self._state = "aborted"
            try:
                self._stop_encoding()
                self._stop_building()
            finally:
                self._lease.release()

    def _stop_building(self) -> None:
        """Wait for running builds (their revisions stay for gc), drop the spill."""
        self._builder.shutdown(wait=True, cancel_futures=True)
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()
        if self._spill is not None:
            self._spill.cleanup()

    def _stop_encoding(self) -> None:
        for *_, future in self._inflight:
            future.cancel()
        self._inflight.clear()
        self._hasher.shutdown(wait=True, cancel_futures=True)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> PackReport:
        """Build every written partition from the spill and publish the version (once)."""
        if self._report is not None:
            return self._report
        self._check_open()
        try:
            while self._inflight:
                self._stage_next()
            self._stop_encoding()
            if not self._parts and not self._deleted:
                raise SourceError(
                    f"writer for {self._tag!r}: nothing was written (an empty write); "
                    "nothing was published"
                )
            for part in self._parts.values():
                if part.build is None:
                    self._start_build(part)
            try:
                results = [p.build.result() for p in self._parts.values() if p.build is not None]
            except ObjectsGoneError as exc:  # a build's objects were removed under it
                raise gone_error(
                    self._store, exc.missing, since_seq=self._settings.state.seq, lease=self._lease
                ) from exc
            self._report = publish_written(
                self._store,
                self._tag,
                self._settings,
                results,
                deleted=self._deleted,
                keep_skipped=self._opts.keep_skipped,
                skipped=sum(p.skipped for p in self._parts.values()),
                started=self._started,
                lease=self._lease,
            )
        except BaseException:
            self.abort()
            raise
        self._state = "published"
        try:
            self._stop_building()
        finally:
            self._lease.release()
        return self._report

    def _check_open(self) -> Spill:
        """The spill of a writer still open inside its ``with`` block; else a UsageError."""
        if self._state != "open":
            raise UsageError(f"writer for {self._tag!r} is closed ({self._state})")
        if self._spill is None:
            raise UsageError(
                f"writer for {self._tag!r} is used outside a `with` block: write inside "
                f"`with root.writer({self._tag!r}) as w:`, which publishes the version when "
                "the block exits cleanly (and nothing if it raises)"
            )
        return self._spill

    def _build(self, part: _SpillPartition) -> BuildResult:
        """Build one partition from its spill file (one payload at a time), then remove it."""
        pid = partition_id(part.path)
        self._lease.cover([f"{DATA_DIR}/{pid}/"])  # before anything is written there
        source = RevisionSource(pid, part.path, part.included, part.sidecars, part.skipped)
        if not part.size:
            return build_revision(
                self._store, self._settings.recipe, source, lambda order: iter(()), where=part.path
            )
        with open(part.file, "rb") as fh:
            fd = fh.fileno()

            def encoded(order: list[str]) -> Iterator[EncodedSample]:
                for key in order:
                    offset, size, raw_size, crc = part.index[key]
                    payload = os.pread(fd, size, offset)
                    # The spill is local disk: check what comes back is what was verified.
                    if len(payload) != size or zlib.crc32(payload) != crc:
                        raise IntegrityError(f"sample {key!r}: the writer's spill file changed")
                    yield EncodedSample(key, payload, raw_size)

            result = build_revision(
                self._store, self._settings.recipe, source, encoded, where=f"partition {part.path}"
            )
        os.remove(part.file)
        return result


def rule_owner(path: str, rule: PartitionRule | None) -> str:
    """The partition ``rule`` puts the keys of partition ``path`` in: ``path`` itself, unless
    an older version holds a nested partition its rule does not make (``p0/sub`` under depth
    1 belongs to ``p0``)."""
    if rule is None:
        return path
    return rule.partition_of(path + "/x.npz") or path


def _ancestors(path: str) -> Iterator[str]:
    parts = path.split("/")
    for i in range(1, len(parts)):
        yield "/".join(parts[:i])


def _check_no_key_twice(
    store: Store, written: Mapping[str, PartitionEntry], carried: list[PartitionEntry]
) -> None:
    """Refuse a written key that a carried base partition also holds. Under a rule that
    describes the base it cannot happen; a base whose keys were placed by ``partition=`` may
    hold ``a/b/c`` in ``a`` while the rule now gives ``a/b``. Only partitions nested in one
    another can share keys that way, so only their manifests are read (usually none)."""
    carried_by_path = {e.path: e for e in carried}
    pairs = [(p, q) for p in written for q in _ancestors(p) if q in carried_by_path]
    pairs += [(p, q) for q in carried_by_path for p in _ancestors(q) if p in written]
    keys: dict[str, set[str]] = {}

    def keys_of(entry: PartitionEntry) -> set[str]:
        if entry.path not in keys:
            table, _meta = read_entry_manifest(store, entry)
            keys[entry.path] = set(table.column("key").to_pylist())
        return keys[entry.path]

    for p, q in pairs:
        both = keys_of(written[p]) & keys_of(carried_by_path[q])
        if both:
            key = sorted(both)[0]
            raise SourceError(
                f"sample {key!r} (and {len(both) - 1} more) written to partition {p!r} is also "
                f"in the base's partition {q!r}, which is carried: a key may be in one partition "
                f"only; rewrite or delete_partition({q!r}); nothing was published"
            )


def publish_written(
    store: Store,
    tag: str,
    settings: WriteSettings,
    results: list[BuildResult],
    *,
    deleted: set[str] | frozenset[str] = frozenset(),
    keep_skipped: bool = False,
    skipped: int = 0,
    started: float | None = None,
    lease: Lease | None = None,
) -> PackReport:
    """Publish the built partitions over the base (carried unless rewritten or deleted)."""
    base = settings.base_version
    base_entries: dict[str, PartitionEntry] = {e.path: e for e in base.entries} if base else {}
    entries: dict[str, PartitionEntry] = {}
    built: list[str] = []
    manifest_only: list[str] = []
    resumed: list[str] = []
    reused: list[str] = []
    for result in results:
        entry = result.entry
        if entry.path in entries:
            raise SourceError(f"partition {entry.path!r} was built twice")
        entries[entry.path] = entry
        old = base_entries.get(entry.path)
        if old is not None and old.manifest == entry.manifest:
            reused.append(entry.path)
        elif result.built:
            built.append(entry.path)
        elif result.manifest_written:
            manifest_only.append(entry.path)
        else:
            resumed.append(entry.path)
    rule = settings.rule
    # A base partition is replaced (or deleted) with the partition its keys belong to under
    # the base's rule, so no key is in the new version twice.
    carried = [
        p
        for p in base_entries
        if p not in entries
        and p not in deleted
        and rule_owner(p, rule) not in entries
        and rule_owner(p, rule) not in deleted
    ]
    dropped_by_rule = [
        p for p in base_entries if p not in entries and p not in deleted and p not in carried
    ]
    _check_no_key_twice(store, {p: entries[p] for p in entries}, [base_entries[p] for p in carried])
    for path in carried:
        entries[path] = base_entries[path]
    if not entries:
        raise SourceError(f"version {tag!r} would hold no partitions; nothing was published")
    record = base.record if base is not None else None
    base_tag = base.tag if base is not None else None
    body = {
        "base": base_tag,
        "recipe": settings.recipe.to_json(),
        "partition_rule": record.partition_rule if record else PARENT_RULE.to_json(),
        "source_namespace": record.source_namespace if record else None,
        "keep_skipped": keep_skipped,
        "partitions": [entries[p].to_json() for p in sorted(entries)],
    }
    operation = lease.op if lease is not None else "writer"  # named in a conflict
    version = publish(store, tag, body, settings.state, base_tag, lease, operation)
    return PackReport(
        version,
        built=built,
        manifest_only=manifest_only,
        resumed=resumed,
        reused=reused,
        carried=carried,
        dropped=sorted({*deleted, *dropped_by_rule}),
        skipped_samples=skipped,
        seconds=time.monotonic() - started if started is not None else 0.0,
    )
