"""Version documents and the commit log that publishes them.

A version document (``versions/<tag>/<hash>.json``) names every partition revision of one
dataset version; its hash is the SHA-256 of its bytes. A version is *published* when a commit
record naming it is created at ``commits/<seq>.json`` with create-if-absent. Each commit record
carries the whole root state (live tags, pruned tags, latest), so reading the highest commit is
enough, and two racing writers can never both take the same sequence number. See
``docs/format.md`` for the schema and ``docs/storage.md`` for why this is safe on every backend.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from functools import cached_property
from typing import Any, Literal, overload

import pyarrow as pa

from ..errors import (
    AlreadyExistsError,
    ConflictError,
    FormatError,
    KeyNotFoundError,
    NotFoundError,
    VersionNotFoundError,
    VersionRedactedError,
)
from ..format.catalog import CatalogRef, ObjectRef
from ..format.documents import (
    COMMIT_SCHEMA,
    VERSION_SCHEMA,
    CommitRecord,
    GcLock,
    PartitionEntry,
    VersionHeader,
    VersionRecord,
)
from ..format.layout import (
    COMMITS_DIR,
    DATA_DIR,
    RECORD_FORMAT_VERSION,
    ROOT_MARKER,
    check_name,
    commit_key,
    commit_seq,
    is_owned_key,
    version_key,
)
from ..format.manifest import entry_mismatches, parse_manifest
from ..format.rootindex import RootIndex
from ..read.payloads import TRANSPORT
from ..read.receipts import find_redaction
from ..read.verified import RefusedObjectError, read_verified
from ..store import Store
from .catalog import Catalog, load_catalog, publish_catalog, read_partitions
from .rootindex import write_index

__all__ = [
    "RECORD_DIGEST",
    "RootState",
    "StoredVersion",
    "Version",
    "build_version_doc",
    "canonical_json",
    "check_foreign",
    "check_new_tag",
    "commit_state",
    "describe_lock",
    "ensure_root",
    "hash_bytes",
    "live_versions",
    "load_version",
    "load_version_by_hash",
    "load_version_bytes",
    "lock_holder_gone",
    "parse_root_marker",
    "prune_versions",
    "publish_version",
    "read_commit",
    "read_root_marker",
    "read_state",
    "refresh_index",
    "require_root",
    "resolve_tag",
    "takeover_note",
    "utc_now",
    "version_of",
    "versions_for",
]

ROOT_SCHEMA = "shardlake.root/1"


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def canonical_json(doc: Mapping[str, Any]) -> bytes:
    """The one byte form shardlake writes JSON documents in (sorted keys, compact, UTF-8)."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def hash_bytes(data: bytes) -> str:
    """A document's hash: the first 32 hex digits of the SHA-256 of its bytes."""
    return hashlib.sha256(data).hexdigest()[:32]


