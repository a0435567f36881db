"""Metadata reads that are checked before use: re-read on a mismatch, then refused.

Every metadata object (version document, commit record, keyset, manifest) can prove its own
bytes: a content hash in its name, a digest in the entry that references it, or a digest it
carries over its own content (see docs/format.md, "Integrity"). :func:`read_verified` reads an
object and hands the bytes to a ``check`` that parses and verifies them. A check that fails with
:class:`~shardlake.errors.FormatError` may be a byte flipped in transit, so the object is read
again (bounded); when every read fails the object is refused - its bytes are never used - with
an error naming it and saying whether the reads agreed (corrupt at rest) or not (transport).

Failed *requests* are retried by the store; this module re-reads only bytes that arrived and do
not check out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..errors import FormatError
from ..store import Store
from .payloads import CORRUPT_AT_REST, TRANSPORT

__all__ = [
    "RefusedObjectError",
    "read_verified",
]

T = TypeVar("T")


class RefusedObjectError(FormatError):
    """A metadata object whose bytes never checked out; ``kind`` says whether every read agreed
    (:data:`CORRUPT_AT_REST`) or not (:data:`TRANSPORT`)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def read_verified(
    store: Store,
    key: str,
    check: Callable[[bytes], T],
    *,
    rereads: int | None = None,
) -> tuple[T, bytes]:
    """``(check(data), data)`` for the first read of ``key`` whose bytes pass ``check``.

    ``check`` raises :class:`FormatError` for bytes it refuses. After ``rereads`` extra reads
    (None: the store's ``retry.integrity_rereads``)
    the last error is raised again as :class:`RefusedObjectError`, with the verdict appended: ``corrupt at rest`` when every
    read returned the same bytes, ``transport error`` when they differed. A missing object
    (:class:`~shardlake.errors.KeyNotFoundError`) and store errors propagate unchanged.
    """
    if rereads is None:  # one re-read policy for every read: the store's
        rereads = store.retry.integrity_rereads
    seen: list[bytes] = []
    while True:
        data = store.read(key)
        try:
            return check(data), data
        except FormatError as exc:
            seen.append(data)
            if len(seen) > rereads:
                kind = verdict(seen)
                raise RefusedObjectError(f"{exc} ({kind}; read {len(seen)} times)", kind) from exc


def verdict(reads: list[bytes]) -> str:
    """:data:`CORRUPT_AT_REST` when every read (at least two) agrees, else :data:`TRANSPORT`."""
    agreed = len(reads) > 1 and all(data == reads[0] for data in reads)
    return CORRUPT_AT_REST if agreed else TRANSPORT
