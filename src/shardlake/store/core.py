"""The :class:`Store`: every byte shardlake reads or writes goes through one of these.

A store is a root URL plus an fsspec filesystem. Keys are ``/``-separated and relative to the
root. The atomic primitives (create-if-absent, atomic overwrite, streaming write visible only
when complete) differ per backend; :mod:`shardlake.store.backends` implements them.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import importlib.metadata
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar, overload

import fsspec

from ..errors import (
    AlreadyExistsError,
    CapabilityError,
    KeyNotFoundError,
    OutcomeUnknownError,
    ReadOnlyStoreError,
    RetriesExhaustedError,
    StoreError,
    TransientStoreError,
    UsageError,
)
from .backends import Backend, Leftover, is_already_exists, make_backend
from .classify import Verdict, classify
from .endpoint import endpoint_id
from .errors import translate_error
from .keys import check_key, check_prefix
from .layers import Request, StoreLayer
from .retry import RetryLoop, RetryPolicy, has_answered, mark_answered, split_retry_options
from .url import ParsedURL, parse_url, redact

__all__ = [
    "PROBE_RECORD_KEY",
    "PROBE_RECORD_TTL_S",
    "ObjectInfo",
    "ProbeCheck",
    "ProbeInconclusiveError",
    "Store",
    "check_create_race",
    "check_create_sequential",
    "open_store",
    "run_create_checks",
]

T = TypeVar("T")


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing or stat knows about one object."""

    key: str
    size: int
    mtime: float | None  # seconds since the epoch, None where the backend does not say


