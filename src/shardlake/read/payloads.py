"""The one payload read path: fetch sample payloads, check their CRC-32, re-read on a mismatch.

Retries of failed *requests* belong to the store (:mod:`shardlake.store.retry`). This module
re-reads only when a request succeeded but its bytes do not match the manifest (short body,
CRC-32 mismatch): a flipped byte or a truncated body in transit must cost a re-read, not a
false corruption verdict. After ``rereads`` extra reads a mismatch is classified:

* :data:`CORRUPT_AT_REST` - every read returned the same wrong bytes: the stored object is bad.
* :data:`TRANSPORT` - the reads disagreed with each other: the bytes were damaged on the way
  (or the store could not be read at all); the stored object may well be intact.

get, scrub, verify and export use it; ranges are coalesced by :meth:`Store.read_ranges`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import IntegrityError, KeyNotFoundError, StoreError
from ..format.codec import payload_checksum
from ..progress.bar import plural
from ..store import Store
from .receipts import superseded_error

__all__ = [
    "CORRUPT_AT_REST",
    "TRANSPORT",
    "PayloadRead",
    "PayloadRef",
    "describe",
    "fetch_payload",
    "read_payloads",
]

CORRUPT_AT_REST = "corrupt at rest"
TRANSPORT = "transport error"


@dataclass(frozen=True)
class PayloadRef:
    """Where one payload lies and what it must hash to (a manifest row's core columns)."""

    shard: str  # store key of the shard
    offset: int
    size: int
    crc32: int
    key: str = ""  # sample key, for messages


@dataclass(frozen=True)
class PayloadRead:
    """The outcome of reading one payload.

    ``payload`` is set when the bytes match the manifest; otherwise ``problem`` says what was
    wrong with the last read and ``kind`` is :data:`CORRUPT_AT_REST` or :data:`TRANSPORT`.
    ``reads`` counts the reads it took (1 when the first read was good).
    """

    ref: PayloadRef
    payload: bytes | None
    problem: str | None = None
    kind: str | None = None
    reads: int = 1
    error: StoreError | None = None  # the store error that outlasted the store's retries

    @property
    def ok(self) -> bool:
        return self.payload is not None


def mismatch(ref: PayloadRef, data: bytes) -> str | None:
    """Why ``data`` is not ``ref``'s payload (None when it is)."""
    if len(data) != ref.size:
        return f"payload truncated: {len(data)} of {plural(ref.size, 'byte')}"
    actual = payload_checksum(data)
    if actual != ref.crc32 & 0xFFFFFFFF:
        return f"payload checksum mismatch (crc32 {actual:08x}, manifest says {ref.crc32:08x})"
    return None


def _read(store: Store, refs: Sequence[PayloadRef], single: bool) -> list[bytes] | StoreError:
    try:
        if single:  # one sample (get): one plain ranged read
            ref = refs[0]
            return [store.read_range(ref.shard, ref.offset, ref.offset + ref.size)]
        return store.read_ranges([(r.shard, r.offset, r.offset + r.size) for r in refs])
    except StoreError as exc:  # the store already retried; a miss is the caller's to report
        return exc


def read_payloads(
    store: Store,
    refs: Sequence[PayloadRef],
    *,
    rereads: int | None = None,
    single: bool = False,
) -> list[PayloadRead]:
    """Read ``refs`` (one coalesced multi-range read), re-reading mismatches up to ``rereads``.

    ``single`` (one ref) reads with :meth:`Store.read_range` instead of ``read_ranges``.
    Never raises for a bad payload: each result says ok, corrupt at rest or transport error. A
    missing shard (:class:`~shardlake.errors.KeyNotFoundError`) propagates: that is no payload
    question. Other store errors that outlast the store's retries become transport results.
    ``rereads`` None: the store's ``retry.integrity_rereads``.
    """
    if rereads is None:
        rereads = store.retry.integrity_rereads
    first = _read(store, refs, single)
    if isinstance(first, StoreError):
        _reraise_missing(store, first, refs)
        return [PayloadRead(r, None, str(first), TRANSPORT, error=first) for r in refs]
    seen: list[list[bytes]] = [[data] for data in first]
    results: list[PayloadRead | None] = [
        PayloadRead(r, data) if mismatch(r, data) is None else None
        for r, data in zip(refs, first, strict=True)
    ]
    for attempt in range(rereads):
        pending = [i for i, res in enumerate(results) if res is None]
        if not pending:
            break
        again = _read(store, [refs[i] for i in pending], single)
        if isinstance(again, StoreError):
            _reraise_missing(store, again, [refs[i] for i in pending])
            continue
        for i, data in zip(pending, again, strict=True):
            seen[i].append(data)
            if mismatch(refs[i], data) is None:
                results[i] = PayloadRead(refs[i], data, reads=attempt + 2)
    return [res if res is not None else _verdict(refs[i], seen[i]) for i, res in enumerate(results)]


def _verdict(ref: PayloadRef, reads: list[bytes]) -> PayloadRead:
    """Corrupt at rest only when every read (at least two) returned the same wrong bytes."""
    agreed = len(reads) > 1 and all(data == reads[0] for data in reads)
    problem = mismatch(ref, reads[-1]) or "payload could not be read"
    return PayloadRead(ref, None, problem, CORRUPT_AT_REST if agreed else TRANSPORT, len(reads))


def _reraise_missing(store: Store, exc: StoreError, refs: Sequence[PayloadRef]) -> None:
    if isinstance(exc, KeyNotFoundError):
        for shard in dict.fromkeys(r.shard for r in refs):
            redacted = superseded_error(store, shard)  # a forget deleted it: say which
            if redacted is not None:
                raise redacted from exc
        raise exc


def fetch_payload(store: Store, ref: PayloadRef, *, rereads: int | None = None) -> bytes:
    """One payload, checked; :class:`IntegrityError` naming shard, key, offset and the verdict."""
    (result,) = read_payloads(store, [ref], rereads=rereads, single=True)
    if result.error is not None:
        raise result.error
    if result.payload is None:
        raise IntegrityError(f"{describe(store, ref)}: {result.problem} ({result.kind})")
    return result.payload


def describe(store: Store, ref: PayloadRef) -> str:
    """``<shard url> key '<key>' offset <n>``: where a payload lies, for messages."""
    return f"{store.key_url(ref.shard)} key {ref.key!r} offset {ref.offset}"
