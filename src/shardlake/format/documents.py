"""Typed on-disk documents: version record, partition and shard entries, commit record, gc lock,
writer lease.

Each document is parsed and validated once here (``from_json``) into a frozen dataclass, and
written back with ``to_json``; a malformed document is refused with one :class:`FormatError`
line naming the object (``where``) and the offending field. Pure: no I/O. See docs/format.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..errors import FormatError
from ..progress.bar import plural
from .catalog import CatalogRef

__all__ = [
    "COMMIT_SCHEMA",
    "VERSION_SCHEMA",
    "CommitRecord",
    "LEASE_SCHEMA",
    "GcLock",
    "LeaseRecord",
    "PartitionEntry",
    "ShardEntry",
    "VersionHeader",
    "VersionRecord",
]

VERSION_SCHEMA_1 = "shardlake.version/1"  # partitions listed inline (format 1)
VERSION_SCHEMA = "shardlake.version/2"  # partitions in the catalog the record references
VERSION_SCHEMAS = (VERSION_SCHEMA_1, VERSION_SCHEMA)
COMMIT_SCHEMA = "shardlake.commit/1"
LEASE_SCHEMA = "shardlake.lease/1"


def _obj(value: Any, where: str, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise FormatError(f"{where}: {what} must be a JSON object")
    return value


def _field(doc: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``doc[name]``, refused unless present and of ``kind`` (bool is not an int here)."""
    if name not in doc:
        raise FormatError(f"{where}: missing field {name!r}")
    value = doc[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise FormatError(f"{where}: field {name!r} has the wrong type (bool)")
    if not isinstance(value, kinds):
        raise FormatError(
            f"{where}: field {name!r} has the wrong type ({type(value).__name__}, expected "
            f"{' or '.join(k.__name__ for k in kinds)})"
        )
    return value


def _optional(doc: Mapping[str, Any], name: str, kind: type, where: str) -> Any:
    return None if doc.get(name) is None else _field(doc, name, kind, where)


def _count(doc: Mapping[str, Any], name: str, where: str) -> int:
    value = int(_field(doc, name, int, where))
    if value < 0:
        raise FormatError(f"{where}: field {name!r} is negative ({value})")
    return value


@dataclass(frozen=True)
class ShardEntry:
    """One shard of a partition revision: its key, byte size and member count."""

    key: str
    size: int
    members: int

    @classmethod
    def from_json(cls, doc: Any, where: str) -> ShardEntry:
        doc = _obj(doc, where, "a shard entry")
        return cls(
            key=_field(doc, "key", str, where),
            size=_count(doc, "size", where),
            members=_count(doc, "members", where),
        )

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "size": self.size, "members": self.members}


