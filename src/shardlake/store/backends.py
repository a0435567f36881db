"""Per-backend atomic primitives under :class:`shardlake.store.Store`.

Each backend states how it achieves create-if-absent, atomic overwrite and visible-when-complete
streaming writes; ``docs/storage.md`` explains the guarantees.  Backends work on filesystem
paths (``Store.path``) and raise the underlying library's exceptions; ``Store`` validates keys,
retries and translates errors.  Ranges handed to a backend are never empty (``end > start``).
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any, BinaryIO

import fsspec

from ..errors import CapabilityError, InvalidURLError, UsageError
from .keys import TEMP_PREFIX

Entry = tuple[str, int, "float | None"]


@dataclass(frozen=True)
class Leftover:
    """Staging a killed writer left behind: a local temp file or an unfinished multipart upload."""

    path: str
    started: float | None  # seconds since the epoch, None where unknown
    upload_id: str | None = None


def is_unsatisfiable_range(exc: BaseException) -> bool:
    """True for "range starts at or past the end" (HTTP 416) from s3fs / gcsfs."""
    if getattr(exc, "code", None) == 416 or getattr(exc, "status", None) == 416:
        return True
    text = str(exc).lower()
    return "range is not satisfiable" in text or "invalidrange" in text


def is_already_exists(exc: BaseException) -> bool:
    """True for a refused create-if-absent (EEXIST, HTTP 412 PreconditionFailed)."""
    if isinstance(exc, FileExistsError):
        return True
    if getattr(exc, "code", None) == 412 or getattr(exc, "status", None) == 412:
        return True
    return "preconditionfailed" in str(exc).replace(" ", "").lower()


class Backend:
    """Generic fsspec backend; subclasses override the atomic primitives.

    For protocols without a dedicated subclass, create-if-absent is whatever the fsspec
    implementation's ``pipe_file(mode="create")`` does (often check-then-write, not atomic).
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str) -> None:
        self.fs = fs
        self.root = root

    def leftovers(self, prefix_path: str) -> list[Leftover]:
        """Staging left by killed streaming writers under ``prefix_path`` (none by default)."""
        return []

    def discard_leftover(self, leftover: Leftover) -> None:
        raise NotImplementedError(f"{type(self).__name__} leaves no staging behind")

    def _fresh(self, path: str | None = None) -> None:
        """Drop cached listings so a check sees what other writers did since."""

    # --- reads -------------------------------------------------------------------------------

    def read(self, path: str) -> bytes:
        self._fresh(path)
        return bytes(self.fs.cat_file(path))

    def read_range(self, path: str, start: int, end: int) -> bytes:
        try:
            return bytes(self.fs.cat_file(path, start=start, end=end))
        except Exception as exc:
            if is_unsatisfiable_range(exc):  # start at/after the end: an empty slice
                return b""
            raise

    def read_ranges(self, paths: list[str], starts: list[int], ends: list[int]) -> list[bytes]:
        found = self.fs.cat_ranges(paths, starts, ends, on_error="return")
        out: list[bytes] = []
        for item in found:
            if isinstance(item, BaseException):
                if not is_unsatisfiable_range(item):
                    raise item
                item = b""
            out.append(bytes(item))
        return out

    def stat(self, path: str) -> tuple[int, float | None]:
        self._fresh(path)
        info = self.fs.info(path)
        if info.get("type") == "directory":
            raise FileNotFoundError(path)
        return int(info.get("size") or 0), _mtime_of(info)

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
        except FileNotFoundError:
            return False
        return True

    def _normalise(self, path: str) -> str:
        # fsspec object stores return "bucket/key"; the memory filesystem "/key".
        if self.root.startswith("/"):
            return path if path.startswith("/") else "/" + path
        return path.lstrip("/")

    def list(self, prefix_path: str) -> list[Entry]:
        """Objects strictly under the directory ``prefix_path`` (which ends in ``/``)."""
        self._fresh()
        try:
            found = self.fs.find(prefix_path.rstrip("/"), detail=True, withdirs=False)
        except FileNotFoundError:
            return []
        out: list[Entry] = []
        for raw, info in found.items():
            if info.get("type") == "directory":
                continue
            path = self._normalise(str(info.get("name") or raw))
            # find("a") may return the object "a" itself or, on some stores, "ab/..."
            if path.startswith(prefix_path):
                out.append((path, int(info.get("size") or 0), _mtime_of(info)))
        return out

    # --- writes ------------------------------------------------------------------------------

    def write(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data)
        self._fresh(path)

    def create(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data, mode="create")
        self._fresh(path)

    @contextmanager
    def open_writer(self, path: str) -> Iterator[BinaryIO]:
        # Never mode "xb": s3fs turns an empty "xb" file into an unconditional PUT.
        handle = self.fs.open(path, "wb")
        try:
            yield handle
        except BaseException:
            _discard(handle)
            raise
        handle.close()
        self._fresh(path)

    def delete(self, path: str) -> None:
        with suppress(FileNotFoundError):
            self.fs.rm_file(path)
        self._fresh(path)


