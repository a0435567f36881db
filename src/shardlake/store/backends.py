"""Per-backend atomic primitives under :class:`shardlake.store.Store`.

Each backend states how it achieves create-if-absent, atomic overwrite and visible-when-complete
streaming writes; ``docs/storage.md`` explains the guarantees.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

import fsspec

from ..errors import InvalidURLError


class Backend:
    """Generic fsspec backend; subclasses override the atomic primitives."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str) -> None:
        self.fs = fs
        self.root = root

    # reads
    def read(self, path: str) -> bytes:
        return bytes(self.fs.cat_file(path))

    def read_range(self, path: str, start: int, end: int) -> bytes:
        return bytes(self.fs.cat_file(path, start=start, end=end))

    def read_ranges(self, paths: list[str], starts: list[int], ends: list[int]) -> list[bytes]:
        out = self.fs.cat_ranges(paths, starts, ends, on_error="raise")
        for item in out:
            if isinstance(item, BaseException):
                raise item
        return [bytes(b) for b in out]

    def stat(self, path: str) -> tuple[int, float | None]:
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

    def list(self, base: str) -> list[tuple[str, int, float | None]]:
        try:
            found = self.fs.find(base, detail=True, withdirs=False)
        except FileNotFoundError:
            return []
        out = []
        for path, info in found.items():
            if info.get("type") == "directory":
                continue
            path = path.lstrip("/") if not self.root.startswith("/") else path
            out.append((path, int(info.get("size") or 0), _mtime_of(info)))
        return out

    # writes
    def write(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data)

    def create(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data, mode="create")

    @contextmanager
    def open_writer(self, path: str) -> Iterator[BinaryIO]:
        handle = self.fs.open(path, "wb")
        try:
            yield handle
        except BaseException:
            discard = getattr(handle, "discard", None)
            if callable(discard):
                discard()
            else:
                handle.close()
                self.delete(path)
            raise
        handle.close()

    def delete(self, path: str) -> None:
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            pass


def _mtime_of(info: dict[str, Any]) -> float | None:
    for field in ("mtime", "LastModified", "updated", "created"):
        value = info.get(field)
        if value is None:
            continue
        if isinstance(value, (int, float)):
            return float(value)
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        if isinstance(value, str):
            from datetime import datetime

            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


class LocalBackend(Backend):
    """Local disk and NFS: temp file + fsync, then ``os.link`` (create) or ``os.replace``.

    ``os.link`` fails with EEXIST if the target exists, atomically, and the target appears
    with its complete bytes; fsspec's ``pipe_file(mode="create")`` is check-then-write and
    ``O_EXCL`` on the final name would expose a partial file, so neither is used.
    """

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def read_range(self, path: str, start: int, end: int) -> bytes:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(max(0, end - start))

    def read_ranges(self, paths: list[str], starts: list[int], ends: list[int]) -> list[bytes]:
        return [self.read_range(p, s, e) for p, s, e in zip(paths, starts, ends, strict=True)]

    def stat(self, path: str) -> tuple[int, float | None]:
        st = os.stat(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(path)
        return st.st_size, st.st_mtime

    def exists(self, path: str) -> bool:
        return os.path.isfile(path)

    def list(self, base: str) -> list[tuple[str, int, float | None]]:
        out: list[tuple[str, int, float | None]] = []
        if not os.path.isdir(base):
            return out
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.startswith(".shardlake-tmp-"):
                    continue
                full = os.path.join(dirpath, name)
                try:
                    st = os.stat(full)
                except FileNotFoundError:
                    continue
                out.append((full, st.st_size, st.st_mtime))
        return out

    def _temp_path(self, path: str) -> str:
        directory, name = os.path.split(path)
        os.makedirs(directory, exist_ok=True)
        return os.path.join(directory, f".shardlake-tmp-{uuid.uuid4().hex}-{name}")

    @staticmethod
    def _fsync_dir(directory: str) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write_temp(self, path: str, data: bytes) -> str:
        tmp = self._temp_path(path)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
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
            os.link(tmp, path)
        finally:
            _unlink_quietly(tmp)
        self._fsync_dir(os.path.dirname(path))

    @contextmanager
    def open_writer(self, path: str) -> Iterator[BinaryIO]:
        tmp = self._temp_path(path)
        try:
            with open(tmp, "wb") as f:
                yield f  # type: ignore[misc]
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        self._fsync_dir(os.path.dirname(path))

    def delete(self, path: str) -> None:
        _unlink_quietly(path)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class MemoryBackend(Backend):
    """fsspec's in-process memory filesystem; a process-wide lock makes create atomic."""

    _lock = threading.Lock()

    def write(self, path: str, data: bytes) -> None:
        with self._lock:
            self.fs.pipe_file(path, data)

    def create(self, path: str, data: bytes) -> None:
        with self._lock:
            if self.fs.exists(path):
                raise FileExistsError(path)
            self.fs.pipe_file(path, data)

    @contextmanager
    def open_writer(self, path: str) -> Iterator[BinaryIO]:
        import io

        buffer = io.BytesIO()
        yield buffer
        self.write(path, buffer.getvalue())


class S3Backend(Backend):
    """S3 (s3fs): PUT replaces atomically; create uses ``If-None-Match: *``.

    Streaming writes use multipart upload, completed at close and aborted on error.
    """

    def create(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data, mode="create")

    def list(self, base: str) -> list[tuple[str, int, float | None]]:
        self.fs.invalidate_cache()
        return super().list(base)

    def stat(self, path: str) -> tuple[int, float | None]:
        self.fs.invalidate_cache(path)
        return super().stat(path)


class GCSBackend(S3Backend):
    """GCS (gcsfs): simple uploads replace atomically; create uses ``ifGenerationMatch=0``.

    gcsfs ``open("xb")`` and resumable uploads do not carry the precondition everywhere (the
    fake-gcs-server emulator ignores it), so create goes through ``pipe_file(mode="create")``.
    """


_BACKENDS: dict[str, type[Backend]] = {
    "file": LocalBackend,
    "local": LocalBackend,
    "memory": MemoryBackend,
    "s3": S3Backend,
    "s3a": S3Backend,
    "gs": GCSBackend,
    "gcs": GCSBackend,
}


def backend_for(protocol: str, fs: fsspec.AbstractFileSystem, root: str) -> Backend:
    cls = _BACKENDS.get(protocol, Backend)
    return cls(fs, root)


def check_protocol(protocol: str) -> None:
    """Raise :class:`InvalidURLError` for a protocol fsspec does not know."""
    from fsspec.registry import known_implementations, registry

    if protocol not in known_implementations and protocol not in registry:
        raise InvalidURLError(f"unknown store protocol {protocol!r}: use a path, file://, s3:// or gs://")
