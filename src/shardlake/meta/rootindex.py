"""Writing and checking the root index ``index.json`` on stores that can list and write.

The index (``shardlake.format.rootindex``) is rewritten after every commit and keyset change
(:func:`write_index`, called by ``meta.commits.commit_state`` and ``meta.keysets``), so a root
can be served as static files; a reader that can list checks it against the commit log and the
keysets (:func:`index_problems`, run by ``scrub``). Readers over HTTP list through it: this
module installs :class:`IndexListing` as the HTTP backend's listing (``store.backends.http``
knows nothing of the index but its key; the store layer sits below the format layer).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import CapabilityError, FormatError, KeyNotFoundError
from ..format.layout import (
    COMMITS_DIR,
    KEYSETS_DIR,
    ROOT_INDEX,
    ROOT_MARKER,
    commit_key,
    keyset_key,
)
from ..format.rootindex import IndexListing, KeysetRef, RootIndex
from ..store import Store
from ..store.backends.http import list_roots_with

if TYPE_CHECKING:
    from .state import RootState

__all__ = [
    "RootIndexListing",
    "check_indexed",
    "index_problems",
    "indexed_keyset",
    "write_index",
]

log = logging.getLogger("shardlake.index")
_PARQUET = ".parquet"
_TOMBSTONE = ".json"


def read_index(store: Store) -> RootIndex | None:
    """The root's index, checked (:class:`FormatError` if damaged); None where there is none."""
    try:
        data = store.read(ROOT_INDEX)
    except KeyNotFoundError:
        return None
    return RootIndex.from_bytes(data, store.key_url(ROOT_INDEX))


def indexed_keyset(store: Store, name: str) -> KeysetRef | None:
    """What the root index records for keyset ``name``, on a store read through its index
    (``http(s)://``: a reader there checks the keyset's bytes against it); None elsewhere, or
    where the index does not name it."""
    if store.backend.read_only is None:
        return None
    index = read_index(store)
    return None if index is None else index.keysets.get(name)


def check_indexed(ref: KeysetRef | None, data: bytes, where: str) -> None:
    """Refuse keyset bytes that differ from what the root index records for them."""
    if ref is None:
        return
    if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
        raise FormatError(
            f"{where}: does not match the size and sha256 {ROOT_INDEX} records for it (damaged, "
            f"or {ROOT_INDEX} is stale: run `shardlake index ROOT` where the root is stored)"
        )


def _retired(store: Store, name: str, data: bytes) -> bool:
    """Whether the tombstone of ``name`` retires exactly this keyset object (meta.keysets'
    rule: it names the keyset's version hash and creation time)."""
    try:
        doc = json.loads(store.read(f"{KEYSETS_DIR}/{name}{_TOMBSTONE}"))
        meta = pq.ParquetFile(pa.BufferReader(data)).schema_arrow.metadata or {}
    except KeyNotFoundError:
        return False
    except (ValueError, pa.ArrowException, OSError):
        return False  # damaged: the keyset's own reader reports it
    body = {
        "created_at": meta.get(b"shardlake.created_at", b"").decode(),
        "version_hash": meta.get(b"shardlake.version_hash", b"").decode(),
    }
    identity = hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    ).hexdigest()
    return isinstance(doc, dict) and doc.get("keyset") == identity


def live_keysets(store: Store, previous: RootIndex | None = None) -> dict[str, KeysetRef]:
    """Every live keyset with the digest and size of its object (one listing of ``keysets/``;
    a keyset ``previous`` names with the same size is not read again: keysets are immutable)."""
    parquets: dict[str, int] = {}
    tombstones: set[str] = set()
    for info in store.list_info(KEYSETS_DIR):
        name = info.key[len(KEYSETS_DIR) + 1 :]
        if "/" in name:
            continue
        if name.endswith(_PARQUET):
            parquets[name[: -len(_PARQUET)]] = info.size
        elif name.endswith(_TOMBSTONE):
            tombstones.add(name[: -len(_TOMBSTONE)])
    out: dict[str, KeysetRef] = {}
    for name, size in sorted(parquets.items()):
        known = previous.keysets.get(name) if previous is not None else None
        if known is not None and known.size == size and name not in tombstones:
            out[name] = known
            continue
        try:
            data = store.read(keyset_key(name))
        except KeyNotFoundError:
            continue  # deleted while listing
        if name in tombstones and _retired(store, name, data):
            continue
        out[name] = KeysetRef(hashlib.sha256(data).hexdigest(), len(data))
    return out


def build_index(
    store: Store,
    seq: int,
    versions: Mapping[str, str],
    retired: Sequence[str],
    latest: str | None,
    previous: RootIndex | None = None,
) -> RootIndex:
    """The index of commit ``seq`` (its state given) and the root's live keysets."""
    return RootIndex(
        commit=seq,
        versions=tuple(versions.items()),
        retired=tuple(retired),
        latest=latest,
        keysets=live_keysets(store, previous),
        written_at=datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
    )