def _discard(handle: Any) -> None:
    """Abandon a write handle so nothing is committed, not even by a later ``close``/``__del__``."""
    discard = getattr(handle, "discard", None)
    try:
        if callable(discard):
            discard()  # s3fs: abort the multipart upload; gcsfs: cancel the resumable session
    finally:
        # gcsfs' discard returns early (without closing) before an upload began; a later close()
        # from __del__ would then upload the buffered bytes.  Mark it closed so it never does.
        try:
            handle.buffer = None
            handle.closed = True
        except AttributeError:  # not an fsspec buffered file; nothing buffered to commit
            pass


def _mtime_of(info: dict[str, Any]) -> float | None:
    for name in ("mtime", "LastModified", "updated", "created"):
        value = info.get(name)
        if value is None:
            continue
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


class LocalBackend(Backend):
    """Local disk and NFS: temp file + fsync, then ``os.link`` (create) or ``os.replace``.

    ``os.link`` fails with EEXIST if the target exists, atomically, and the target appears with
    its complete bytes.  fsspec's ``pipe_file(mode="create")`` is check-then-write and ``O_EXCL``
    on the final name would expose a partial file, so neither is used.
    """

    def read(self, path: str) -> bytes:
        with _open_object(path) as f:
            return f.read()

    def read_range(self, path: str, start: int, end: int) -> bytes:
        with _open_object(path) as f:
            f.seek(start)
            return f.read(end - start)

    def read_ranges(self, paths: list[str], starts: list[int], ends: list[int]) -> list[bytes]:
        out: list[bytes] = []
        handles: dict[str, BinaryIO] = {}
        try:
            for path, start, end in zip(paths, starts, ends, strict=True):
                f = handles.get(path)
                if f is None:
                    f = handles[path] = _open_object(path)
                f.seek(start)
                out.append(f.read(end - start))
        finally:
            for f in handles.values():
                f.close()
        return out

    def stat(self, path: str) -> tuple[int, float | None]:
        st = os.stat(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(path)
        return st.st_size, st.st_mtime

    def exists(self, path: str) -> bool:
        return os.path.isfile(path)

    def list(self, prefix_path: str) -> list[Entry]:
        out: list[Entry] = []
        base = prefix_path.rstrip("/") or "/"
        if not os.path.isdir(base):
            return out
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.startswith(TEMP_PREFIX):
                    continue
                full = os.path.join(dirpath, name)
                try:
                    st = os.stat(full)
                except FileNotFoundError:  # deleted while listing
                    continue
                out.append((full, st.st_size, st.st_mtime))
        return out

    def leftovers(self, prefix_path: str) -> builtins.list[Leftover]:
        out: builtins.list[Leftover] = []
        for dirpath, _dirs, files in os.walk(prefix_path.rstrip("/") or "/"):
            for name in files:
                if name.startswith(TEMP_PREFIX):
                    path = os.path.join(dirpath, name)
                    try:
                        out.append(Leftover(path, os.stat(path).st_mtime))
                    except FileNotFoundError:  # its writer finished meanwhile
                        continue
        return sorted(out, key=lambda item: item.path)

    def discard_leftover(self, leftover: Leftover) -> None:
        _unlink_quietly(leftover.path)

    def _temp_path(self, path: str) -> str:
        directory, name = os.path.split(path)
        try:
            os.makedirs(directory, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise NotADirectoryError(f"a parent of {path} is an object, not a directory") from exc
        return os.path.join(directory, f"{TEMP_PREFIX}{uuid.uuid4().hex}-{name[:80]}")

    @staticmethod
    def _fsync_dir(directory: str) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write_temp(self, path: str, data: bytes) -> str:
        tmp = self._temp_path(path)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            _unlink_quietly(tmp)
            raise
        return tmp

    def write(self, path: str, data: bytes) -> None:
        tmp = self._write_temp(path, data)
        try:
            os.replace(tmp, path)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        self._fsync_dir(os.path.dirname(path))

    def create(self, path: str, data: bytes) -> None:
        tmp = self._write_temp(path, data)
        try:
            try:
                os.link(tmp, path)
            except FileExistsError:
                # NFSv3 LINK is not idempotent: if the reply to our LINK was lost, the client's
                # retransmit fails with EEXIST although the link is ours.  Same inode: we won.
                if not _same_file(tmp, path):
                    raise
            except OSError as exc:
                if isinstance(exc, (FileNotFoundError, PermissionError)):
                    raise
                raise CapabilityError(
                    f"{os.path.dirname(path)} does not support hard links ({exc.strerror}); "
                    "create-if-absent cannot be made atomic there - use another directory or "
                    "mount"
                ) from exc
        finally:
            _unlink_quietly(tmp)
        self._fsync_dir(os.path.dirname(path))

    @contextmanager
    def open_writer(self, path: str) -> Iterator[BinaryIO]:
        tmp = self._temp_path(path)
        try:
            with open(tmp, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        self._fsync_dir(os.path.dirname(path))

    def delete(self, path: str) -> None:
        _unlink_quietly(path)


def _open_object(path: str) -> BinaryIO:
    """Open an object for reading; a directory (or a path through a file) is "no such key",
    as it is on object stores."""
    try:
        return open(path, "rb")  # noqa: SIM115 - the caller closes it
    except (IsADirectoryError, NotADirectoryError):
        raise FileNotFoundError(errno.ENOENT, "no such object", path) from None


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _unlink_quietly(path: str) -> None:
    with suppress(FileNotFoundError):
        os.unlink(path)


class MemoryBackend(Backend):
    """fsspec's in-process memory filesystem; a process-wide lock makes create atomic.

    Memory stores live in one process: a pickled memory store opened in a spawned process sees
    an empty store (a forked one sees a copy as of the fork).
    """

    _lock = threading.Lock()

    def write(self, path: str, data: bytes) -> None:
        with self._lock:
            self.fs.pipe_file(path, data)

    def create(self, path: str, data: bytes) -> None:
        with self._lock:
            if self.fs.isfile(path):
                raise FileExistsError(path)
            self.fs.pipe_file(path, data)

    @contextmanager
    def open_writer(self, path: str) -> Iterator[BinaryIO]:
        buffer = io.BytesIO()
        yield buffer
        self.write(path, buffer.getvalue())


class _BucketBackend(Backend):
    """Object stores: listing caches are dropped before every check, and a request that fails
    because the bucket does not exist says so (not "no such key", not an empty listing)."""

    _bucket_seen = False

    def _fresh(self, path: str | None = None) -> None:
        self.fs.invalidate_cache(path)

    def _check_bucket(self, path: str) -> None:
        if self._bucket_seen:
            return
        bucket = path.split("/", 1)[0]
        if not self.fs.exists(bucket):
            raise FileNotFoundError(f"bucket does not exist: {bucket}")
        self._bucket_seen = True  # buckets rarely vanish; one check per filesystem suffices

    def list(self, prefix_path: str) -> list[Entry]:
        out = super().list(prefix_path)
        if not out:
            self._check_bucket(prefix_path)
        return out

    def read(self, path: str) -> bytes:
        try:
            return super().read(path)
        except FileNotFoundError:
            self._check_bucket(path)
            raise

    def stat(self, path: str) -> tuple[int, float | None]:
        try:
            return super().stat(path)
        except FileNotFoundError:
            self._check_bucket(path)
            raise

    def write(self, path: str, data: bytes) -> None:
        try:
            super().write(path, data)
        except FileNotFoundError:
            self._check_bucket(path)
            raise

    def create(self, path: str, data: bytes) -> None:
        try:
            self._create(path, data)
        except FileNotFoundError:
            self._check_bucket(path)
            raise
        self._fresh(path)

    def _create(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data, mode="create")


class S3Backend(_BucketBackend):
    """S3 (s3fs): PUT replaces atomically; create sends ``If-None-Match: *``.

    Streaming writes use a multipart upload (parts of ``default_block_size``, >= 5 MiB),
    completed at close and aborted on error; objects smaller than one part are a single PUT.
    A SIGKILLed writer cannot abort: its upload is found by :meth:`leftovers` (gc aborts it).
    """

    fast_reads: Any = None  # read.obstore_client.ObstoreReads with read_client="obstore"

    def read_ranges(self, paths: list[str], starts: list[int], ends: list[int]) -> list[bytes]:
        if self.fast_reads is not None and self.fast_reads.usable():
            try:
                out: list[bytes] = self.fast_reads.read_ranges(paths, starts, ends)
                if all(len(b) == e - s for b, s, e in zip(out, starts, ends, strict=True)):
                    return out
            except BaseException as exc:  # a Rust panic is a BaseException
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                # the s3fs path answers with the store's semantics and errors
        return super().read_ranges(paths, starts, ends)

    def leftovers(self, prefix_path: str) -> list[Leftover]:
        bucket, _, prefix = prefix_path.partition("/")
        out: list[Leftover] = []
        markers: dict[str, str] = {}
        while True:
            page = self.fs.call_s3(
                "list_multipart_uploads", Bucket=bucket, Prefix=prefix, **markers
            )
            for upload in page.get("Uploads", []) or []:
                started = upload.get("Initiated")
                when = started.timestamp() if hasattr(started, "timestamp") else None
                out.append(Leftover(f"{bucket}/{upload['Key']}", when, upload["UploadId"]))
            if not page.get("IsTruncated"):
                return out
            markers = {
                "KeyMarker": page["NextKeyMarker"],
                "UploadIdMarker": page["NextUploadIdMarker"],
            }

    def discard_leftover(self, leftover: Leftover) -> None:
        bucket, _, key = leftover.path.partition("/")
        self.fs.call_s3(
            "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=leftover.upload_id
        )


class GCSBackend(_BucketBackend):
    """GCS (gcsfs): simple uploads replace atomically; create sends ``ifGenerationMatch=0``.

    gcsfs ``open("xb")`` and resumable uploads do not carry the precondition everywhere (the
    fake-gcs-server emulator ignores it), so create always uses a single simple upload.
    """

    def _create(self, path: str, data: bytes) -> None:
        # chunksize above the size keeps pipe_file on the simple (precondition-honouring) upload.
        self.fs.pipe_file(path, data, mode="create", chunksize=len(data) + 1)


_BACKENDS: dict[str, type[Backend]] = {
    "file": LocalBackend,
    "local": LocalBackend,
    "memory": MemoryBackend,
    "s3": S3Backend,
    "s3a": S3Backend,
    "gs": GCSBackend,
    "gcs": GCSBackend,
}

_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}


def check_protocol(protocol: str) -> None:
    """Raise :class:`InvalidURLError` for a protocol fsspec does not know."""
    from fsspec.registry import known_implementations, registry

    if protocol not in known_implementations and protocol not in registry:
        raise InvalidURLError(
            f"unknown store protocol {protocol!r}: use an absolute path, file://, memory://, "
            "s3://BUCKET/PREFIX or gs://BUCKET/PREFIX"
        )


def _filesystem(protocol: str, storage_options: dict[str, Any]) -> fsspec.AbstractFileSystem:
    if protocol in ("gs", "gcs"):
        # gcsfs exports an experimental filesystem by default (GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT)
        # that probes bucket types through APIs emulators lack and hangs there; shardlake needs
        # only the plain JSON-API client, whatever the environment says.
        from gcsfs.core import GCSFileSystem

        return GCSFileSystem(**storage_options)
    return fsspec.filesystem(protocol, **storage_options)


def make_backend(protocol: str, root: str, storage_options: dict[str, Any]) -> Backend:
    """The backend for ``protocol`` with a filesystem built from ``storage_options``."""
    check_protocol(protocol)
    from ..read.obstore_client import READ_CLIENT_OPTION, READ_CLIENTS, ObstoreReads

    storage_options = dict(storage_options)
    read_client = storage_options.pop(READ_CLIENT_OPTION, "s3fs")
    if read_client not in READ_CLIENTS or (read_client != "s3fs" and protocol not in ("s3", "s3a")):
        raise UsageError(
            f"storage option {READ_CLIENT_OPTION}={read_client!r}: use 's3fs' (default) or "
            "'obstore' (s3:// only)"
        )
    try:
        fs = _filesystem(protocol, storage_options)
    except ImportError as exc:
        extra = _EXTRAS.get(protocol)
        hint = f"pip install 'shardlake[{extra}]'" if extra else "install its fsspec package"
        raise UsageError(f"store protocol {protocol!r} needs a missing package: {hint}") from exc
    except TypeError as exc:
        # An unknown storage option; name it without echoing any values.
        raise UsageError(
            f"invalid storage_options for {protocol!r} (keys: {', '.join(sorted(storage_options))}): "
            f"{exc}"
        ) from None
    cls = _BACKENDS.get(protocol, Backend)
    backend = cls(fs, root)
    if read_client == "obstore" and isinstance(backend, S3Backend):
        backend.fast_reads = ObstoreReads(storage_options)
    return backend