@dataclass(frozen=True)
class PartitionEntry:
    """One partition of a version: the revision it uses and what that revision holds."""

    id: str
    path: str
    data_rev: str
    meta_rev: str
    manifest_rev: str
    manifest: str
    samples: int
    skipped: int
    payload_bytes: int
    shards: tuple[ShardEntry, ...]
    source_fingerprint: str | None = None
    npz_fingerprint: str | None = None
    # sha256 and byte size of the manifest, recorded at publish; absent in older versions.
    manifest_sha256: str | None = None
    manifest_size: int | None = None
    # Format 2: the catalog segment holding the partition's rows (None: it has no rows there).
    segment: str | None = None

    @classmethod
    def from_json(cls, doc: Any, where: str) -> PartitionEntry:
        fast = _fast_entry(cls, doc) if type(doc) is dict else None
        if fast is not None:
            return fast
        doc = _obj(doc, where, "a partition entry")
        pid = _field(doc, "id", str, where)
        here = f"{where} partition {pid}"
        shards = _field(doc, "shards", list, here)
        entry = cls(
            id=pid,
            path=_field(doc, "path", str, here),
            data_rev=_field(doc, "data_rev", str, here),
            meta_rev=_field(doc, "meta_rev", str, here),
            manifest_rev=_field(doc, "manifest_rev", str, here),
            manifest=_field(doc, "manifest", str, here),
            samples=_count(doc, "samples", here),
            skipped=int(doc.get("skipped", 0)),
            payload_bytes=int(doc.get("payload_bytes", 0)),
            shards=tuple(
                ShardEntry.from_json(s, f"{here} shard {i}") for i, s in enumerate(shards)
            ),
            source_fingerprint=doc.get("source_fingerprint"),
            npz_fingerprint=doc.get("npz_fingerprint"),
            manifest_sha256=_optional(doc, "manifest_sha256", str, here),
            manifest_size=_optional(doc, "manifest_size", int, here),
            segment=_optional(doc, "segment", str, here),
        )
        # ``remove`` drops keys without rewriting shards, so a shard may hold unlisted members.
        members = sum(s.members for s in entry.shards)
        if members < entry.samples:
            raise FormatError(
                f"{here}: shards hold {plural(members, 'member')}, fewer than the {plural(entry.samples, 'sample')} "
                "the entry lists"
            )
        return entry

    def to_json(self) -> dict[str, Any]:
        optional = {
            "manifest_sha256": self.manifest_sha256,
            "manifest_size": self.manifest_size,
            "segment": self.segment,
        }
        return {
            **{k: v for k, v in optional.items() if v is not None},
            "id": self.id,
            "path": self.path,
            "data_rev": self.data_rev,
            "meta_rev": self.meta_rev,
            "manifest_rev": self.manifest_rev,
            "manifest": self.manifest,
            "samples": self.samples,
            "skipped": self.skipped,
            "payload_bytes": self.payload_bytes,
            "shards": [s.to_json() for s in self.shards],
            "source_fingerprint": self.source_fingerprint,
            "npz_fingerprint": self.npz_fingerprint,
        }


_ENTRY_STRINGS = ("id", "path", "data_rev", "meta_rev", "manifest_rev", "manifest")
_ENTRY_OPTIONAL_STRINGS = ("source_fingerprint", "npz_fingerprint", "manifest_sha256", "segment")
_ENTRY_FIELDS = frozenset(
    [*_ENTRY_STRINGS, *_ENTRY_OPTIONAL_STRINGS, "samples", "skipped", "payload_bytes"]
    + ["shards", "manifest_size"]
)


def _fast_entry(cls: type[PartitionEntry], doc: dict[str, Any]) -> PartitionEntry | None:
    """``cls.from_json(doc)`` for a well-formed entry (what a partitions table decodes to, 10,000
    at a loader's start-up), without the per-field checks' messages; ``None`` for anything the
    checks would look at more closely (a missing or mistyped field, an extra one, a negative
    count, too few members), which then goes through them and gets their error."""
    get = doc.get
    if not _ENTRY_FIELDS.issuperset(doc):
        return None
    for name in _ENTRY_STRINGS:
        if type(get(name)) is not str:
            return None
    for name in _ENTRY_OPTIONAL_STRINGS:
        value = get(name)
        if value is not None and type(value) is not str:
            return None
    samples, skipped, payload = get("samples"), get("skipped", 0), get("payload_bytes", 0)
    size = get("manifest_size")
    if type(samples) is not int or samples < 0 or type(skipped) is not int:
        return None
    if type(payload) is not int or (size is not None and type(size) is not int):
        return None
    raw_shards = get("shards")
    if type(raw_shards) is not list:
        return None
    shards = []
    members = 0
    for s in raw_shards:
        if type(s) is not dict or len(s) != 3:
            return None
        key, ssize, count = s.get("key"), s.get("size"), s.get("members")
        if type(key) is not str or type(ssize) is not int or type(count) is not int:
            return None
        if ssize < 0 or count < 0:
            return None
        shards.append(ShardEntry(key, ssize, count))
        members += count
    if members < samples:
        return None
    # The string fields go in by the name lists they were checked by (an absent optional: None).
    strings: dict[str, Any] = {name: get(name) for name in _ENTRY_STRINGS + _ENTRY_OPTIONAL_STRINGS}
    return cls(
        **strings,
        samples=samples,
        skipped=skipped,
        payload_bytes=payload,
        shards=tuple(shards),
        manifest_size=size,
    )


