"""Reading manifests from a store: digest-checked, re-read on a mismatch (the I/O half of
:mod:`shardlake.format.manifest`, which stays pure)."""

from __future__ import annotations

import hashlib

import pyarrow as pa

from ..errors import FormatError, KeyNotFoundError
from ..format.documents import PartitionEntry
from ..format.manifest import ManifestMeta, parse_manifest
from ..store import Store
from .receipts import superseded_error
from .verified import read_verified

__all__ = [
    "read_entry_manifest",
    "read_manifest",
]


def read_manifest(
    store: Store, key: str, *, sha256: str | None = None
) -> tuple[pa.Table, ManifestMeta]:
    """Read and check the manifest at ``key``; :class:`FormatError` names the key if unreadable.

    With ``sha256`` (the digest the version entry records) the bytes must match it. Bytes that
    do not check out are re-read (bounded), then refused - a manifest that differs is never
    used (see :func:`shardlake.read.verified.read_verified`).
    """
    where = store.key_url(key)

    def check(data: bytes) -> tuple[pa.Table, ManifestMeta]:
        if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
            raise FormatError(
                f"{where}: manifest does not match the version entry (its sha256 is not the "
                f"recorded {sha256[:12]}...); refusing a corrupt manifest"
            )
        return parse_manifest(data, where)

    try:
        return read_verified(store, key, check)[0]
    except KeyNotFoundError as exc:
        redacted = superseded_error(store, key)  # a forget deleted it: say which
        if redacted is not None:
            raise redacted from exc
        raise FormatError(f"{where}: manifest is missing") from exc


def read_entry_manifest(store: Store, entry: PartitionEntry) -> tuple[pa.Table, ManifestMeta]:
    """The manifest a version's partition entry names, checked against its recorded digest
    (entries written before digests were recorded have none)."""
    return read_manifest(store, entry.manifest, sha256=entry.manifest_sha256)
