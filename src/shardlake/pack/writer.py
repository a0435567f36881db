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

from ..errors import IntegrityError, ObjectsGoneError, SourceError, UsageError
from ..format.codec import Decoder, Encoder
from ..format.layout import DATA_DIR, partition_id
from ..meta.leases import Lease, gone_error
from ..progress.bar import Progress
from ..source.sidecar import is_skipped
from ..source.source_form import source_sha256
from ..store import Store
from .build import BuildResult, EncodedSample, RevisionSource, build_revision, encode_verified
from .packer import PackReport
from .samples import check_key, partition_of_key, rule_owner, sample_arrays, sample_sidecar
from .spill import Spill
from .written import DEFAULT_BUILD_WORKERS, WriteOptions, publish_written, resolve_write_settings

__all__ = ["RaggedFieldWarning", "Writer"]

MAX_OPEN_SPILLS = 64


class RaggedFieldWarning(UserWarning):
    """A writer's array whose dtype or shape differs between samples (legal; the loader then
    needs a ``transform=`` that pads or crops)."""


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
        self._what = f"{op} {tag}"  # names its progress lines
        self._bar = Progress(None, self._what, enabled=False)  # samples written (see __enter__)

    # --- the context manager -------------------------------------------------------------

    def __enter__(self) -> Writer:
        if self._state == "open" and self._spill is None:
            self._spill = Spill(self._opts.spill_dir)
            self._lease.start()
            self._bar = Progress(None, self._what, enabled=self._opts.progress)
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
                self._bar.update(1)
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
            self._bar.update(1)

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
            self._bar.close()
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
            self._bar.close()
            for part in self._parts.values():
                if part.build is None:
                    self._start_build(part)
            try:
                results = self._built()
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

    def _built(self) -> list[BuildResult]:
        """Every partition's build result, in write order, with progress as each finishes."""
        parts = list(self._parts.values())
        builds = {p.build: p for p in parts if p.build is not None}
        total = sum(len(p.included) for p in builds.values())
        bar = Progress(
            total, f"{self._what}: build", groups=len(builds), enabled=self._opts.progress
        )
        with bar:
            for future in cf.as_completed(builds):
                future.result()  # raises the first failure
                bar.update(len(builds[future].included), groups=1)
        return [p.build.result() for p in parts if p.build is not None]

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