@dataclass(frozen=True)
class VersionRecord:
    """A version document (``versions/<tag>/<hash>.json``), validated."""

    tag: str
    created_at: str
    base: str | None
    recipe: Mapping[str, Any]
    partition_rule: Mapping[str, Any]
    source_namespace: str | None
    keep_skipped: bool
    samples: int
    partitions: tuple[PartitionEntry, ...]
    format_version: int = 1

    @classmethod
    def from_json(cls, doc: Any, where: str) -> VersionRecord:
        """A full record: the document with its ``partitions`` list (read from the catalog's
        partitions table for format 2)."""
        doc = _obj(doc, where, "a version document")
        if doc.get("format") not in VERSION_SCHEMAS:
            raise FormatError(f"{where}: unknown version format {doc.get('format')!r}")
        raw_parts = _field(doc, "partitions", list, where)
        parts = tuple(PartitionEntry.from_json(p, where) for p in raw_parts)
        ids = [p.id for p in parts]
        if len(set(ids)) != len(ids):
            raise FormatError(f"{where}: a partition id is listed twice")
        record = cls(
            tag=_field(doc, "tag", str, where),
            created_at=str(doc.get("created_at", "")),
            base=doc.get("base"),
            recipe=_obj(doc.get("recipe", {}), where, "recipe"),
            partition_rule=_obj(doc.get("partition_rule", {}), where, "partition_rule"),
            source_namespace=doc.get("source_namespace"),
            keep_skipped=bool(doc.get("keep_skipped", False)),
            samples=int(doc.get("samples", sum(p.samples for p in parts))),
            partitions=parts,
            format_version=int(doc.get("format_version", 1)),
        )
        if record.samples != sum(p.samples for p in parts):
            raise FormatError(f"{where}: 'samples' is not the sum of the partitions' samples")
        return record

    def partition(self, pid: str) -> PartitionEntry | None:
        for entry in self.partitions:
            if entry.id == pid:
                return entry
        return None


@dataclass(frozen=True)
class VersionHeader:
    """What a version record says without its partition list: small for any version size.

    Format 2 records hold exactly this plus the recipe fields; format 1 records also list every
    partition inline (``catalog`` is then ``None``: the catalog is attached or built on use).
    """

    tag: str
    created_at: str
    base: str | None
    samples: int
    partition_count: int
    catalog: CatalogRef | None
    format_version: int

    @classmethod
    def from_json(cls, doc: Any, where: str) -> VersionHeader:
        doc = _obj(doc, where, "a version document")
        schema = doc.get("format")
        if schema not in VERSION_SCHEMAS:
            raise FormatError(f"{where}: unknown version format {schema!r}")
        if schema == VERSION_SCHEMA_1:
            record = VersionRecord.from_json(doc, where)
            count, catalog = len(record.partitions), None
        else:
            count = _count(doc, "partition_count", where)
            catalog = CatalogRef.from_json(_field(doc, "catalog", dict, where), where)
            if catalog.partitions.rows != count:
                raise FormatError(
                    f"{where}: partitions table holds {plural(catalog.partitions.rows, 'row')}, the "
                    f"record says {plural(count, 'partition')}"
                )
        base = doc.get("base")
        return cls(
            tag=_field(doc, "tag", str, where),
            created_at=str(doc.get("created_at", "")),
            base=None if base is None else str(base),
            samples=_count(doc, "samples", where),
            partition_count=count,
            catalog=catalog,
            format_version=int(doc.get("format_version", 1)),
        )


@dataclass(frozen=True)
class GcLock:
    """``state.gc_lock``: set while gc deletes objects; publishing is refused until it expires."""

    id: str
    expires_at: float
    owner: str = ""  # who holds the lease (user@host pid), for messages; optional

    @classmethod
    def from_json(cls, doc: Any, where: str) -> GcLock:
        doc = _obj(doc, where, "gc_lock")
        return cls(
            id=str(doc.get("id", "")),
            expires_at=float(doc.get("expires_at", 0)),
            owner=str(doc.get("owner", "")),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "expires_at": self.expires_at}
        if self.owner:
            out["owner"] = self.owner
        return out

    def describe(self) -> str:
        """``gc holds the root until <UTC time> (owner ...)``, for messages."""
        until = datetime.fromtimestamp(self.expires_at, timezone.utc)
        owner = f" (owner {self.owner})" if self.owner else ""
        return f"gc holds the root until {until.isoformat(timespec='seconds')}{owner}"


