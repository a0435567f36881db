"""``Root.writer``: write a version from Python, sample by sample, through pack's publish.

Each :meth:`Writer.write` checks the sample (key, arrays, sidecar), encodes it, **verifies**
the payload against the arrays (as pack does) and appends it to a local spill file, keeping only
a small index entry in memory (key, offset, sizes, CRC, source hash, sidecar). On a clean exit
every partition written is built with pack's own :func:`~shardlake.pack.build.build_revision`
(same content addressing, seeded shuffle, shard rolling, manifest, revision reuse) from the
spill, one payload at a time, and the version is published by :func:`~shardlake.pack.publish.
publish` (one commit, create-if-absent). An exception (or Ctrl-C) inside the ``with`` block
publishes nothing; revisions already in the store are left for gc, the spill is removed.

Why a spill and not shards as samples arrive: a revision's shards hold its samples in the seeded
shuffle order of *all* its keys and live under its ``data_rev`` (a hash of all its samples), so
neither is known before the partition's last sample. The spill keeps memory bounded (one sample
at a time) and makes the writer's shards byte-identical to pack's (docs/format.md).

A sample's ``source_sha256`` is the SHA-256 of its canonical npz form
(:func:`~shardlake.source.source_form.source_sha256`): pack over npz files written in that form
(``npz_bytes(arrays, compress=False)``) gives the same ``data_rev``.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np

from ..errors import IntegrityError, SourceError, UsageError, VersionNotFoundError
from ..format.codec import Decoder, Encoder, check_array
from ..format.documents import PartitionEntry
from ..format.layout import partition_id
from ..meta.versions import (
    RootState,
    Version,
    check_new_tag,
    ensure_root,
    load_version,
    read_state,
)
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
from .publish import publish

__all__ = ["WriteOptions", "Writer", "check_key", "partition_of_key"]

# The partition rule a writer version records: a key's parent path (``partition=`` overrides).
PARENT_RULE = PartitionRule(depth=None, regex=r"^(?P<partition>.+)/[^/]+$")
DEFAULT_BUILD_WORKERS = 4


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
    spill_dir
        Local directory for the spill file of encoded payloads (default: the system temp dir).
        It holds the compressed samples until the writer closes.
    allow_foreign
        Publish the first version into a location holding objects shardlake did not write.
    """

    shard_size: int | None = None
    level: int | None = None
    seed: int | None = None
    keep_skipped: bool = False
    workers: int | None = None
    spill_dir: str | os.PathLike[str] | None = None
    allow_foreign: bool = False


@dataclass(frozen=True)
class WriteSettings:
    """Root state, base and recipe, resolved before the first sample."""

    state: RootState
    base_version: Version | None
    recipe: Recipe


def resolve_write_settings(
    store: Store, tag: str, base: str | None, opts: WriteOptions
) -> WriteSettings:
    """Check the options, the root, the new tag and the base; the recipe to write with."""
    if opts.shard_size is not None and opts.shard_size < 1:
        raise UsageError("shard_size must be >= 1 byte", options=("shard_size",))
    if opts.level is not None and not 1 <= opts.level <= 22:
        raise UsageError("the zstd level must be between 1 and 22", options=("level",))
    check_new_tag(RootState(), tag, store)  # the name, before touching the store
    ensure_root(store, allow_foreign=opts.allow_foreign)
    state = read_state(store)
    check_new_tag(state, tag, store)
    base_version = None
    if base is not None:
        try:
            base_version = load_version(store, base, state)
        except VersionNotFoundError as exc:
            raise VersionNotFoundError(
                f"unknown base version {base!r}: {exc}", options=("base",)
            ) from exc
    base_recipe = Recipe.from_json(base_version.record.recipe) if base_version else Recipe()
    recipe = Recipe(
        level=opts.level if opts.level is not None else base_recipe.level,
        shard_size=opts.shard_size if opts.shard_size is not None else base_recipe.shard_size,
        seed=opts.seed if opts.seed is not None else base_recipe.seed,
    )
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


def partition_of_key(key: str, partition: str | None = None) -> str:
    """The partition path of ``key``: ``partition`` if given, else the key's parent path."""
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
) -> EncodedRecord:
    """Check, encode and verify one sample (what the writer and ``write_bag`` do per record)."""
    skey = check_key(key)
    path = partition_of_key(skey, partition)
    sidecar = sample_sidecar(skey, meta)
    checked = sample_arrays(skey, arrays)
    if is_skipped(sidecar) and not keep_skipped:
        return EncodedRecord(skey, path, "", sidecar, None, 0)
    encoder, decoder = coders or (Encoder(recipe_level), Decoder())
    st, payload = encode_verified(encoder, decoder, checked, f"sample {skey!r}")
    return EncodedRecord(skey, path, source_sha256(checked), sidecar, payload, len(st))


