"""The commit log: ``commits/<seq>.json``, each created with create-if-absent and carrying the
whole root state, so reading the highest commit is enough and two racing writers can never
both take the same sequence number (docs/format.md, docs/storage.md).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from typing import Any, Literal, overload

from ..errors import AlreadyExistsError, ConflictError, FormatError
from ..format.documents import COMMIT_SCHEMA, CommitRecord
from ..format.layout import COMMITS_DIR, commit_key, commit_seq
from ..format.rootindex import RootIndex
from ..read.verified import read_verified
from ..store import Store
from .rootindex import write_index
from .rootmarker import require_root
from .state import RootState, canonical_json, parse_json, utc_now

__all__ = ["RECORD_DIGEST", "commit_state", "read_commit", "read_state", "refresh_index"]


def read_state(store: Store) -> RootState:
    """The state of the root as of its highest commit."""
    seqs = [s for s in (commit_seq(k) for k in store.list(COMMITS_DIR)) if s is not None]
    if not seqs:
        return RootState()
    return read_commit(store, max(seqs))


# A commit record's digest over its own content (docs/format.md, "Integrity"): nothing else
# references the newest record, so it proves itself. Records written before it have none.
RECORD_DIGEST = "record_sha256"


def seal_record(record: Mapping[str, Any]) -> bytes:
    """``record``'s bytes with :data:`RECORD_DIGEST` set: the sha256 of its canonical JSON."""
    body = {k: v for k, v in record.items() if k != RECORD_DIGEST}
    digest = hashlib.sha256(canonical_json(body)).hexdigest()
    return canonical_json({**body, RECORD_DIGEST: digest})


def parse_sealed(data: bytes, where: str) -> dict[str, Any]:
    """A JSON document checked against its :data:`RECORD_DIGEST` (when it has one)."""
    doc = parse_json(data, where)
    digest = doc.get(RECORD_DIGEST)
    if digest is None:
        return doc
    body = {k: v for k, v in doc.items() if k != RECORD_DIGEST}
    if hashlib.sha256(canonical_json(body)).hexdigest() != digest:
        raise FormatError(f"{where}: content does not match its {RECORD_DIGEST}")
    return doc


def read_commit_record(store: Store, seq: int) -> CommitRecord:
    """Commit ``seq``, verified (digest, schema) before use; a mismatch is re-read, then refused."""
    key = commit_key(seq)
    where = store.key_url(key)

    def check(data: bytes) -> CommitRecord:
        return CommitRecord.from_json(parse_sealed(data, where), where, seq)

    return read_verified(store, key, check)[0]


def read_commit(store: Store, seq: int) -> RootState:
    if seq == 0:
        return RootState()
    record = read_commit_record(store, seq)
    return RootState(
        seq=seq,
        versions=dict(record.versions),
        retired=record.retired,
        latest=record.latest,
        gc_lock=record.gc_lock,
    )


def commit_state(
    store: Store, base: RootState, new: RootState, op: str, detail: dict[str, Any]
) -> RootState:
    """Commit ``new`` as the root state after ``base`` (operation ``op``, ``detail`` recorded
    with it): create the next commit record, or :class:`ConflictError` if another writer
    committed after ``base``."""
    record = {
        "format": COMMIT_SCHEMA,
        "seq": base.seq + 1,
        "parent": base.seq,
        "op": op,
        "created_at": utc_now(),
        # Unique per writer: Store.create accepts a same-bytes re-create (a retried request whose
        # reply was lost), so two writers must never produce identical commit records.
        "writer": uuid.uuid4().hex,
        "state": new.to_json(),
        **detail,
    }
    try:
        store.create(commit_key(base.seq + 1), seal_record(record))
    except AlreadyExistsError as exc:
        raise ConflictError(
            f"{store.url}: another writer committed (commit {base.seq + 1}) while this {op} ran; "
            "nothing was published by this run - re-run it"
        ) from exc
    write_index(store, new)
    return new


@overload
def refresh_index(store: Store, *, strict: Literal[True]) -> RootIndex: ...


@overload
def refresh_index(store: Store, *, strict: bool = False) -> RootIndex | None: ...


def refresh_index(store: Store, *, strict: bool = False) -> RootIndex | None:
    """Rewrite the root index from the commit log and the keysets (after a keyset change, and
    ``shardlake index ROOT`` for a root published before the index existed); ``strict``: a
    failure raises instead of being logged."""
    state = read_state(store)
    if strict:  # asked for: a wrong folder gets no index.json written into it
        require_root(store, state)
    index = write_index(store, state, strict=strict)
    if index is None and strict:  # write_index raises when strict; for the type checker
        raise FormatError(f"{store.url}: index not written")
    return index
