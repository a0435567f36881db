"""The :class:`Store`: every byte shardlake reads or writes goes through one of these.

A store is a root URL plus an fsspec filesystem. Keys are ``/``-separated and relative to the
root. The atomic primitives (create-if-absent, atomic overwrite, streaming write visible only
when complete) differ per backend; :mod:`shardlake.store.backends` implements them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

import fsspec

from ..errors import CapabilityError, StoreError
from .backends import Backend, backend_for
from .errors import translate_error
from .keys import check_key, check_prefix
from .retry import RetryPolicy, call_with_retry
from .url import ParsedURL, parse_url, redact

T = TypeVar("T")


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing or stat knows about one object."""

    key: str
    size: int
    mtime: float | None  # seconds since the epoch, None where the backend does not say


class Store:
    """A root URL on local disk, NFS, S3, GCS or memory, addressed by relative keys.

    Stores are picklable (the filesystem is re-created from the URL and storage options in the
    receiving process), so DataLoader workers and pack worker processes can use them.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: RetryPolicy | None = None,
    ) -> None:
        self._parsed: ParsedURL = parse_url(url)
        self._storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self._backend: Backend | None = None
        self._create_checked = False
        self._lock = threading.Lock()

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
        return f"Store({self.url!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {
            "url": self._parsed.url if self.protocol != "file" else self.root,
            "raw_root": self._parsed,
            "storage_options": self._storage_options,
            "retry": self.retry,
            "create_checked": self._create_checked,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._parsed = state["raw_root"]
        self._storage_options = state["storage_options"]
        self.retry = state["retry"]
        self._backend = None
        self._create_checked = state["create_checked"]
        self._lock = threading.Lock()

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            fs = fsspec.filesystem(self.protocol, **self._storage_options)
            self._backend = backend_for(self.protocol, fs, self.root)
        return self._backend

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        return self.backend.fs

    def path(self, key: str) -> str:
        """The filesystem path of ``key`` (for fsspec calls and messages)."""
        return f"{self.root}/{check_key(key)}" if self.root not in ("", "/") else "/" + key

    def key_url(self, key: str) -> str:
        """A redacted URL naming ``key`` in this store, for messages."""
        return f"{self.url.rstrip('/')}/{key}"

    def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        return call_with_retry(
            fn,
            self.retry,
            describe=lambda: f"{op} {redact(self.key_url(key))}",
            translate=lambda exc: translate_error(exc, op, self.key_url(key)),
        )

    # --- reads -------------------------------------------------------------------------------

    def read(self, key: str) -> bytes:
        """The whole object at ``key``; :class:`KeyNotFoundError` if absent."""
        path = self.path(key)
        return self._call("read", key, lambda: self.backend.read(path))

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``key``, clipped at the object's end."""
        if start < 0 or end < start:
            raise ValueError(f"invalid range [{start}, {end}) for {self.key_url(key)}")
        if end == start:
            self.size(key)  # a zero-length range of a missing key is still an error
            return b""
        path = self.path(key)
        return self._call("read_range", key, lambda: self.backend.read_range(path, start, end))

    def read_ranges(self, ranges: Sequence[tuple[str, int, int]]) -> list[bytes]:
        """Many ``(key, start, end)`` ranges in one call (fsspec ``cat_ranges``), in order."""
        if not ranges:
            return []
        for key, start, end in ranges:
            if start < 0 or end < start:
                raise ValueError(f"invalid range [{start}, {end}) for {self.key_url(key)}")
        paths = [self.path(k) for k, _, _ in ranges]
        starts = [s for _, s, _ in ranges]
        ends = [e for _, _, e in ranges]
        first = ranges[0][0]
        return self._call(
            "read_ranges", first, lambda: self.backend.read_ranges(paths, starts, ends)
        )

    def stat(self, key: str) -> ObjectInfo:
        path = self.path(key)
        size, mtime = self._call("stat", key, lambda: self.backend.stat(path))
        return ObjectInfo(key, size, mtime)

    def size(self, key: str) -> int:
        return self.stat(key).size

    def exists(self, key: str) -> bool:
        path = self.path(key)
        return self._call("exists", key, lambda: self.backend.exists(path))

    def list_info(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object under the directory ``prefix`` (``a/`` never lists ``ab/``), sorted."""
        prefix = check_prefix(prefix)
        base = self.path(prefix.rstrip("/")) if prefix else self.root
        entries = self._call("list", prefix or ".", lambda: self.backend.list(base))
        root_len = len(self.root.rstrip("/")) + 1 if self.root not in ("", "/") else 1
        out = [ObjectInfo(path[root_len:], size, mtime) for path, size, mtime in entries]
        out.sort(key=lambda info: info.key)
        return out

    def list(self, prefix: str = "") -> list[str]:
        return [info.key for info in self.list_info(prefix)]

    # --- writes ------------------------------------------------------------------------------

    def write(self, key: str, data: bytes) -> None:
        """Atomic overwrite: readers see the old bytes or the new ones, never a mix."""
        path = self.path(key)
        self._call("write", key, lambda: self.backend.write(path, bytes(data)))

    def create(self, key: str, data: bytes) -> None:
        """Create-if-absent: :class:`AlreadyExistsError` if ``key`` exists, atomic on every backend.

        The winner's bytes are complete the first moment anyone can see the key.
        """
        path = self.path(key)
        self._call("create", key, lambda: self.backend.create(path, bytes(data)))

    @contextmanager
    def open_writer(self, key: str) -> Iterator[BinaryIO]:
        """Stream a large object; it becomes visible at ``key`` only when the block exits cleanly.

        On an exception the partial object is discarded (temp file removed, multipart upload
        aborted) and nothing appears at ``key``.
        """
        path = self.path(key)
        try:
            with self.backend.open_writer(path) as handle:
                yield handle
        except StoreError:
            raise
        except Exception as exc:
            translated = translate_error(exc, "write", self.key_url(key))
            if translated is exc or not isinstance(translated, StoreError):
                raise
            raise translated from exc

    def delete(self, key: str) -> None:
        """Delete ``key``; a missing key is not an error."""
        path = self.path(key)
        self._call("delete", key, lambda: self.backend.delete(path))

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

        Raises :class:`CapabilityError` for a store that silently ignores the precondition
        (some S3-compatible servers do). Reading such a store still works.
        """
        with self._lock:
            if self._create_checked:
                return
            from .capability import probe_create_if_absent

            if not probe_create_if_absent(self):
                raise CapabilityError(
                    f"{self.url} does not enforce create-if-absent (conditional writes); "
                    "refusing to publish there. Use a store that honours If-None-Match / "
                    "ifGenerationMatch=0."
                )
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
    """
    if isinstance(url, Store):
        return url
    store = Store(url, storage_options, retry=retry)
    store.backend  # noqa: B018 - fail now on unknown protocols or missing packages
    return store
