"""Publishing a version: its document (create-if-absent), its catalog, then the next commit.

A version is *published* when a commit record naming it is created; a commit that lost a race
leaves the new document unreferenced (garbage for gc).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa

from ..errors import AlreadyExistsError, ConflictError, FormatError, ObjectsGoneError
from ..format.catalog import CatalogRef
from ..format.documents import VERSION_SCHEMA, PartitionEntry
from ..format.layout import DATA_DIR, RECORD_FORMAT_VERSION, check_name, version_key
from ..format.manifest import entry_mismatches, parse_manifest
from ..progress.bar import plural
from ..read.payloads import TRANSPORT
from ..read.verified import RefusedObjectError
from ..store import Store
from .catalog import Catalog, load_catalog, publish_catalog
from .commits import commit_state, read_state
from .rootmarker import ensure_root
from .state import RootState, canonical_json, hash_bytes, utc_now
from .versions import StoredVersion, load_version_by_hash

__all__ = ["build_version_doc", "check_new_tag", "publish_version", "store_version_doc"]


# Fields of a body that publish computes itself (a body copied from an older record may hold them).
_COMPUTED_FIELDS = ("partitions", "partition_count", "catalog", "samples", "format")


def build_version_doc(
    tag: str, body: Mapping[str, Any], partitions: Sequence[PartitionEntry], catalog: CatalogRef
) -> bytes:
    """Serialise a format-2 version record (``body``'s fields, the partition count and sample
    total of ``partitions``, and the ``catalog`` reference) to its canonical bytes."""
    doc = {k: v for k, v in body.items() if k not in _COMPUTED_FIELDS}
    doc.update({"format": VERSION_SCHEMA, "format_version": RECORD_FORMAT_VERSION, "tag": tag})
    doc["partition_count"] = len(partitions)
    doc["samples"] = sum(p.samples for p in partitions)
    doc["catalog"] = catalog.to_json()
    doc.setdefault("created_at", utc_now())
    return canonical_json(doc)


def store_version_doc(store: Store, tag: str, data: bytes) -> tuple[str, str]:
    """Store a version record under its content hash (create-if-absent; the same bytes already
    there are fine, other bytes under that hash are damage); ``(hash, key)``."""
    version_hash = hash_bytes(data)
    key = version_key(tag, version_hash)
    try:
        store.create(key, data)
    except AlreadyExistsError:
        if store.read(key) != data:
            raise FormatError(
                f"{store.key_url(key)}: holds different bytes than its hash"
            ) from None
    return version_hash, key


def check_new_tag(state: RootState, tag: str, store: Store) -> None:
    check_name("tag", tag)
    if tag in state.versions or tag in state.retired:
        raise ConflictError(
            f"{store.url}: version tag {tag!r} already exists; tags are never reused"
        )


# Above this many new revision directories one listing of data/ is cheaper than one per directory.
_LIST_DIRS_MAX = 64


def _referenced(partitions: Iterable[PartitionEntry]) -> set[str]:
    keys: set[str] = set()
    for entry in partitions:
        if entry.manifest:
            keys.add(entry.manifest)
        keys.update(shard.key for shard in entry.shards)
    return keys


def _base_catalog(store: Store, body: Mapping[str, Any], state: RootState) -> Catalog | None:
    """The catalog of the live base version ``body`` names (none without one).

    Reading it costs the base record and its partitions table (segments are read only if a
    merge needs them); a format-1 base without an attached catalog has none to reuse.
    """
    base_tag = body.get("base")
    if base_tag is None or base_tag not in state.versions:
        return None
    base = load_version_by_hash(store, base_tag, state.versions[base_tag])
    return load_catalog(store, base, build=False)


def _missing_objects(
    store: Store, entries: Sequence[PartitionEntry], base_parts: Sequence[PartitionEntry]
) -> list[str]:
    """Manifests and shards ``entries`` reference that are not in the store.

    Only objects new relative to the base version are checked (the base's are protected by gc's
    lock and the live-base check), one listing per new revision directory: the cost grows with
    what changed, not with the root.
    """
    wanted = _referenced(entries) - _referenced(base_parts)
    if not wanted:
        return []
    dirs = sorted({key.rsplit("/", 1)[0] for key in wanted})
    if len(dirs) > _LIST_DIRS_MAX:
        return sorted(wanted - set(store.list(DATA_DIR)))
    present: set[str] = set()
    for directory in dirs:
        present.update(store.list(directory + "/"))
    return sorted(wanted - present)


def _with_manifest_digests(
    store: Store, partitions: Sequence[PartitionEntry], base_parts: Sequence[PartitionEntry]
) -> tuple[list[PartitionEntry], dict[str, pa.Table]]:
    """``partitions`` with each entry's ``manifest_sha256``/``manifest_size`` set.

    A manifest the base already records keeps its digest; any other is read, checked against
    its entry, and hashed, so every later read can verify it. The bytes hashed must be the
    stored ones: a read whose digest is the entry's own (the build's, of the bytes it wrote) is
    proof; otherwise two reads must agree (a copied entry's stale digest is never trusted).
    Cost: one read per new manifest the build wrote, two for any other.
    """
    known = {
        e.manifest: (e.manifest_sha256, e.manifest_size) for e in base_parts if e.manifest_sha256
    }
    out = []
    fresh: dict[str, pa.Table] = {}
    for entry in partitions:
        entry = replace(entry, segment=None)  # publish decides where this version's rows live
        key = entry.manifest
        if key:
            if key in known:
                digest, size = known[key]
            else:
                data = store.read(key)
                # A digest matching what was read proves those bytes (the build records the
                # digest of what it wrote); any other read must be confirmed by a second one.
                if entry.manifest_sha256 != hashlib.sha256(data).hexdigest():
                    data = _agreed_read(store, key)
                table, meta = parse_manifest(data, store.key_url(key))
                problems = entry_mismatches(entry, table, meta)
                if problems:
                    raise FormatError(f"{store.key_url(key)}: " + "; ".join(problems))
                digest, size = hashlib.sha256(data).hexdigest(), len(data)
                fresh[entry.id] = table
            entry = replace(entry, manifest_sha256=digest, manifest_size=size)
        out.append(entry)
    return out, fresh


def _agreed_read(store: Store, key: str) -> bytes:
    """The bytes of ``key`` that two reads in a row agree on.

    The digest recorded from them is what every later read is checked against, so it must not
    be taken from one read that a flipped byte in transit could have damaged (a damaged
    manifest can still parse): the version would then refuse its own manifest.
    """
    last = store.read(key)
    for _ in range(1 + max(1, store.retry.integrity_rereads)):
        again = store.read(key)
        if again == last:
            return last
        last = again
    raise RefusedObjectError(
        f"{store.key_url(key)}: new manifest read back differently every time; nothing was "
        f"published",
        TRANSPORT,
    )


def publish_version(
    store: Store, tag: str, body: Mapping[str, Any], base: RootState
) -> StoredVersion:
    """Publish a version made from ``base`` (the state read before the work began).

    Order: version document (create-if-absent), then the commit record (create-if-absent). If any
    other commit landed since ``base`` the publish is refused with :class:`ConflictError` and the
    new document stays unreferenced (garbage for ``gc``).
    """
    ensure_root(store)
    check_new_tag(base, tag, store)
    current = read_state(store)
    if current.seq != base.seq:
        raise ConflictError(
            f"{store.url}: another writer committed (now at commit {current.seq}, this run started "
            f"at {base.seq}); nothing was published by this run - re-run it"
        )
    if current.gc_locked():
        raise ConflictError(
            f"{store.url}: gc is deleting unreferenced objects (commit {current.seq}); nothing "
            "was published by this run - re-run it when gc has finished"
        )
    base_catalog = _base_catalog(store, body, current)
    base_parts = base_catalog.entries if base_catalog is not None else []
    where = f"{store.url}: version {tag!r}"
    entries = [PartitionEntry.from_json(p, where) for p in body.get("partitions", [])]
    missing = _missing_objects(store, entries, base_parts)
    if missing:
        # A writer that reused an unreferenced revision while gc deleted it: refuse rather than
        # publish a version with holes (gc deletes only while it holds the lock checked above).
        raise ObjectsGoneError(
            f"{store.url}: {plural(len(missing), 'object')} this version references are gone (e.g. "
            f"{missing[0]}; deleted by gc?); nothing was published by this run - re-run it",
            missing=missing,
        )
    parts, fresh = _with_manifest_digests(store, entries, base_parts)
    ids = [p.id for p in parts]
    if len(set(ids)) != len(ids):
        raise FormatError(f"{store.url}: version {tag!r} lists a partition twice")
    catalog, parts = publish_catalog(store, parts, base_catalog, fresh)
    data = build_version_doc(tag, body, parts, catalog)
    version_hash, key = store_version_doc(store, tag, data)
    versions = dict(base.versions)
    versions[tag] = version_hash
    new = RootState(base.seq + 1, versions, base.retired, tag)
    commit_state(store, base, new, "publish", {"tag": tag, "version": version_hash})
    return StoredVersion.parse(tag, version_hash, data, store.key_url(key), store)
