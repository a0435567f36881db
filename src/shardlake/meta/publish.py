"""Publishing a version: its catalog, its record (create-if-absent), then the next commit.

A version is *published* when a commit record naming it is created; a commit that lost a race
leaves the new record unreferenced (garbage for gc).

Every publisher (pack, the writers, remove) states each fact once:

* the tag's name, at the operation's door (``check_name("tag", ...)``), before any request;
* :func:`prepare_publish`, once before the work: the root (made if new, create-if-absent
  proven), its state, and the tag free in it (:func:`check_tag_free`: fails fast, one wording
  for every publisher);
* :func:`publish_version`, at the commit, against the state the commit builds on: the tag still
  free and the base still live (a run can take hours), then the commit record created with
  create-if-absent. That create is the lock: two publishers of one state cannot both win. The
  fail-fast check only spares the work; the commit's check is the one that holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from ..errors import AlreadyExistsError, ConflictError, FormatError, ObjectsGoneError
from ..format.catalog import SEGMENT_MAX_ROWS, CatalogRef
from ..format.documents import VERSION_SCHEMA, PartitionEntry
from ..format.layout import DATA_DIR, RECORD_FORMAT_VERSION, commit_key, version_key
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

__all__ = [
    "VersionBody",
    "build_version_doc",
    "check_tag_free",
    "prepare_publish",
    "publish_version",
    "store_version_doc",
]


# Manifest rows publish keeps from its digest reads for the catalog (more are read again there).
FRESH_ROWS_KEPT = SEGMENT_MAX_ROWS // 2

# Fields of a stored record that publish computes (never copied into a successor's body).
_COMPUTED_FIELDS = frozenset(
    ["format", "format_version", "tag", "partitions", "partition_count", "samples", "catalog"]
    + ["created_at"]
)
# Fields a body states; any other field of a record it succeeds is kept as it was.
_BODY_FIELDS = frozenset(
    ["base", "recipe", "partition_rule", "source_namespace", "keep_skipped", "derived"]
    + ["redacted"]
)


@dataclass(frozen=True)
class VersionBody:
    """A new version as its publisher states it; publish adds what it computes (the catalog,
    partition count, sample total, format and ``created_at``).

    ``derived`` (remove: the version it was made from and what it left out) and ``redacted``
    (forget: the forget run and the record it replaces) are absent from most records; ``kept``
    holds the fields of a record it succeeds (:meth:`successor`) that this shardlake does not
    know, unchanged.
    """

    tag: str
    base: str | None
    partitions: tuple[PartitionEntry, ...]
    recipe: Mapping[str, Any] = field(default_factory=dict)
    partition_rule: Mapping[str, Any] = field(default_factory=dict)
    source_namespace: str | None = None
    keep_skipped: bool = False
    derived: Mapping[str, Any] | None = None
    redacted: Mapping[str, Any] | None = None
    kept: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def successor(
        cls,
        doc: Mapping[str, Any],
        *,
        tag: str,
        base: str | None,
        partitions: Iterable[PartitionEntry],
        derived: Mapping[str, Any] | None = None,
        redacted: Mapping[str, Any] | None = None,
    ) -> VersionBody:
        """The body of a version made from the stored record ``doc`` (remove, forget): its
        recipe, rule, namespace and other fields, with the new tag, base and partitions;
        ``derived`` / ``redacted`` given replace the record's."""
        return cls(
            tag=tag,
            base=base,
            partitions=tuple(partitions),
            recipe=doc.get("recipe", {}),
            partition_rule=doc.get("partition_rule", {}),
            source_namespace=doc.get("source_namespace"),
            keep_skipped=bool(doc.get("keep_skipped", False)),
            derived=doc.get("derived") if derived is None else derived,
            redacted=doc.get("redacted") if redacted is None else redacted,
            kept={k: v for k, v in doc.items() if k not in _COMPUTED_FIELDS | _BODY_FIELDS},
        )


def build_version_doc(
    body: VersionBody, partitions: Sequence[PartitionEntry], catalog: CatalogRef
) -> bytes:
    """Serialise a format-2 version record (``body``'s fields, the partition count and sample
    total of ``partitions`` as the catalog placed them, and the ``catalog`` reference) to its
    canonical bytes."""
    doc: dict[str, Any] = dict(body.kept)
    doc.update(
        base=body.base,
        recipe=dict(body.recipe),
        partition_rule=dict(body.partition_rule),
        source_namespace=body.source_namespace,
        keep_skipped=body.keep_skipped,
    )
    if body.derived is not None:
        doc["derived"] = dict(body.derived)
    if body.redacted is not None:
        doc["redacted"] = dict(body.redacted)
    doc.update(
        format=VERSION_SCHEMA,
        format_version=RECORD_FORMAT_VERSION,
        tag=body.tag,
        partition_count=len(partitions),
        samples=sum(p.samples for p in partitions),
        catalog=catalog.to_json(),
        created_at=utc_now(),
    )
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


