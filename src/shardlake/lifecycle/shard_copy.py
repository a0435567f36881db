"""A shard copied from one store to another and verified on its way (export, issue #47).

The source shard is read once, in order, in :data:`CHUNK` pieces (the next one fetched while
the current one is sent). Every piece goes to the destination's streaming writer, and on its
way every payload's CRC-32 and every tar header is checked against the manifest - the checks
a read-back of the copy would make, on the bytes that were sent. That the destination stored
exactly those bytes is the store's own guarantee (docs/storage.md, "What is stored is what was
sent": every S3 part carries its ``Content-MD5``, Azure blocks theirs, GCS uploads are
compared with the MD5 GCS reports), so the copy is never read back. A copy that fails a check
is aborted before it becomes visible (the streaming write is discarded; a payload that fails
stops it before its piece is sent), so nothing unverified ever appears at the destination.
"""

from __future__ import annotations

import concurrent.futures as cf
import io
import zlib
from collections.abc import Generator, Iterator, Sequence
from typing import Any, BinaryIO, cast

from ..errors import FormatError, IntegrityError
from ..format.documents import ShardEntry
from ..format.tar import iter_members
from ..progress.bar import plural
from ..store import Store
from .common import Problem, ShardRow
from .verify import member_problem

__all__ = ["CHUNK", "copy_shard_verified"]

# Bytes read from the source per request (and held at once, besides the one read ahead).
CHUNK = 8 << 20


class _Mismatch(Exception):
    """The bytes on their way failed a check: abort this copy (raised as soon as a payload
    fails, so the rest of a damaged shard is never sent)."""


class _Payloads:
    """Running CRC-32 of every manifest row's payload over the bytes as they pass."""

    def __init__(self, rows: Sequence[ShardRow]) -> None:
        self._rows = sorted(rows, key=lambda row: row.offset)
        self._next = 0  # the first row whose payload has not started yet
        self._running: dict[int, int] = {}  # row index -> CRC-32 so far
        self.bad: list[tuple[ShardRow, str]] = []

    def update(self, start: int, data: bytes) -> None:
        end = start + len(data)
        rows = self._rows
        while self._next < len(rows) and rows[self._next].offset < end:
            self._running[self._next] = 0
            self._next += 1
        view = memoryview(data)
        for index in list(self._running):
            row = rows[index]
            lo, hi = max(row.offset, start), min(row.offset + row.size, end)
            crc = self._running[index]
            if lo < hi:
                crc = zlib.crc32(view[lo - start : hi - start], crc)
            if row.offset + row.size > end:
                self._running[index] = crc
                continue
            del self._running[index]
            if crc & 0xFFFFFFFF != row.crc32 & 0xFFFFFFFF:
                self.bad.append(
                    (
                        row,
                        f"payload checksum mismatch (crc32 {crc & 0xFFFFFFFF:08x}, manifest "
                        f"says {row.crc32 & 0xFFFFFFFF:08x})",
                    )
                )

    def unfinished(self) -> list[ShardRow]:
        """Rows whose payload did not end within the bytes seen (it runs past the shard)."""
        return [self._rows[i] for i in sorted(self._running)] + self._rows[self._next :]


class _Passing(io.RawIOBase):
    """The source shard as a forward-only file: every byte the tar parser reads or skips
    (and, at :meth:`drain`, the rest) is written to ``out`` and its payload CRCs updated."""

    def __init__(self, pieces: Iterator[bytes], out: BinaryIO, payloads: _Payloads) -> None:
        self._pieces, self._out, self._payloads = pieces, out, payloads
        self._piece = b""
        self._start = 0  # offset of the current piece in the shard
        self._pos = 0
        self.sent = 0

    def _advance(self) -> bool:
        piece = next(self._pieces, None)
        if piece is None:
            return False
        self._start += len(self._piece)
        self._piece = piece
        self._payloads.update(self._start, piece)
        if self._payloads.bad:
            raise _Mismatch  # not one more byte of a copy that will be aborted
        self._out.write(piece)
        self.sent += len(piece)
        return True

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = offset if whence == io.SEEK_SET else self._pos + offset
        if whence not in (io.SEEK_SET, io.SEEK_CUR) or target < self._start:
            raise OSError("a shard on its way is read forward only")
        self._pos = target
        return target

    def readinto(self, buffer: Any) -> int:
        # Fills ``buffer`` across pieces (tarfile takes a short read for the end of the data).
        view = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(view):
            while self._pos >= self._start + len(self._piece):
                if not self._advance():
                    return filled
            at = self._pos - self._start
            count = min(len(view) - filled, len(self._piece) - at)
            view[filled : filled + count] = self._piece[at : at + count]
            self._pos += count
            filled += count
        return filled

    def drain(self) -> None:
        while self._advance():
            pass