def parse_json(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"{what}: not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise FormatError(f"{what}: expected a JSON object")
    return doc


@dataclass(frozen=True)
class RootState:
    """The state recorded in the highest commit (seq 0: an empty root)."""

    seq: int = 0
    versions: dict[str, str] = field(default_factory=dict)  # live tag -> hash, publish order
    retired: tuple[str, ...] = ()  # pruned tags, never reusable (the record's key "retired")
    latest: str | None = None  # tag
    # Set while gc deletes objects: publishing is refused meanwhile, so no version can
    # reference a revision gc is deleting (see shardlake.lifecycle.gc).
    gc_lock: GcLock | None = None

    def to_json(self) -> dict[str, Any]:
        # Versions as [tag, hash] pairs in publish order (canonical JSON would sort an object).
        out: dict[str, Any] = {
            "versions": [[t, h] for t, h in self.versions.items()],
            "retired": list(self.retired),
            "latest": self.latest,
        }
        if self.gc_lock is not None:
            out["gc_lock"] = self.gc_lock.to_json()
        return out

    def gc_locked(self, now: float | None = None) -> bool:
        """Whether a gc holds the root. An expired lease does not count, nor does one whose
        holder ran on this host and whose process is gone (taken over at once, with a note)."""
        if self.gc_lock is None:
            return False
        if self.gc_lock.expires_at <= (time.time() if now is None else now):
            return False
        if lock_holder_gone(self.gc_lock):
            if self.gc_lock.id not in _NOTED:
                _NOTED.add(self.gc_lock.id)
                log.warning("note: %s", takeover_note(self.gc_lock))
            return False
        return True


log = logging.getLogger("shardlake.gc")
_NOTED: set[str] = set()  # lock ids whose takeover was noted in this process
_OWNER_RE = re.compile(r"@(?P<host>\S+) pid (?P<pid>\d+)$")


def lock_holder_gone(lock: GcLock) -> bool:
    """Whether ``lock``'s holder (``user@host pid N``) ran on this host and its process is gone
    (or a zombie). A holder on another host is never judged: only its lease can lapse."""
    match = _OWNER_RE.search(lock.owner)
    if match is None or match["host"] != socket.gethostname():
        return False
    pid = int(match["pid"])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # killed, not yet reaped
    except (OSError, IndexError):
        return False


def takeover_note(lock: GcLock) -> str:
    return (
        f"taking over the gc lock of {lock.owner}: that process is gone from this host "
        "(killed?), so its lease no longer protects anything"
    )


@dataclass(frozen=True)
class StoredVersion:
    """A published version: its tag, hash and record header; the partition list is read from
    the catalog's partitions table on first use (format 2) or is inline (format 1)."""

    tag: str
    hash: str
    header_doc: dict[str, Any]  # the record as stored (format 2: no partition list)
    header: VersionHeader  # the record, validated
    store: Store | None = field(default=None, compare=False, repr=False)

    @classmethod
    def parse(
        cls, tag: str, version_hash: str, data: bytes, where: str, store: Store | None = None
    ) -> StoredVersion:
        """A version from its record bytes, checked against its hash, tag and schema."""
        if hash_bytes(data) != version_hash:
            raise FormatError(f"{where}: version document does not match its hash")
        doc = parse_json(data, where)
        header = VersionHeader.from_json(doc, where)
        if header.tag != tag:
            raise FormatError(f"{where}: document is for tag {header.tag!r}, not {tag!r}")
        if header.catalog is not None and store is None:
            raise FormatError(f"{where}: a format-2 version needs its store to read its catalog")
        return cls(tag, version_hash, doc, header, store)

    @cached_property
    def _stored_partitions(self) -> list[dict[str, Any]]:
        """The partition list as stored (format 2: the catalog's partitions table); read
        through :attr:`entries`."""
        ref = self.header.catalog
        if ref is None:
            return list(self.header_doc["partitions"])
        if self.store is None:  # parse refuses this; a hand-built StoredVersion may not
            raise FormatError(f"version {self.tag!r}: no store to read its catalog from")
        return read_partitions(self.store, ref.partitions, f"version {self.tag!r}")

    @cached_property
    def doc(self) -> dict[str, Any]:
        """The record with its partition list (the format-1 shape, for every format)."""
        return {**self.header_doc, "partitions": self._stored_partitions}

    @cached_property
    def record(self) -> VersionRecord:
        return VersionRecord.from_json(self.doc, f"version {self.tag!r} ({self.hash})")

    @property
    def entries(self) -> tuple[PartitionEntry, ...]:
        """The partition entries, typed and validated (parsed once, with :attr:`record`)."""
        return self.record.partitions

    @property
    def samples(self) -> int:
        return self.header.samples

    @property
    def partition_count(self) -> int:
        return self.header.partition_count

    def catalog_objects(self) -> list[ObjectRef]:
        """The catalog objects the record references (none for format 1)."""
        ref = self.header.catalog
        return [] if ref is None else [ref.partitions, *ref.segments]


def describe_lock(lock: GcLock | None) -> str:
    """``gc holds the root until <UTC time> (owner ...)``, for messages."""
    return "no gc holds the root" if lock is None else lock.describe()


def read_root_marker(store: Store) -> dict[str, Any] | None:
    try:
        data = store.read(ROOT_MARKER)
    except KeyNotFoundError:
        return None
    return parse_root_marker(data, store.key_url(ROOT_MARKER))


def parse_root_marker(data: bytes, where: str) -> dict[str, Any]:
    """The root marker document from its bytes; refused unless it is a shardlake root marker."""
    doc = parse_json(data, where)
    if doc.get("format") != ROOT_SCHEMA:
        raise FormatError(f"{where}: not a shardlake root (format {doc.get('format')!r})")
    return doc


FOREIGN_SHOWN = 5


def check_foreign(store: Store, *, allow_foreign: bool = False) -> None:
    """Refuse a location that holds objects but no shardlake root (``allow_foreign`` proceeds).

    The first publish into a folder or bucket of other people's files is almost always a wrong
    URL; gc would leave those files alone, but they would share a prefix with the dataset.
    """
    if allow_foreign or read_root_marker(store) is not None:
        return
    foreign = [key for key in store.list("") if not is_owned_key(key)]
    if foreign:
        shown = ", ".join(foreign[:FOREIGN_SHOWN]) + (
            ", ..." if len(foreign) > FOREIGN_SHOWN else ""
        )
        raise ConflictError(
            f"{store.url} is not empty and not a shardlake root: it holds {len(foreign)} "
            f"object(s) shardlake did not write ({shown}); publish into an empty location, or "
            "allow the foreign objects (gc leaves them alone)",
            options=("allow_foreign",),
        )


def ensure_root(
    store: Store, dataset_id: str | None = None, *, allow_foreign: bool = False
) -> dict[str, Any]:
    """Create the root marker if absent (create-if-absent); return the marker in force.

    ``dataset_id`` (export) asks for a specific id; an existing root with another id is refused.
    A location holding foreign objects is refused unless ``allow_foreign`` (:func:`check_foreign`).
    """
    marker = read_root_marker(store)
    if marker is None:
        check_foreign(store, allow_foreign=allow_foreign)
    store.ensure_create_enforced()
    if marker is None:
        candidate = {
            "format": ROOT_SCHEMA,
            "format_version": RECORD_FORMAT_VERSION,
            "dataset_id": dataset_id or uuid.uuid4().hex,
            "created_at": utc_now(),
        }
        try:
            store.create(ROOT_MARKER, canonical_json(candidate))
            marker = candidate
        except AlreadyExistsError:
            marker = read_root_marker(store)
    if marker is None:
        raise FormatError(f"{store.key_url(ROOT_MARKER)}: root marker vanished")
    if dataset_id is not None and marker["dataset_id"] != dataset_id:
        raise ConflictError(
            f"{store.url} already holds a different dataset (id {marker['dataset_id']}, expected {dataset_id})"
        )
    return marker


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
        raise ConflictError(
            f"{store.url}: {len(missing)} object(s) this version references are gone (e.g. "
            f"{missing[0]}; deleted by gc?); nothing was published by this run - re-run it"
        )
    parts, fresh = _with_manifest_digests(store, entries, base_parts)
    ids = [p.id for p in parts]
    if len(set(ids)) != len(ids):
        raise FormatError(f"{store.url}: version {tag!r} lists a partition twice")
    catalog, parts = publish_catalog(store, parts, base_catalog, fresh)
    data = build_version_doc(tag, body, parts, catalog)
    version_hash = hash_bytes(data)
    key = version_key(tag, version_hash)
    try:
        store.create(key, data)
    except AlreadyExistsError:
        if store.read(key) != data:
            raise FormatError(
                f"{store.key_url(key)}: holds different bytes than its hash"
            ) from None
    versions = dict(base.versions)
    versions[tag] = version_hash
    new = RootState(base.seq + 1, versions, base.retired, tag)
    commit_state(store, base, new, "publish", {"tag": tag, "version": version_hash})
    return StoredVersion.parse(tag, version_hash, data, store.key_url(key), store)


def prune_versions(store: Store, tags: list[str], *, force: bool = False) -> RootState:
    """Prune ``tags`` (prune-version). Pruning the tag ``latest`` names needs ``force``;
    ``latest`` then moves to the newest remaining version (or none)."""
    base = read_state(store)
    for tag in tags:
        if tag not in base.versions:
            raise VersionNotFoundError(f"{store.url}: no live version {tag!r}")
    if base.latest in tags and not force:
        # A refusal of valid input (exit 1), not a usage error: the root's state decides it.
        raise ConflictError(
            f"{store.url}: version {base.latest!r} is what 'latest' points to; pruning it "
            "needs force",
            options=("force",),
        )
    versions = {t: h for t, h in base.versions.items() if t not in tags}
    latest = base.latest
    if latest in tags:
        latest = next(reversed(versions), None)
    new = RootState(base.seq + 1, versions, tuple(base.retired) + tuple(tags), latest, base.gc_lock)
    # "retire": the op name a prune has had on disk since format 1
    return commit_state(store, base, new, "retire", {"tags": list(tags)})


TAGS_SHOWN = 10


def require_root(store: Store, state: RootState) -> None:
    """Refuse to read a location that has no commits and no root marker: a wrong URL or folder
    (:class:`NotFoundError`: no root, so no version either)."""
    if state.seq == 0 and not state.versions and read_root_marker(store) is None:
        raise NotFoundError(f"no shardlake root at {store.url}")


def _known_tags(state: RootState) -> str:
    """The newest live tags (up to :data:`TAGS_SHOWN`); ``Root.versions()`` lists them all."""
    tags = list(state.versions)
    if not tags:
        return "the root has no published version"
    shown = ", ".join(reversed(tags[-TAGS_SHOWN:])) + (", ..." if len(tags) > TAGS_SHOWN else "")
    return f"tags there are: {shown}"


def resolve_tag(
    store: Store, tag: str = "latest", state: RootState | None = None
) -> tuple[str, str]:
    """``(tag, version_hash)`` for ``tag`` (``latest`` follows the commit log)."""
    state = state or read_state(store)
    if tag == "latest":
        if state.latest is None:
            require_root(store, state)
            raise VersionNotFoundError(f"{store.url}: no published version yet")
        tag = state.latest
    if tag not in state.versions:
        if not state.versions:
            require_root(store, state)
        pruned = " (it was pruned)" if tag in state.retired else ""
        raise VersionNotFoundError(
            f"{store.url}: unknown version {tag!r}{pruned}; {_known_tags(state)}",
            hint="all of them: shardlake versions ROOT",
        )
    return tag, state.versions[tag]


def load_version(
    store: Store, tag: str = "latest", state: RootState | None = None
) -> StoredVersion:
    """Read and check the version document for ``tag``."""
    tag, version_hash = resolve_tag(store, tag, state)
    return load_version_by_hash(store, tag, version_hash)


def load_version_by_hash(store: Store, tag: str, version_hash: str) -> StoredVersion:
    """The version document ``tag``/``version_hash``, checked against its hash before use
    (a mismatch is re-read, then refused naming the document)."""
    return load_version_bytes(store, tag, version_hash)[0]


def load_version_bytes(store: Store, tag: str, version_hash: str) -> tuple[StoredVersion, bytes]:
    """:func:`load_version_by_hash` and the verified bytes (export copies exactly these)."""
    key = version_key(tag, version_hash)
    where = store.key_url(key)
    try:
        return read_verified(
            store, key, lambda data: StoredVersion.parse(tag, version_hash, data, where, store)
        )
    except KeyNotFoundError as exc:
        redaction = find_redaction(store, version_hash)
        if redaction is not None:
            raise VersionRedactedError(
                f"{store.url}: {redaction.describe()}",
                forget_id=redaction.forget_id,
                successor=f"{redaction.tag}@{redaction.new}",
            ) from exc
        raise FormatError(f"{where}: version document missing") from exc


@dataclass(frozen=True)
class Version:
    """A published version of a root, as :meth:`Root.versions` and :meth:`Root.version`
    return it (the on-disk records behind it are the format layer's).

    Attributes
    ----------
    tag
        The version's tag (never reused in a root).
    hash
        The hash of its version document.
    created
        When it was published (UTC), None if the document does not say.
    samples
        Samples in the version.
    partitions
        Partitions in the version.
    is_latest
        Whether ``latest`` names it.
    base
        The tag of the version it was made from, if any.
    """

    tag: str
    hash: str
    created: datetime | None
    samples: int
    partitions: int
    is_latest: bool
    base: str | None = None

    @classmethod
    def of(cls, version: StoredVersion, is_latest: bool) -> Version:
        header = version.header  # the small record header: no partition list is read
        return cls(
            tag=version.tag,
            hash=version.hash,
            created=_parse_time(header.created_at),
            samples=header.samples,
            partitions=header.partition_count,
            is_latest=is_latest,
            base=header.base,
        )

    def to_json(self) -> dict[str, Any]:
        created = None if self.created is None else self.created.isoformat()
        return {
            "tag": self.tag,
            "hash": self.hash,
            "latest": self.is_latest,
            "created_at": None if created is None else created.replace("+00:00", "Z"),
            "base": self.base,
            "partitions": self.partitions,
            "samples": self.samples,
        }


def _parse_time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


_DOCUMENT_READERS = 16


def live_versions(store: Store) -> list[Version]:
    """Every live version, in publish order (their documents read concurrently); a location
    with no root (no marker, no commits) is refused: ``no shardlake root at``."""
    from concurrent.futures import ThreadPoolExecutor

    state = read_state(store)
    require_root(store, state)

    def info(item: tuple[str, str]) -> Version:
        tag, version_hash = item
        return Version.of(load_version_by_hash(store, tag, version_hash), tag == state.latest)

    with ThreadPoolExecutor(max_workers=_DOCUMENT_READERS) as pool:
        return list(pool.map(info, state.versions.items()))


def version_of(store: Store, tag: str) -> Version:
    """One live version by tag (``latest`` follows the commit log)."""
    state = read_state(store)
    version = load_version(store, tag, state)
    return Version.of(version, version.tag == state.latest)


def versions_for(store: Store, version: str | None, all_versions: bool) -> list[StoredVersion]:
    """The versions an operation works on: every live version, else one tag (``latest``)."""
    if all_versions:
        state = read_state(store)
        require_root(store, state)
        return [load_version_by_hash(store, tag, h) for tag, h in state.versions.items()]
    return [load_version(store, version or "latest")]
