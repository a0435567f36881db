"""Forget receipts (``receipts/<forget_id>.json``, docs/format.md "Forget receipts"): reading
them, and finding the forget that redacted a version hash.

A receipt is written before its forget's commit and names that commit's sequence number; it
counts only once ``commits/<seq>.json`` records the same forget id (a receipt of a forget that
was killed before its commit, or lost the race, is ignored here and by ``forget --check``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import FormatError, KeyNotFoundError, StoreError, VersionRedactedError
from ..format.layout import RECEIPTS_DIR, commit_key, receipt_key
from ..store import Store

__all__ = [
    "RECEIPT_SCHEMA",
    "Redaction",
    "committed_receipts",
    "find_redaction",
    "list_receipt_ids",
    "read_receipt",
    "receipt_committed",
    "superseded_error",
]

RECEIPT_SCHEMA = "shardlake.forget-receipt/1"


@dataclass(frozen=True)
class Redaction:
    """Version ``tag@old`` was redacted by forget ``forget_id``; ``new`` is its newest
    successor (a later forget may have redacted the first successor too)."""

    forget_id: str
    at: str
    reason: str
    tag: str
    old: str
    new: str

    def describe(self) -> str:
        return (
            f"version {self.tag!r} ({self.old}) was redacted by forget {self.forget_id} at "
            f"{self.at} (reason: {self.reason}); its successor is {self.tag}@{self.new}"
        )


def list_receipt_ids(store: Store) -> list[str]:
    prefix, suffix = RECEIPTS_DIR + "/", ".json"
    return sorted(
        k[len(prefix) : -len(suffix)]
        for k in store.list(RECEIPTS_DIR)
        if k.startswith(prefix) and k.endswith(suffix)
    )


def read_receipt(store: Store, forget_id: str) -> dict[str, Any]:
    key = receipt_key(forget_id)
    where = store.key_url(key)
    try:
        doc = json.loads(store.read(key))
    except ValueError as exc:
        raise FormatError(f"{where}: not valid JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != RECEIPT_SCHEMA:
        raise FormatError(f"{where}: not a shardlake forget receipt")
    if doc.get("forget_id") != forget_id:
        raise FormatError(f"{where}: receipt names forget {doc.get('forget_id')!r}")
    return doc


def receipt_committed(store: Store, receipt: dict[str, Any]) -> bool:
    """Whether the commit the receipt names records its forget."""
    try:
        data = store.read(commit_key(int(receipt["commit"])))
    except (KeyNotFoundError, KeyError, ValueError, TypeError):
        return False
    try:
        doc = json.loads(data)
    except ValueError:
        return False
    return (
        isinstance(doc, dict)
        and doc.get("op") == "forget"
        and doc.get("forget") == receipt["forget_id"]
    )


def committed_receipts(store: Store) -> list[dict[str, Any]]:
    """Every receipt whose forget committed, oldest commit first."""
    out = []
    for forget_id in list_receipt_ids(store):
        try:
            doc = read_receipt(store, forget_id)
        except KeyNotFoundError:
            continue
        if receipt_committed(store, doc):
            out.append(doc)
    return sorted(out, key=lambda d: int(d["commit"]))


def find_redaction(store: Store, version_hash: str) -> Redaction | None:
    """The forget that redacted ``version_hash`` (its newest successor), or None."""
    receipts = committed_receipts(store)
    step: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for doc in receipts:
        for item in doc.get("versions", ()):
            step[str(item["old"])] = (doc, item)
    if version_hash not in step:
        return None
    first_doc, first = step[version_hash]
    new, seen = str(first["new"]), {version_hash}
    while new in step and new not in seen:  # redacted again by a later forget
        seen.add(new)
        new = str(step[new][1]["new"])
    return Redaction(
        forget_id=str(first_doc["forget_id"]),
        at=str(first_doc.get("created_at", "")),
        reason=str(first_doc.get("reason", "")),
        tag=str(first["tag"]),
        old=version_hash,
        new=new,
    )


def superseded_error(store: Store, key: str) -> VersionRedactedError | None:
    """For an object that is missing: the error naming the forget that deleted it and the
    successor version(s), or None when no committed forget superseded it. Looked up only after
    a read found nothing (the receipts are listed then, never on the happy path)."""
    try:
        receipts = committed_receipts(store)
    except (StoreError, FormatError):
        return None  # cannot list (an HTTP root) or a damaged receipt: the plain miss stands
    for doc in reversed(receipts):
        if key in doc.get("superseded", ()):
            successors = ", ".join(f"{v['tag']}@{v['new']}" for v in doc.get("versions", ()))
            first = doc.get("versions", [{}])[0]
            return VersionRedactedError(
                f"{store.key_url(key)} was deleted by forget {doc['forget_id']} at "
                f"{doc.get('created_at', '')} (reason: {doc.get('reason', '')}): the version "
                f"reading it was redacted; open its successor instead ({successors})",
                forget_id=str(doc["forget_id"]),
                successor=f"{first.get('tag', '')}@{first.get('new', '')}",
            )
    return None