def _pieces(src: Store, key: str, size: int) -> Generator[bytes, None, None]:
    """``key``'s first ``size`` bytes in :data:`CHUNK` pieces, the next one read ahead."""
    spans = [(start, min(size, start + CHUNK)) for start in range(0, size, CHUNK)]
    with cf.ThreadPoolExecutor(1, thread_name_prefix="shardlake-copy-read") as pool:
        ahead: cf.Future[bytes] | None = None
        try:
            for index, (start, end) in enumerate(spans):
                piece = ahead.result() if ahead is not None else src.read_range(key, start, end)
                ahead = None
                if index + 1 < len(spans):
                    ahead = pool.submit(src.read_range, key, *spans[index + 1])
                yield piece
                if len(piece) < end - start:
                    return  # the source is shorter than the version says
        finally:
            if ahead is not None:
                ahead.cancel()


def _problems(
    passing: _Passing,
    payloads: _Payloads,
    pid: str,
    url: str,
    shard: ShardEntry,
    rows: Sequence[ShardRow],
) -> list[Problem]:
    """What the bytes sent show against the manifest: payloads, tar headers, size."""
    out: list[Problem] = []
    members: list[tuple[str, int, int]] = []
    try:
        for member in iter_members(cast(BinaryIO, passing), url):
            members.append((member.name, member.offset, member.size))
    except (FormatError, IntegrityError, OSError, EOFError) as exc:
        message = f"tar headers unreadable after {plural(len(members), 'member')}: {exc}"
        return [Problem(pid, url, None, None, message)]  # the rest is not sent: aborted
    passing.drain()
    if passing.sent != shard.size:
        message = f"shard is {plural(passing.sent, 'byte')}, version says {shard.size}"
        out.append(Problem(pid, url, None, None, message))
    for row in sorted(rows, key=lambda r: r.member):
        problem = member_problem(row, members, passing.sent)
        if problem is not None:
            out.append(Problem(pid, url, row.key, row.offset, problem))
    if not out:
        for row in payloads.unfinished():
            message = f"payload ends past the shard end ({plural(passing.sent, 'byte')})"
            out.append(Problem(pid, url, row.key, row.offset, message))
    return out


def copy_shard_verified(
    src: Store, dest: Store, pid: str, shard: ShardEntry, rows: Sequence[ShardRow]
) -> Problem | None:
    """Stream ``shard`` from ``src`` to ``dest``, checking it on its way (module docs).

    Returns None once the copy is complete and visible at ``dest``; else the first problem
    found, with nothing written (the upload was aborted). A source or destination that fails
    raises as the store does.
    """
    url = src.key_url(shard.key)
    payloads = _Payloads(rows)
    found: list[Problem] = []
    pieces = _pieces(src, shard.key, shard.size)
    try:
        with dest.open_writer(shard.key) as out:
            found = _problems(_Passing(pieces, out, payloads), payloads, pid, url, shard, rows)
            if found:
                raise _Mismatch
    except _Mismatch:
        if found:
            return found[0]
        row, message = payloads.bad[0]
        return Problem(pid, url, row.key, row.offset, message)
    finally:
        pieces.close()  # stop the read ahead now, not when collected
    return None