@dataclass(frozen=True)
class LeaseRecord:
    """``leases/<id>.json``: a running writer's lease. gc keeps every object whose key is in
    ``covers`` or starts with a ``covers`` entry ending in ``/``, until ``expires_at``."""

    id: str
    owner: str  # user@host pid N, for operators
    op: str  # pack, write, write_bag, import-wds, export, remove, forget
    created_at: str  # UTC, ISO 8601
    expires_at: float  # seconds since the epoch; the holder renews it while it runs
    ttl_s: float
    covers: tuple[str, ...]  # key prefixes ending in "/", or whole keys
    tag: str | None = None  # the version the holder will publish, if known

    @classmethod
    def from_json(cls, doc: Any, where: str) -> LeaseRecord:
        doc = _obj(doc, where, "lease")
        if doc.get("format") != LEASE_SCHEMA:
            raise FormatError(f"{where}: not a lease record (format {doc.get('format')!r})")
        covers = _field(doc, "covers", list, where)
        if not all(isinstance(c, str) and c for c in covers):
            raise FormatError(f"{where}: field 'covers' must list non-empty strings")
        return cls(
            id=_field(doc, "id", str, where),
            owner=_field(doc, "owner", str, where),
            op=_field(doc, "op", str, where),
            created_at=_field(doc, "created_at", str, where),
            expires_at=float(_field(doc, "expires_at", (int, float), where)),
            ttl_s=float(_field(doc, "ttl_s", (int, float), where)),
            covers=tuple(covers),
            tag=_optional(doc, "tag", str, where),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "format": LEASE_SCHEMA,
            "id": self.id,
            "owner": self.owner,
            "op": self.op,
            "tag": self.tag,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "ttl_s": self.ttl_s,
            "covers": list(self.covers),
        }

    def live(self, now: float) -> bool:
        return self.expires_at > now

    def describe(self) -> str:
        """``lease <id> (pack of v2 by user@host pid 7, until <UTC time>)``, for messages."""
        until = datetime.fromtimestamp(self.expires_at, timezone.utc)
        what = f"{self.op} of {self.tag}" if self.tag else self.op
        return (
            f"lease {self.id} ({what} by {self.owner}, until {until.isoformat(timespec='seconds')})"
        )


@dataclass(frozen=True)
class CommitRecord:
    """A commit record (``commits/<seq>.json``): the root state after operation ``op``."""

    seq: int
    parent: int
    op: str
    created_at: str
    writer: str
    versions: tuple[tuple[str, str], ...]  # live (tag, hash) pairs in publish order
    retired: tuple[str, ...]  # pruned tags (the on-disk key keeps its format-1 name)
    latest: str | None
    gc_lock: GcLock | None
    detail: Mapping[str, Any]  # op-specific fields (tag, version, tags, ...)

    @classmethod
    def from_json(cls, doc: Any, where: str, seq: int) -> CommitRecord:
        doc = _obj(doc, where, "a commit record")
        if doc.get("format") != COMMIT_SCHEMA or doc.get("seq") != seq:
            raise FormatError(f"{where}: not a shardlake commit record for seq {seq}")
        state = _obj(_field(doc, "state", dict, where), where, "state")
        pairs = _field(state, "versions", list, where)
        if not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
            for p in pairs
        ):
            raise FormatError(f"{where}: state.versions must be [tag, hash] pairs")
        lock = state.get("gc_lock")
        known = {"format", "seq", "parent", "op", "created_at", "writer", "state"}
        return cls(
            seq=seq,
            parent=int(doc.get("parent", seq - 1)),
            op=str(doc.get("op", "")),
            created_at=str(doc.get("created_at", "")),
            writer=str(doc.get("writer", "")),
            versions=tuple((t, h) for t, h in pairs),
            retired=tuple(str(t) for t in state.get("retired", ())),
            latest=state.get("latest"),
            gc_lock=None if lock is None else GcLock.from_json(lock, where),
            detail={k: v for k, v in doc.items() if k not in known},
        )