@dataclass
class _SpillPartition:
    """A partition being written: its samples' index entries into the spill file."""

    path: str
    index: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)  # off,size,raw,crc
    included: list[tuple[str, str]] = field(default_factory=list)
    sidecars: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    skipped: int = 0


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
    ) -> None:
        self._started = time.monotonic()
        self._store = store
        self._tag = tag
        self._opts = options or WriteOptions()
        self._settings = resolve_write_settings(store, tag, base, self._opts)
        self._base_paths = (
            {e.path for e in self._settings.base_version.entries}
            if self._settings.base_version is not None
            else set()
        )
        self._parts: dict[str, _SpillPartition] = {}
        self._partition_of: dict[str, str] = {}  # every key written -> its partition
        self._deleted: set[str] = set()
        self._coders = (Encoder(self._settings.recipe.level), Decoder())
        self._lock = threading.Lock()
        self._spill = tempfile.TemporaryFile(  # noqa: SIM115 - lives as long as the writer
            prefix="shardlake-writer-", dir=os.fspath(self._opts.spill_dir or tempfile.gettempdir())
        )
        self._spill_size = 0
        self._state = "open"  # open -> published | aborted
        self._report: PackReport | None = None

    # --- the context manager -------------------------------------------------------------

    def __enter__(self) -> Writer:
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
        path unless ``partition`` is given. ``arrays`` maps names to NumPy arrays (numeric,
        bool, string or bytes; object arrays are refused); ``meta`` is the sidecar (a JSON
        object). Errors name the key; after one, leaving the ``with`` block publishes nothing.
        """
        self._check_open()
        skey = check_key(key)
        if skey in self._partition_of:
            raise SourceError(f"sample {skey!r}: duplicate key (already written to this version)")
        path = partition_of_key(skey, partition)
        if path in self._deleted:
            raise UsageError(f"sample {skey!r}: partition {path!r} was deleted in this writer")
        record = encode_record(
            skey,
            arrays,
            meta,
            partition,
            self._settings.recipe.level,
            self._opts.keep_skipped,
            self._coders,
        )
        with self._lock:
            if skey in self._partition_of:  # a racing write of the same key
                raise SourceError(
                    f"sample {skey!r}: duplicate key (already written to this version)"
                )
            part = self._parts.get(path)
            if part is None:
                part = self._parts[path] = _SpillPartition(path)
            self._partition_of[skey] = path
            if record.payload is None:
                part.skipped += 1
                return
            offset = self._spill_size
            self._spill.write(record.payload)
            self._spill_size += len(record.payload)
            size = len(record.payload)
            part.index[skey] = (offset, size, record.raw_size, zlib.crc32(record.payload))
            part.included.append((skey, record.sha256))
            part.sidecars[skey] = record.sidecar

    def delete_partition(self, name: str) -> None:
        """Leave the base's partition ``name`` (a partition path) out of the new version."""
        self._check_open()
        path = check_key(name, "partition")
        if path in self._parts:
            raise UsageError(f"partition {path!r} was written in this writer; it cannot be deleted")
        if path not in self._base_paths:
            raise UsageError(
                f"partition {path!r} is not in the base version"
                + ("" if self._settings.base_version else " (this writer has no base)")
            )
        self._deleted.add(path)

    # --- ending --------------------------------------------------------------------------

    def abort(self) -> None:
        """Publish nothing; drop the spill (revisions already in the store are gc's)."""
        if self._state == "open":
            self._state = "aborted"
            self._spill.close()

    def close(self) -> PackReport:
        """Build every written partition from the spill and publish the version (once)."""
        if self._report is not None:
            return self._report
        self._check_open()
        try:
            if not self._parts and not self._deleted:
                raise SourceError(
                    f"writer for {self._tag!r}: nothing was written (an empty write); "
                    "nothing was published"
                )
            self._spill.flush()
            results = self._build_all()
            self._report = publish_written(
                self._store,
                self._tag,
                self._settings,
                results,
                deleted=self._deleted,
                keep_skipped=self._opts.keep_skipped,
                skipped=sum(p.skipped for p in self._parts.values()),
                started=self._started,
            )
        except BaseException:
            self.abort()
            raise
        self._state = "published"
        self._spill.close()
        return self._report

    def _check_open(self) -> None:
        if self._state != "open":
            raise UsageError(f"writer for {self._tag!r} is closed ({self._state})")

    def _build_all(self) -> list[BuildResult]:
        parts = [p for p in self._parts.values() if p.included or p.skipped]
        workers = max(1, self._opts.workers or DEFAULT_BUILD_WORKERS)
        if workers == 1 or len(parts) == 1:
            return [self._build(p) for p in parts]
        with cf.ThreadPoolExecutor(workers, thread_name_prefix="shardlake-writer") as pool:
            futures = [pool.submit(self._build, p) for p in parts]
            try:
                return [f.result() for f in futures]
            except BaseException:
                for f in futures:
                    f.cancel()
                raise

    def _build(self, part: _SpillPartition) -> BuildResult:
        fd = self._spill.fileno()

        def encoded(order: list[str]) -> Iterator[EncodedSample]:
            for key in order:
                offset, size, raw_size, crc = part.index[key]
                payload = os.pread(fd, size, offset)
                # The spill is local disk: check what comes back is what was verified.
                if len(payload) != size or zlib.crc32(payload) != crc:
                    raise IntegrityError(f"sample {key!r}: the writer's spill file changed")
                yield EncodedSample(key, payload, raw_size)

        source = RevisionSource(
            partition_id(part.path), part.path, part.included, part.sidecars, part.skipped
        )
        return build_revision(
            self._store, self._settings.recipe, source, encoded, where=f"partition {part.path}"
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
    carried = [p for p in base_entries if p not in entries and p not in deleted]
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
    version = publish(store, tag, body, settings.state, base_tag)
    return PackReport(
        version,
        built=built,
        manifest_only=manifest_only,
        resumed=resumed,
        reused=reused,
        carried=carried,
        dropped=sorted(deleted),
        skipped_samples=skipped,
        seconds=time.monotonic() - started if started is not None else 0.0,
    )
