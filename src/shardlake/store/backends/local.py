"""Local disk and NFS: temp file + fsync, then ``os.link`` (create) or ``os.replace``."""

from __future__ import annotations

import builtins
import errno
import mmap
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import BinaryIO

from ...errors import CapabilityError, InvalidURLError
from ..keys import TEMP_PREFIX
from ..layers import note_read_client
from ..redact import redact
from .base import Backend, Entry, Leftover

__all__ = ["LocalBackend"]


class LocalBackend(Backend):
    """Local disk and NFS: temp file + fsync, then ``os.link`` (create) or ``os.replace``.

    ``os.link`` fails with EEXIST if the target exists, atomically, and the target appears with
    its complete bytes.  fsspec's ``pipe_file(mode="create")`` is check-then-write and ``O_EXCL``
    on the final name would expose a partial file, so neither is used.
    """

    protocols = ("file", "local")  # and plain absolute paths (registry.PATH_BACKEND)
    networked = False
    local_paths = True

    @classmethod
    def split_root(cls, protocol: str, rest: str, url: str) -> tuple[str, str]:
        if not rest.startswith("/"):
            raise InvalidURLError(
                f"store URL {redact(url)!r} is not absolute: write {protocol}:///absolute/path"
            )
        path = os.path.normpath(rest)
        return path, f"{protocol}://{path}"

    def batches_single_ranges(self) -> bool:
        return True  # read_ranges maps the loader's ranges (views) instead of copying them

    def read(self, path: str) -> bytes:
        with _open_object(path) as f:
            return f.read()

    def read_range(self, path: str, start: int, end: int) -> bytes:
        with _open_object(path) as f:
            f.seek(start)
            found = f.read(end - start)
        note_read_client("local")
        return found

    def read_ranges(
        self, paths: list[str], starts: list[int], ends: list[int], *, views: bool = False
    ) -> list[bytes | memoryview]:
        out: list[bytes | memoryview] = []
        handles: dict[str, BinaryIO] = {}
        try:
            for path, start, end in zip(paths, starts, ends, strict=True):
                f = handles.get(path)
                if f is None:
                    f = handles[path] = _open_object(path)
                if views:
                    out.append(_mapped_range(f, start, end))
                    continue
                f.seek(start)
                out.append(f.read(end - start))
        finally:
            for f in handles.values():
                f.close()
        note_read_client("local")
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


def _mapped_range(f: BinaryIO, start: int, end: int) -> memoryview | bytes:
    """Bytes ``[start, end)`` of an open object (clipped to its size), mapped from the page cache
    rather than copied: a read copies every byte into fresh memory and faults in each of its
    pages. The pages are mapped at once (``MAP_POPULATE``) here, in the reading thread, and
    unmapped when the last view of them is gone. Shards are never rewritten in place, so the
    mapping cannot change under the reader."""
    size = os.fstat(f.fileno()).st_size
    end = min(end, size)
    if end <= start:
        return b""
    base = start - start % mmap.ALLOCATIONGRANULARITY
    flags = getattr(mmap, "MAP_SHARED", 0) | getattr(mmap, "MAP_POPULATE", 0)
    try:
        if flags:
            mapped = mmap.mmap(
                f.fileno(), end - base, flags=flags, prot=mmap.PROT_READ, offset=base
            )
        else:  # Windows
            mapped = mmap.mmap(f.fileno(), end - base, access=mmap.ACCESS_READ, offset=base)
    except OSError:  # a filesystem that cannot map files (some FUSE mounts): read a copy
        f.seek(start)
        return f.read(end - start)
    return memoryview(mapped)[start - base :]


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _unlink_quietly(path: str) -> None:
    with suppress(FileNotFoundError):
        os.unlink(path)
