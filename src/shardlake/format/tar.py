"""Byte-deterministic POSIX (PAX) tar shards: one ``<escaped key>.safetensors.zst`` member a sample.

Headers carry no timestamps, owners or host-specific fields, so the same members in the same
order always give the same bytes. GNU tar and webdataset read the shards as ordinary tar files.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple

from ..errors import FormatError
from .layout import member_name

__all__ = [
    "BLOCK",
    "END_OF_ARCHIVE",
    "ShardWriter",
    "iter_members",
]

BLOCK = 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)


def member_header(name: str, size: int) -> bytes:
    """The deterministic header block(s) for a regular-file member."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


class ShardWriter:
    """Append sample members to a writable binary handle; :meth:`close` ends the archive.

    The handle is not closed here (a :meth:`Store.open_writer` block owns it).
    """

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self.bytes_written = 0
        self.members = 0
        self._closed = False

    def add(self, key: str, payload: bytes) -> tuple[int, int]:
        """Write one member; return ``(member_index, payload_offset)`` in the shard."""
        if self._closed:
            raise ValueError("ShardWriter is closed")
        header = member_header(member_name(key), len(payload))
        offset = self.bytes_written + len(header)
        pad = -len(payload) % BLOCK
        self._handle.write(header)
        self._handle.write(payload)
        if pad:
            self._handle.write(b"\0" * pad)
        self.bytes_written = offset + len(payload) + pad
        index = self.members
        self.members += 1
        return index, offset

    def size_with(self, key: str, payload_size: int) -> int:
        """The shard's size after adding a member of ``payload_size`` and closing."""
        header = len(member_header(member_name(key), payload_size))
        return (
            self.bytes_written
            + header
            + payload_size
            + (-payload_size % BLOCK)
            + len(END_OF_ARCHIVE)
        )

    def close(self) -> None:
        if not self._closed:
            self._handle.write(END_OF_ARCHIVE)
            self.bytes_written += len(END_OF_ARCHIVE)
            self._closed = True


class Member(NamedTuple):
    name: str
    offset: int  # payload offset in the shard
    size: int


def iter_members(fileobj: BinaryIO | bytes, where: str = "shard") -> Iterator[Member]:
    """Parse a shard's member headers (seeking over payloads) and yield name, offset, size."""
    if isinstance(fileobj, (bytes, bytearray, memoryview)):
        fileobj = io.BytesIO(bytes(fileobj))
    try:
        with tarfile.open(fileobj=fileobj, mode="r:") as archive:
            for info in archive:
                if info.isfile():
                    yield Member(info.name, info.offset_data, info.size)
    except tarfile.TarError as exc:
        raise FormatError(f"{where}: not a readable tar archive ({exc})") from exc
