"""The :class:`Store`: every byte shardlake reads or writes goes through one of these.

A store is a root URL plus an fsspec filesystem. Keys are ``/``-separated and relative to the
root. The atomic primitives (create-if-absent, atomic overwrite, streaming write visible only
when complete) differ per backend; :mod:`shardlake.store.backends` implements them.
"""

from __future__ import annotations

import builtins
import functools
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar, overload

import fsspec

from ..errors import (
    AlreadyExistsError,
    KeyNotFoundError,
    OutcomeUnknownError,
    ReadOnlyStoreError,
    RetriesExhaustedError,
    StoreError,
    TransientStoreError,
    UsageError,
)
from .backends import Backend, Leftover, is_already_exists
from .backends.registry import WRITABLE_STORES
from .classify import Verdict, classify
from .config import StoreConfig, make_backend
from .errors import translate_error
from .keys import check_key, check_prefix
from .layers import Request, StoreLayer
from .probe import prove_create_enforced
from .ranges import RangeBatch, check_range
from .retry import RetryLoop, RetryPolicy, has_answered, mark_answered
from .url import ParsedURL, parse_url, redact

__all__ = ["ObjectInfo", "Store", "open_store"]


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
        self.config = StoreConfig.parse(self.protocol, storage_options)
        self.retry = self.config.retry_policy(retry or RetryPolicy.from_env())
        self._storage_options = self.config.travelling_options()
        self._endpoint = self.config.endpoint_id(self.root)
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
        # Parsed again here: the endpoint the client reads from this process's environment.
        self.config = StoreConfig.parse(self.protocol, self._storage_options)
        self._endpoint = self.config.endpoint_id(self.root)
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
            backend = make_backend(self.config, self.root, self.retry)
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
                f"the root is stored ({WRITABLE_STORES})"
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
        if backend.networked:
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
        check_range(key, start, end)
        if end == start:
            self.stat(key)  # a zero-length range of a missing key is still an error
            return b""
        path = self.path(key)
        got = self._send(
            "read_range", key, path, lambda b: RangeBatch([path], [start], [end])(b)[0]
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
            check_range(key, start, end)
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
                RangeBatch(paths, starts, ends, multi=True, views=views),
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
            return backend.make_bucket(bucket)

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
            if not self._create_checked:
                # A layer may change what a create does: layered stores never trust a record.
                prove_create_enforced(self, trust_record=not self._layers)
                self._create_checked = True


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
        if storage_options:  # they would be ignored: an opened store has its own
            raise UsageError(
                f"storage options go with a URL; the opened store {url.url} has its own",
                options=("storage_options",),
            )
        return url
    store = Store(url, storage_options, retry=retry)
    store.backend  # noqa: B018 - fail now on unknown protocols, missing packages, bad options
    return store