class Store:
    """A root URL on local disk, NFS, S3, GCS or memory, addressed by relative keys.

    Stores are picklable: the filesystem is re-created from the URL and storage options in the
    receiving process, and a store inherited through ``fork`` rebuilds its filesystem on first use
    in the child (an fsspec async filesystem must not cross a fork).  Storage options travel with
    the pickle (they may hold credentials), but never appear in ``repr`` or error messages.

    Every request is retried by one :class:`RetryPolicy` (``retry``; the storage options
    ``retry_deadline`` / ``retry_attempt_timeout`` adjust it) and passes through the store's
    layers (:meth:`with_layers`).
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: RetryPolicy | None = None,
        layers: Sequence[StoreLayer] = (),
    ) -> None:
        self._parsed: ParsedURL = parse_url(url)
        options = dict(storage_options or {})
        self.retry = (retry or RetryPolicy.from_env()).with_options(options)
        self._storage_options = split_retry_options(options)
        self._endpoint = endpoint_id(self.protocol, self._storage_options, self.root)
        self._layers: tuple[StoreLayer, ...] = tuple(layers)
        self._backend: Backend | None = None
        self._backend_pid = -1
        self._create_checked = False
        self._lock = threading.Lock()

    def with_layers(self, *layers: StoreLayer) -> Store:
        """A twin of this store (same location, options and policy) whose requests also pass
        through ``layers``, outermost first, outside this store's own layers."""
        state = self.__getstate__()
        state["layers"] = tuple(layers) + self._layers
        state["create_checked"] = False  # a layer may change what a create does: probe afresh
        twin = type(self).__new__(type(self))
        twin.__setstate__(state)
        return twin

    def with_retry(self, policy: RetryPolicy) -> Store:
        """A twin of this store (same location, options and layers) retrying per ``policy``."""
        state = self.__getstate__()
        state["retry"] = policy
        twin = type(self).__new__(type(self))
        twin.__setstate__(state)
        return twin

    @property
    def layers(self) -> tuple[StoreLayer, ...]:
        return self._layers

    # --- identity ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The root URL, with any credentials redacted."""
        return self._parsed.url

    @property
    def protocol(self) -> str:
        return self._parsed.protocol

    @property
    def root(self) -> str:
        """The root path in the filesystem's own notation (bucket/prefix for object stores)."""
        return self._parsed.root

    @property
    def storage_options(self) -> dict[str, Any]:
        return dict(self._storage_options)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {
            "parsed": self._parsed,
            "storage_options": self._storage_options,
            "retry": self.retry,
            "layers": self._layers,
            "create_checked": self._create_checked,
            # A worker that receives the store inherits "this endpoint answered the job": a
            # refusal it meets first is the server restarting, not a wrong endpoint URL.
            "answered": has_answered(self._endpoint),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._parsed = state["parsed"]
        self._storage_options = state["storage_options"]
        self.retry = state["retry"]
        self._layers = tuple(state.get("layers", ()))
        self._create_checked = state["create_checked"]
        self._endpoint = endpoint_id(self.protocol, self._storage_options, self.root)
        if state.get("answered"):
            mark_answered(self._endpoint)
        self._backend = None
        self._backend_pid = -1
        self._lock = threading.Lock()

    @property
    def backend(self) -> Backend:
        pid = os.getpid()
        if self._backend is None or self._backend_pid != pid:
            if self._backend_pid not in (-1, pid):
                self._lock = threading.Lock()  # forked: the parent's lock may be held forever
            backend = make_backend(self.protocol, self.root, self._storage_options, self.retry)
            self._backend, self._backend_pid = backend, pid
            return backend
        return self._backend

    def require_writable(self, what: str) -> None:
        """Refuse ``what`` (a command) before it does anything where the store is read-only
        (``http://``, ``https://``): :class:`ReadOnlyStoreError`, one line."""
        reason = self.backend.read_only
        if reason is not None:
            raise ReadOnlyStoreError(
                f"{self.url}: the root is {reason}, so {what} cannot run on it; run it where "
                "the root is stored (a local path, s3://, gs://, az://)"
            )

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        return self.backend.fs

    def path(self, key: str) -> str:
        """The filesystem path of ``key`` (for fsspec calls and messages)."""
        key = check_key(key)
        return f"{self.root}/{key}" if self.root not in ("", "/") else "/" + key

    def _dir_path(self, prefix: str) -> str:
        """The filesystem path of the directory ``prefix`` (normalised, ends in ``/``)."""
        root = self.root.rstrip("/")
        return f"{root}/{prefix}" if prefix else f"{root}/"

    def key_url(self, key: str) -> str:
        """A redacted URL naming ``key`` in this store, for messages."""
        return f"{self.url.rstrip('/')}/{key}"

    def _describe(self, op: str, key: str) -> Callable[[], str]:
        return lambda: f"{op} {redact(self.key_url(key))}"

    def _translate(self, exc: BaseException, op: str, key: str) -> BaseException:
        return translate_error(exc, op, self.key_url(key), self._parsed.bucket, self.protocol)

    def _attempt(
        self, op: str, key: str, path: str, action: Callable[[Backend], T], data: bytes | None
    ) -> T:
        """Send one attempt of a request through the store's layers to the backend."""
        backend = self.backend
        request = Request(op, key, path, data, backend)

        def send() -> T:
            return action(backend)

        for layer in reversed(self._layers):
            send = functools.partial(layer, request, send)
        result = send()
        if self.protocol not in ("file", "memory"):
            mark_answered(self._endpoint)  # later refusals are outages, retried in full
        return result

    def _send(
        self,
        op: str,
        key: str,
        path: str,
        action: Callable[[Backend], T],
        data: bytes | None = None,
    ) -> T:
        """Run one request under the retry policy; raise permanent failures translated."""
        loop = RetryLoop(self.retry, self._describe(op, key), endpoint=self._endpoint)
        while True:
            try:
                return self._attempt(op, key, path, action, data)
            except Exception as exc:  # noqa: BLE001 - classified below
                if classify(exc) is Verdict.PERMANENT:
                    raise self._translate(exc, op, key) from exc
                loop.backoff(exc)

    # --- reads -------------------------------------------------------------------------------

    def read(self, key: str) -> bytes:
        """The whole object at ``key``; :class:`KeyNotFoundError` if absent."""
        path = self.path(key)
        return self._send("read", key, path, lambda b: b.read(path))

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``key``, clipped at the object's end (past the end: ``b""``)."""
        _check_range(key, start, end)
        if end == start:
            self.stat(key)  # a zero-length range of a missing key is still an error
            return b""
        path = self.path(key)
        got = self._send(
            "read_range", key, path, lambda b: _RangeBatch([path], [start], [end])(b)[0]
        )
        return bytes(got)  # already bytes: only read_ranges(views=True) returns views

    @overload
    def read_ranges(self, ranges: Sequence[tuple[str, int, int]]) -> list[bytes]: ...

    @overload
    def read_ranges(
        self, ranges: Sequence[tuple[str, int, int]], *, views: bool
    ) -> list[bytes | memoryview]: ...

    def read_ranges(
        self, ranges: Sequence[tuple[str, int, int]], *, views: bool = False
    ) -> list[bytes] | list[bytes | memoryview]:
        """Many ``(key, start, end)`` ranges in one call (fsspec ``cat_ranges``), in order.

        Each range is clipped like :meth:`read_range`; zero-length ranges cost no request (but a
        missing key is still an error). With ``views``, a client that hands out buffers of its
        own (obstore on S3, GCS, Azure) returns read-only memoryviews of them instead of ``bytes`` copies:
        for a caller that only slices and decodes them (the loader).
        """
        for key, start, end in ranges:
            _check_range(key, start, end)
        wanted = [(i, k, s, e) for i, (k, s, e) in enumerate(ranges) if e > s]
        # Object stores answer an empty HTTP range with the whole object, so never send one.
        for key in sorted({k for k, s, e in ranges if e == s} - {k for _, k, _, _ in wanted}):
            self.stat(key)
        out: list[bytes | memoryview] = [b""] * len(ranges)
        if wanted:
            paths = [self.path(k) for _, k, _, _ in wanted]
            starts = [s for _, _, s, _ in wanted]
            ends = [e for _, _, _, e in wanted]
            found = self._send(
                "read_ranges",
                wanted[0][1],
                paths[0],
                _RangeBatch(paths, starts, ends, multi=True, views=views),
            )
            for (i, _, _, _), data in zip(wanted, found, strict=True):
                out[i] = data
        return out

    def stat(self, key: str) -> ObjectInfo:
        path = self.path(key)
        size, mtime = self._send("stat", key, path, lambda b: b.stat(path))
        return ObjectInfo(key, size, mtime)

    def size(self, key: str) -> int:
        return self.stat(key).size

    def exists(self, key: str) -> bool:
        path = self.path(key)
        return self._send("exists", key, path, lambda b: b.exists(path))

    def list_info(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object under the directory ``prefix`` (``a/`` never lists ``ab/``), sorted."""
        prefix = check_prefix(prefix)
        base = self._dir_path(prefix)
        entries = self._send("list", prefix, base, lambda b: b.list(base))
        root_len = len(self._dir_path(""))
        out = [ObjectInfo(path[root_len:], size, mtime) for path, size, mtime in entries]
        out.sort(key=lambda info: info.key)
        return out

    def list(self, prefix: str = "") -> list[str]:
        return [info.key for info in self.list_info(prefix)]

    # --- writes ------------------------------------------------------------------------------

    def write(self, key: str, data: bytes) -> None:
        """Atomic overwrite: readers see the old bytes or the new ones, never a mix."""
        path = self.path(key)
        payload = bytes(data)
        self._send("write", key, path, lambda b: b.write(path, payload), payload)

    def create(self, key: str, data: bytes) -> None:
        """Create-if-absent: :class:`AlreadyExistsError` if ``key`` exists, atomic on every backend.

        The winner's bytes are complete the first moment anyone can see the key.  Creating a key
        that already holds exactly ``data`` succeeds: a create whose reply was lost and that was
        re-sent must not report a loss it did not have.  Such a create is settled by reading back
        what is there (retried like any read); if that cannot be done before the deadline the
        store raises :class:`OutcomeUnknownError` rather than guess.
        """
        path = self.path(key)
        payload = bytes(data)
        loop = RetryLoop(self.retry, self._describe("create", key), endpoint=self._endpoint)
        maybe_landed = False  # an earlier attempt may have created the key before failing
        while True:
            try:
                self._attempt("create", key, path, lambda b: b.create(path, payload), payload)
                return
            except Exception as exc:  # noqa: BLE001 - classified below
                if is_already_exists(exc):
                    self._settle_refused_create(key, payload, exc, maybe_landed)
                    return
                verdict = classify(exc)
                if verdict is Verdict.PERMANENT:
                    raise self._translate(exc, "create", key) from exc
                maybe_landed = maybe_landed or verdict is Verdict.AMBIGUOUS
                try:
                    loop.backoff(exc)
                except RetriesExhaustedError as gave_up:
                    if not maybe_landed:
                        raise
                    self._settle_lost_create(key, payload, gave_up)
                    return

    def _settle_refused_create(
        self, key: str, payload: bytes, refusal: Exception, maybe_landed: bool
    ) -> None:
        """``key`` exists: return if it holds ``payload`` (ours), else raise AlreadyExistsError."""
        where = f"create {redact(self.key_url(key))}"
        try:
            ours = self._holds(key, payload)
        except KeyNotFoundError:
            ours = False  # deleted since: whatever was there was not created by this call
        except (RetriesExhaustedError, StoreError) as exc:
            if not maybe_landed:
                # No attempt of ours can have landed: the refusal is the answer.
                raise AlreadyExistsError(f"{where}: already exists") from refusal
            raise OutcomeUnknownError(
                f"{where}: outcome unknown - a reply was lost and what the key holds could not "
                f"be read back ({exc})"
            ) from exc
        if not ours:
            raise AlreadyExistsError(f"{where}: already exists") from refusal

    def _settle_lost_create(self, key: str, payload: bytes, gave_up: Exception) -> None:
        """The deadline passed after a reply was lost: one last look at what the key holds."""
        where = f"create {redact(self.key_url(key))}"
        try:
            ours = self._holds(key, payload, retry=False)
        except FileNotFoundError:
            raise gave_up from None  # nothing landed: a plain failure
        except Exception as exc:  # noqa: BLE001 - any failure leaves the outcome open
            raise OutcomeUnknownError(
                f"{where}: outcome unknown - replies were lost and the deadline passed before "
                f"the key could be read back ({gave_up})"
            ) from exc
        if not ours:
            raise AlreadyExistsError(f"{where}: already exists") from gave_up

    def _holds(self, key: str, payload: bytes, *, retry: bool = True) -> bool:
        """Whether ``key`` holds exactly ``payload``; a conflicting large object is not read just
        to learn that it differs.

        A read-back of the right size that differs may be our own bytes damaged in transit, so
        it is read again: the same other bytes twice are another writer's; reads that never
        agree raise :class:`TransientStoreError` (the caller then reports the outcome unknown).
        """
        path = self.path(key)

        def read() -> bytes:
            if retry:
                return self.read(key)
            return self._attempt("read", key, path, lambda b: b.read(path), None)

        if retry:
            size = self.stat(key).size
        else:
            size = self._attempt("stat", key, path, lambda b: b.stat(path), None)[0]
        if size != len(payload):
            return False
        seen: list[bytes] = []
        for _ in range(2 + max(1, self.retry.integrity_rereads)):
            got = read()
            if got == payload:
                return True
            if got in seen:
                return False  # the same other bytes twice: not a damaged copy of ours
            seen.append(got)
        raise TransientStoreError(
            f"{redact(self.key_url(key))}: read back {len(seen)} different ways (damaged in "
            "transit?): cannot tell whether it holds this writer's bytes"
        )

    @contextmanager
    def open_writer(self, key: str) -> Iterator[BinaryIO]:
        """Stream a large object; it becomes visible at ``key`` only when the block exits cleanly.

        On an exception the partial object is discarded (temp file removed, multipart upload
        aborted, resumable session cancelled) and nothing appears at ``key``.  A streaming write
        is not retried: on failure the caller writes the object again.
        """
        path = self.path(key)
        writer = self.backend.open_writer(path)
        try:
            handle = writer.__enter__()
        except Exception as exc:
            translated = self._translated(exc, "write", key)
            if translated is exc:
                raise
            raise translated from exc
        try:
            yield handle
        except BaseException:
            # The caller's block failed: discard the upload and let its exception through as is.
            if not writer.__exit__(*sys.exc_info()):
                raise
        else:
            try:
                writer.__exit__(None, None, None)
            except Exception as exc:
                translated = self._translated(exc, "write", key)
                if translated is exc:
                    raise
                raise translated from exc

    def _translated(self, exc: Exception, op: str, key: str) -> BaseException:
        translated = self._translate(exc, op, key)
        return translated if isinstance(translated, StoreError) else exc

    def delete(self, key: str) -> None:
        """Delete ``key``; a missing key is not an error."""
        path = self.path(key)
        self._send("delete", key, path, lambda b: b.delete(path))

    def create_bucket(self) -> bool:
        """Create the bucket (Azure: container) this store's URL names unless it exists, through
        fsspec ``mkdir`` (s3fs, gcsfs and adlfs create one); True when it was created. The
        filesystem's defaults apply (region, location, access); set them as storage options."""
        bucket = self._parsed.bucket
        if bucket is None:
            raise UsageError(
                f"{self.url}: not an object store URL, so there is no bucket to create"
            )

        def make(backend: Backend) -> bool:
            fs = backend.fs
            fs.invalidate_cache()
            if fs.exists(bucket):
                return False
            if self.protocol in ("s3", "s3a"):
                # Not s3fs's mkdir: it sends LocationConstraint us-east-1, which S3 refuses, and
                # none for a region set only in the AWS config, which a regional endpoint refuses.
                region = (getattr(fs, "client_kwargs", None) or {}).get("region_name") or getattr(
                    getattr(getattr(fs, "s3", None), "meta", None), "region_name", None
                )
                params: dict[str, Any] = {"Bucket": bucket}
                if region and region != "us-east-1":
                    params["CreateBucketConfiguration"] = {"LocationConstraint": region}
                fs.call_s3("create_bucket", **params)
            else:
                fs.mkdir(bucket)
            fs.invalidate_cache()
            return True

        return self._send("create_bucket", ".", bucket, make)

    def leftovers(self, older_than: float) -> builtins.list[Leftover]:
        """Staging of killed streaming writers under this root, started before ``older_than``
        (epoch seconds): local temp files, unfinished S3 multipart uploads. Never visible as keys.
        """
        found = self._send("leftovers", ".", self.root, lambda b: b.leftovers(self.root + "/"))
        return [item for item in found if item.started is not None and item.started < older_than]

    def discard_leftover(self, leftover: Leftover) -> None:
        """Remove one leftover (unlink the temp file, abort the multipart upload)."""
        self._send("discard_leftover", ".", leftover.path, lambda b: b.discard_leftover(leftover))

    def copy_to(self, dest: Store, key: str, dest_key: str | None = None) -> None:
        """Copy ``key`` to ``dest`` (any backend), streaming; atomic at the destination."""
        target = dest_key or key
        chunk = 8 * 1024 * 1024
        total = self.size(key)
        with dest.open_writer(target) as out:
            offset = 0
            while offset < total:
                data = self.read_range(key, offset, min(total, offset + chunk))
                if not data:
                    break
                out.write(data)
                offset += len(data)

    # --- capabilities ------------------------------------------------------------------------

    def ensure_create_enforced(self) -> None:
        """Prove create-if-absent is enforced here before the first publish; cached.

        Runs the sequential and the racing checks (:func:`run_create_checks`). Raises
        :class:`CapabilityError` naming the failed check for a store that ignores the
        precondition or lets concurrent creates all win (some S3-compatible servers do), and
        :class:`ProbeInconclusiveError` when a read-back could not be done. Reading such a store
        still works. A passing result is remembered in the root for
        :data:`PROBE_RECORD_TTL_S` (``_shardlake/probe-record.json``).
        """
        self.require_writable("publishing")
        with self._lock:
            if self._create_checked:
                return
            now = time.time()
            # A layer may change what a create does: layered stores never trust a record.
            if not self._layers and _trusted_record(self, now):
                self._create_checked = True
                return
            checks = run_create_checks(self)
            failed = [c for c in checks if not c.ok]
            if failed:
                what = "; ".join(f"{c.name}: {c.detail}" for c in failed)
                raise CapabilityError(
                    f"{self.url} does not enforce create-if-absent (conditional writes) - "
                    f"failed check {what}; refusing to publish there. Use a store that honours "
                    "If-None-Match / ifGenerationMatch=0 atomically."
                )
            if not self._layers:
                _remember(self, now, checks)
            self._create_checked = True


class _RangeBatch:
    """Ranges read until every one is complete; each attempt re-reads only the missing ones.

    A body cut short in transit behind a matching Content-Length looks complete to the HTTP
    layer, so a range shorter than the object allows (one not ending at the object's end)
    raises a transient error and is read again.
    """

    def __init__(
        self,
        paths: list[str],
        starts: list[int],
        ends: list[int],
        *,
        multi: bool = False,
        views: bool = False,
    ) -> None:
        # ``multi``: a ``read_ranges`` call, which a backend with a faster multi-read client
        # (obstore on S3, GCS, Azure) answers even for one range; ``read_range`` keeps the plain client.
        # ``views``: the caller takes the client's own buffers (see Store.read_ranges).
        self.paths, self.starts, self.ends, self.multi = paths, starts, ends, multi
        self.views = views
        self.done: dict[int, bytes | memoryview] = {}

    def __call__(self, backend: Backend) -> list[bytes | memoryview]:
        todo = [i for i in range(len(self.paths)) if i not in self.done]
        paths = [self.paths[i] for i in todo]
        starts = [self.starts[i] for i in todo]
        ends = [self.ends[i] for i in todo]
        found: list[bytes | memoryview]
        if len(todo) == 1 and not (self.multi and backend.batches_single_ranges()):
            found = [backend.read_range(paths[0], starts[0], ends[0])]
        else:
            found = backend.read_ranges(paths, starts, ends, views=self.views)
        sizes: dict[str, int] = {}
        short: str | None = None
        for i, path, start, end, data in zip(todo, paths, starts, ends, found, strict=True):
            if len(data) < end - start:
                if path not in sizes:
                    sizes[path] = backend.stat(path)[0]
                expected = max(0, min(end, sizes[path]) - start)
                if len(data) != expected:
                    short = (
                        f"short read of {path} [{start}, {end}): {len(data)} of {expected} bytes"
                    )
                    continue
            self.done[i] = data
        if short is not None:
            raise TransientStoreError(short)
        return [self.done[i] for i in range(len(self.paths))]


def _check_range(key: str, start: int, end: int) -> None:
    if not isinstance(start, int) or not isinstance(end, int) or start < 0 or end < start:
        raise UsageError(
            f"invalid byte range [{start}, {end}) for key {key!r}: need 0 <= start <= end"
        )


def open_store(
    url: str | Store,
    storage_options: dict[str, Any] | None = None,
    *,
    retry: RetryPolicy | None = None,
) -> Store:
    """Open the store at ``url`` (``/abs/path``, ``file://``, ``memory://``, ``s3://``, ``gs://``).

    Other fsspec protocols work as far as their implementation provides the operations; their
    create-if-absent is checked by :meth:`Store.ensure_create_enforced` before any publish.
    Opening makes no request: a missing bucket or bad credentials surface on first use.
    """
    if isinstance(url, Store):
        return url
    store = Store(url, storage_options, retry=retry)
    store.backend  # noqa: B018 - fail now on unknown protocols, missing packages, bad options
    return store


PROBE_PREFIX = "_shardlake/probe"
PROBE_RECORD_KEY = "_shardlake/probe-record.json"
# How long a probe record vouches for a store (a server upgrade may change its behaviour).
PROBE_RECORD_TTL_S = 24 * 3600.0
PROBE_RACERS = 8
_ROOT_MARKER = "shardlake.json"  # the record is kept only in a dataset root (format layer's key)
_RECORD_FORMAT = "shardlake-probe-record"
CREATE_CHECKS = ("create-if-absent", "create-if-absent-race")


@dataclass(frozen=True)
class ProbeCheck:
    """The outcome of one named store check: ``ok`` and a detail for people."""

    name: str
    ok: bool
    detail: str


class ProbeInconclusiveError(StoreError):
    """A probe whose outcome could not be read back (transport errors or damaged replies that
    outlasted the re-reads): the store is not judged, the command fails with what happened."""


def _read_back(store: Store, key: str, expected: bytes) -> tuple[bool, str]:
    """``(equal, detail)``: whether ``key`` holds ``expected``. A transport error or bytes that
    differ are re-read (``retry.integrity_rereads``); only reads that agree with each other are a
    verdict, otherwise :class:`ProbeInconclusiveError` says what happened."""
    seen: list[bytes] = []
    last = ""
    for _ in range(1 + store.retry.integrity_rereads):
        try:
            data = store.read(key)
        except KeyNotFoundError:
            return False, "the key vanished after the create"
        except StoreError as exc:
            last = f"read-back failed: {exc}"
            continue
        if data == expected:
            return True, "read-back matches"
        seen.append(data)
        last = f"read-back differs (sha256 {hashlib.sha256(data).hexdigest()[:12]})"
    if len(seen) >= 2 and all(d == seen[0] for d in seen):
        return False, f"{last} on {len(seen)} agreeing reads"
    raise ProbeInconclusiveError(
        f"{store.key_url(key)}: create-if-absent probe inconclusive - {last} "
        f"({1 + store.retry.integrity_rereads} reads); the store was not judged, try again"
    )


def check_create_sequential(store: Store, key: str) -> ProbeCheck:
    """Create ``key``, create it again with other bytes: the second must be refused and the
    first bytes kept."""
    name = "create-if-absent"
    store.create(key, b"first")
    try:
        store.create(key, b"second")
    except AlreadyExistsError:
        ok, detail = _read_back(store, key, b"first")
        if ok:
            return ProbeCheck(name, True, "a second create of one key was refused")
        return ProbeCheck(name, False, f"a second create was refused but {detail}")
    return ProbeCheck(name, False, "a second create of an existing key succeeded (overwrite)")


def check_create_race(store: Store, key: str, racers: int = PROBE_RACERS) -> ProbeCheck:
    """``racers`` threads create ``key`` at once, each with its own bytes: exactly one must win
    and the key must hold the winner's bytes."""
    name = "create-if-absent-race"
    store.backend  # noqa: B018 - build the filesystem once, not in every racer
    barrier = threading.Barrier(racers)
    won: list[bytes] = []
    failed: list[str] = []
    guard = threading.Lock()

    def race(i: int) -> None:
        data = f"racer {i} {uuid.uuid4().hex}".encode()
        try:
            barrier.wait(timeout=30)
            store.create(key, data)
        except AlreadyExistsError:
            return
        except Exception as exc:  # noqa: BLE001 - reported in the check's detail
            with guard:
                failed.append(f"{type(exc).__name__}: {exc}")
            return
        with guard:
            won.append(data)

    threads = [threading.Thread(target=race, args=(i,), daemon=True) for i in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise ProbeInconclusiveError(
            f"{store.key_url(key)}: create-if-absent race inconclusive - {len(failed)} of "
            f"{racers} creates failed (first: {failed[0]})"
        )
    if len(won) != 1:
        return ProbeCheck(
            name, False, f"{len(won)} of {racers} concurrent creates of one key won (need 1)"
        )
    ok, detail = _read_back(store, key, won[0])
    if not ok:
        return ProbeCheck(name, False, f"one of {racers} racers won but {detail}")
    return ProbeCheck(name, True, f"exactly 1 of {racers} concurrent creates won")


def run_create_checks(store: Store, prefix: str = PROBE_PREFIX) -> list[ProbeCheck]:
    """The sequential and the racing create-if-absent checks on fresh keys under ``prefix``;
    the keys are deleted afterwards."""
    keys = [f"{prefix}/{uuid.uuid4().hex}", f"{prefix}/{uuid.uuid4().hex}"]
    try:
        return [check_create_sequential(store, keys[0]), check_create_race(store, keys[1])]
    finally:
        for key in keys:
            store.delete(key)


def _store_identity(store: Store) -> dict[str, Any]:
    """What the record is tied to: the protocol, the root URL and the endpoint it was reached at."""
    options = store.storage_options
    endpoint = options.get("endpoint_url") or (options.get("client_kwargs") or {}).get(
        "endpoint_url"
    )
    if endpoint is None and store.protocol == "s3":
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint is None and store.protocol in ("gs", "gcs"):
        endpoint = options.get("endpoint") or os.environ.get("STORAGE_EMULATOR_HOST")
    return {"protocol": store.protocol, "url": store.url, "endpoint": endpoint}


def _shardlake_version() -> str:
    try:
        return importlib.metadata.version("shardlake")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _trusted_record(store: Store, now: float) -> bool:
    """Whether a fresh probe record of this very store (same identity, same shardlake version,
    every create check passed, younger than :data:`PROBE_RECORD_TTL_S`) is at the root."""
    try:
        doc = json.loads(store.read(PROBE_RECORD_KEY))
    except (StoreError, ValueError):
        return False  # absent, unreadable or damaged: probe afresh
    if not isinstance(doc, dict) or doc.get("format") != _RECORD_FORMAT:
        return False
    checked_at = doc.get("checked_at")
    return (
        isinstance(checked_at, (int, float))
        and 0 <= now - checked_at < PROBE_RECORD_TTL_S
        and doc.get("store") == _store_identity(store)
        and doc.get("shardlake_version") == _shardlake_version()
        and set(CREATE_CHECKS) <= set(doc.get("checks_passed") or ())
    )


def _remember(store: Store, now: float, checks: list[ProbeCheck]) -> None:
    """Keep the record (in a dataset root only, so a bare store keeps no shardlake object)."""
    if not store.exists(_ROOT_MARKER):
        return
    doc = {
        "format": _RECORD_FORMAT,
        "checked_at": now,
        "store": _store_identity(store),
        "shardlake_version": _shardlake_version(),
        "checks_passed": [c.name for c in checks if c.ok],
    }
    store.write(PROBE_RECORD_KEY, json.dumps(doc, sort_keys=True).encode())
