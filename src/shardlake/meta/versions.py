"""Published versions: the stored record (:class:`StoredVersion`) and what users hold
(:class:`Version`); resolving a tag through the commit log, reading a version document
(``versions/<tag>/<hash>.json``, checked against its hash), and pruning tags. Publishing is
:mod:`shardlake.meta.publish`; the commit log :mod:`shardlake.meta.commits`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from ..errors import (
    ConflictError,
    FormatError,
    KeyNotFoundError,
    VersionNotFoundError,
    VersionRedactedError,
)
from ..format.catalog import ObjectRef
from ..format.documents import PartitionEntry, VersionHeader, VersionRecord
from ..format.layout import version_key
from ..read.receipts import find_redaction
from ..read.verified import read_verified
from ..store import Store
from .catalog_objects import read_partitions
from .commits import commit_state, read_state
from .rootmarker import require_root
from .state import RootState, hash_bytes, parse_json

__all__ = [
    "StoredVersion",
    "Version",
    "live_versions",
    "load_version",
    "load_version_by_hash",
    "load_version_bytes",
    "prune_versions",
    "resolve_tag",
    "version_of",
    "versions_for",
]


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