def check_tag_free(state: RootState, tag: str, store: Store) -> None:
    """Fail fast, before the work, when ``tag`` is live or was pruned in ``state`` (the same
    words for every publisher; the commit checks again, :func:`publish_version`)."""
    if tag in state.versions or tag in state.retired:
        raise ConflictError(
            f"{store.url}: version tag {tag!r} already exists; tags are never reused"
        )


def prepare_publish(store: Store, tag: str, *, allow_foreign: bool = False) -> RootState:
    """What a publishing operation does once, before its work: the root made if new (and its
    create-if-absent proven, :func:`~shardlake.meta.rootmarker.ensure_root`), its state read,
    and ``tag`` free in it. The state returned is the one the publish builds on."""
    ensure_root(store, allow_foreign=allow_foreign)
    state = read_state(store)
    check_tag_free(state, tag, store)
    return state


# Above this many new revision directories one listing of data/ is cheaper than one per directory.
_LIST_DIRS_MAX = 64


def _referenced(partitions: Iterable[PartitionEntry]) -> set[str]:
    keys: set[str] = set()
    for entry in partitions:
        if entry.manifest:
            keys.add(entry.manifest)
        keys.update(shard.key for shard in entry.shards)
    return keys


def _base_catalog(store: Store, base_tag: str | None, state: RootState) -> Catalog | None:
    """The catalog of the live base version ``base_tag`` (none without one).

    Reading it costs the base record and its partitions table (segments are read only if a
    merge needs them); a format-1 base without an attached catalog has none to reuse.
    """
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
    Cost: one read per new manifest the build wrote, two for any other. The tables read are
    kept for the catalog up to :data:`FRESH_ROWS_KEPT` rows (the catalog re-reads the others,
    checked against the digests set here), so a large version's rows are never all in memory.
    """
    known = {
        e.manifest: (e.manifest_sha256, e.manifest_size) for e in base_parts if e.manifest_sha256
    }
    out = []
    fresh: dict[str, pa.Table] = {}
    kept = 0
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
                if kept + table.num_rows <= FRESH_ROWS_KEPT:
                    fresh[entry.id] = table
                    kept += table.num_rows
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
    store: Store, body: VersionBody, state: RootState, *, operation: str = "publish"
) -> StoredVersion:
    """Publish ``body`` as the commit after ``state`` (the state read before the work began,
    or re-read by a caller that retries).

    The commit's facts are checked against ``state``, which is the state the commit builds on:
    the tag still free, the base still live, no gc holding the root (``operation`` names the
    run in a refusal). Then, if no later commit exists, the catalog and the version record are
    written and the commit record is created with create-if-absent, the one lock there is:
    if another commit landed after ``state`` the publish is refused with
    :class:`ConflictError` and the new record stays unreferenced (garbage for ``gc``).
    The caller ran :func:`prepare_publish` once (the root made, create-if-absent proven).
    """
    tag = body.tag
    if tag in state.versions or tag in state.retired:
        raise ConflictError(
            f"{store.url}: version tag {tag!r} was published by another writer while this "
            f"{operation} ran; nothing was published by this run"
        )
    if body.base is not None and body.base not in state.versions:
        raise ConflictError(
            f"{store.url}: base version {body.base!r} was pruned while this {operation} ran; "
            "nothing was published - re-run (finished revisions are reused)"
        )
    if state.gc_locked():
        raise ConflictError(
            f"{store.url}: gc is deleting unreferenced objects (commit {state.seq}); nothing "
            "was published by this run - re-run it when gc has finished"
        )
    store.ensure_create_enforced()  # proven by prepare_publish; cached: no request
    # One request instead of reading the state again: a later commit means ``state`` is stale
    # (spare the catalog and record writes; the create below would refuse anyway).
    if store.exists(commit_key(state.seq + 1)):
        raise ConflictError(
            f"{store.url}: another writer committed (commit {state.seq + 1}) after this run "
            f"read the root at commit {state.seq}; nothing was published by this run - re-run it"
        )
    base_catalog = _base_catalog(store, body.base, state)
    base_parts = base_catalog.entries if base_catalog is not None else []
    entries = list(body.partitions)
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
    data = build_version_doc(body, parts, catalog)
    version_hash, key = store_version_doc(store, tag, data)
    versions = dict(state.versions)
    versions[tag] = version_hash
    new = RootState(state.seq + 1, versions, state.retired, tag)
    commit_state(store, state, new, "publish", {"tag": tag, "version": version_hash})
    return StoredVersion.parse(tag, version_hash, data, store.key_url(key), store)