def write_index(
    store: Store, state: RootState, *, strict: bool = False, rehash: bool = False
) -> RootIndex | None:
    """Rewrite ``index.json`` for the commit of ``state`` (atomic overwrite; unchanged content
    is not rewritten). An index already naming a later commit keeps that commit's state.

    The commit is what publishes; the index only mirrors it. So a failure here is logged with
    the fix (``shardlake index ROOT``) unless ``strict`` (the upgrade command) - readers over
    HTTP probe past a stale index for later commits, and ``scrub`` reports it. ``rehash``:
    hash every keyset again (an unchanged size is otherwise taken as an unchanged keyset)."""
    try:
        try:
            previous = read_index(store)
        except FormatError:
            previous = None  # damaged: rewritten from the commit log
        seq, versions, retired, latest = state.seq, state.versions, state.retired, state.latest
        if previous is not None and previous.commit > seq:
            seq, versions = previous.commit, dict(previous.versions)
            retired, latest = previous.retired, previous.latest
        # rehash: a keyset was rewritten in place (forget), so its size proves nothing.
        index = build_index(store, seq, versions, retired, latest, None if rehash else previous)
        if previous is not None and previous.same_content(index):
            return previous
        store.write(ROOT_INDEX, index.to_bytes())
        return index
    except Exception as exc:  # noqa: BLE001 - the commit stands whatever happens here
        if strict:
            raise
        log.warning(
            "%s: %s was not updated (%s); HTTP readers may not see the newest keysets until "
            "`shardlake index %s` rewrites it",
            store.url,
            ROOT_INDEX,
            exc,
            store.url,
        )
        return None


def index_problems(store: Store, state: RootState) -> list[str]:
    """How the stored index differs from ``state`` (the commit log's) and the live keysets
    (each keyset re-hashed); empty when it matches. A root without an index is not a problem (it was
    published before the index existed) but cannot be served over HTTP: say so."""
    try:
        stored = read_index(store)
    except FormatError as exc:
        return [f"{exc}; rewrite it with `shardlake index ROOT`"]
    if stored is None:
        return []
    fresh = build_index(store, state.seq, state.versions, state.retired, state.latest)
    problems = []
    where = store.key_url(ROOT_INDEX)
    if stored.commit != fresh.commit or (stored.versions, stored.retired, stored.latest) != (
        fresh.versions,
        fresh.retired,
        fresh.latest,
    ):
        problems.append(f"{where} names commit {stored.commit}, the commit log is at {state.seq}")
    if dict(stored.keysets) != dict(fresh.keysets):
        names = sorted(
            n
            for n in set(stored.keysets) | set(fresh.keysets)
            if stored.keysets.get(n) != fresh.keysets.get(n)
        )
        problems.append(f"{where}: keysets differ from the root's ({', '.join(names[:10])})")
    return [f"{p}; rewrite it with `shardlake index ROOT`" for p in problems]


class RootIndexListing:
    """The listings a reader needs where the store cannot list (HTTP), from the root index:
    ``commits/`` gives the commit the index names and any later one found by probing the next
    commit key (commits are never deleted, so a stale index is caught up), ``keysets/`` the
    keysets the index names. Any other listing cannot be answered (None)."""

    index_key = ROOT_INDEX

    def list(
        self,
        prefix: str,
        read: Callable[[str], bytes],
        exists: Callable[[str], bool],
        url: Callable[[str], str],
    ) -> list[tuple[str, int]] | None:
        if prefix not in (f"{COMMITS_DIR}/", f"{KEYSETS_DIR}/"):
            return None
        index = self._index(read, exists, url)
        if index is None:
            return []
        if prefix == f"{KEYSETS_DIR}/":
            return [(keyset_key(name), size) for name, size in sorted(index.keysets.items())]
        seq = index.commit
        while exists(commit_key(seq + 1)):  # the index may lag the log
            seq += 1
        return [] if seq == 0 else [(commit_key(seq), 0)]

    @staticmethod
    def _index(
        read: Callable[[str], bytes], exists: Callable[[str], bool], url: Callable[[str], str]
    ) -> IndexListing | None:
        """The index's listing facts; None where the location has no root at all."""
        try:
            data = read(ROOT_INDEX)
        except FileNotFoundError:
            if not exists(ROOT_MARKER):
                return None  # no root here: readers report "no shardlake root"
            raise CapabilityError(
                f"{url('').rstrip('/')} has no {ROOT_INDEX}, which an HTTP reader needs in place "
                "of a listing (the root was published before it existed): write it with "
                "Root.write_index() where the root is stored, or re-export it",
                hint="where the root is stored: shardlake index STORED_ROOT",
            ) from None
        try:
            return IndexListing.from_bytes(data)
        except ValueError as exc:
            raise CapabilityError(
                f"{url(ROOT_INDEX)}: not a shardlake root index ({exc})"
            ) from None


# HTTP roots list through their index (the HTTP backend asks this layer: it sits below it).
list_roots_with(RootIndexListing())
