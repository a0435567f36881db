"""``forget``: erase samples from every retained version, and leave a receipt that proves it.

Steps (docs/runbook.md, "Erasure requests"; the receipt: docs/format.md, "Forget receipts"):

1. Resolve the selection (keys, a key file or a SQL ``where``) to a set of sample keys, across
   every *retained* version: the live ones and those a keyset is bound to.
2. Find every shard that physically holds a member of one of those keys (a version made by
   ``remove`` still references shards holding samples it does not list), and every retained
   version that references such a shard.
3. Rewrite only those shards without the forgotten members (one task each, on the executor pack
   uses): the members kept are copied byte for byte (deterministic headers, same payload
   bytes). Each rewritten shard goes into a new revision directory of its partition
   (``data/<pid>/f<hash>/``); the shards it does not touch are referenced where they are.
4. Write each affected version's redacted successor: new manifests, a catalog that reuses no
   segment holding a forgotten row, a new version record under the same tag.
5. Write the receipt, then ONE commit (``op: forget``) swapping every affected tag to its
   successor. A racing commit makes it start again from the new state (the objects already
   written are deterministic and reused).
6. After the commit: rewrite keysets bound to a redacted version (same name, successor hash,
   without the forgotten keys) and delete every superseded object at once (no gc grace).
   A rerun (after a kill) finishes both for any committed receipt not marked complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import secrets
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import (
    SHOW_MAX,
    AlreadyExistsError,
    ConflictError,
    FormatError,
    KeyNotFoundError,
    NotFoundError,
    ObjectsGoneError,
    SelectionError,
    UsageError,
)
from ..executors.tasks import ExecutorSpec, Task, executor_for, run_tasks
from ..format.codec import Decoder
from ..format.documents import PartitionEntry, ShardEntry
from ..format.layout import (
    DATA_DIR,
    MEMBER_SUFFIX,
    manifest_key,
    receipt_key,
    shard_key,
    short_hash,
    unescape_member_key,
    version_key,
)
from ..format.manifest import ManifestMeta, parse_manifest, write_manifest
from ..format.tar import ShardWriter, iter_members
from ..meta.catalog import load_catalog, publish_catalog
from ..meta.commits import commit_state, read_state
from ..meta.gcwait import commit_beside_gc
from ..meta.keysets import Keyset, list_keysets, read_key_list, redact_keyset, reindex_keysets
from ..meta.leases import Lease
from ..meta.publish import build_version_doc
from ..meta.rootmarker import require_root
from ..meta.state import RootState, canonical_json, hash_bytes, utc_now
from ..meta.versions import StoredVersion, load_version_by_hash
from ..progress.bar import Progress, plural
from ..query.dataset import Dataset
from ..read.manifests import read_entry_manifest
from ..read.receipts import RECEIPT_SCHEMA, committed_receipts, list_receipt_ids
from ..store import Store
from .common import version_closure

__all__ = [
    "UNREACHABLE",
    "ForgetCheckReport",
    "ForgetOptions",
    "ForgetReport",
    "check_forget",
    "forget",
    "rewrite_shard",
]

# What a forget cannot erase: printed with every forget and in docs/runbook.md.
UNREACHABLE = (
    "exports and copies of this root made before the forget (shardlake export, clones, syncs)",
    "other nodes' epoch caches and catalog caches until they next open this root",
    "backups, bucket object versioning and soft-delete of the store",
    "loaders and processes that already read the samples into memory",
)
DIGEST_RULE = "sha256(salt || x)"


@dataclass(frozen=True)
class ForgetOptions:
    """What ``forget`` erases: exactly one of ``keys``, ``key_file`` and ``where``; and why.

    Parameters
    ----------
    keys
        Sample keys to forget.
    key_file
        A local key list (text, or a JSON list of keys or ``.npz`` paths; ``-`` is stdin).
    where
        Forget the samples matching this SQL expression in any retained version.
    reason
        Why (an erasure request's reference, a licence withdrawal): recorded in the commit log
        and the receipt verbatim, so it must hold no personal data. Required.
    dry_run
        Only list the affected versions, keysets, counts and bytes to rewrite.
    strip_prefix
        Maps absolute paths of ``key_file`` to keys (default: the latest version's namespace).
    executor
        Where the shard rewrites run: thread (default), process, inline or dask://HOST:PORT.
    workers
        Shards rewritten at once.
    progress
        A progress bar on stderr.
    retries
        How often a commit lost to a racing writer is redone on top of it.
    """

    keys: Sequence[str] | None = None
    key_file: str | None = None
    where: str | None = None
    reason: str = ""
    dry_run: bool = False
    strip_prefix: str | None = None
    executor: ExecutorSpec = None
    workers: int = 4
    progress: bool | None = False
    retries: int = 5


@dataclass(frozen=True)
class AffectedVersion:
    tag: str
    old: str
    new: str | None  # None in a dry run
    removed: int  # samples the version listed that are forgotten
    shards: int  # shards of the version rewritten
    live: bool  # False: pruned, kept by a keyset

    def to_json(self) -> dict[str, Any]:
        return {
            "tag": self.tag,
            "old": self.old,
            "new": self.new,
            "removed": self.removed,
            "shards_rewritten": self.shards,
            "live": self.live,
        }


@dataclass
class ForgetReport:
    """What :func:`forget` did (or, with ``dry_run``, would do)."""

    forget_id: str | None
    dry_run: bool
    reason: str
    keys: int  # forgotten keys found in some retained version
    unmatched: list[str]  # selected keys no retained version holds
    versions: list[AffectedVersion]
    keysets: dict[str, int]  # keyset -> keys removed from it
    shards_rewritten: int
    bytes_to_rewrite: int  # size of the shards rewritten
    bytes_written: int  # new shards and manifests
    deleted: list[str] = field(default_factory=list)
    receipt: str | None = None
    seconds: float = 0.0
    attempts: int = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "forget_id": self.forget_id,
            "dry_run": self.dry_run,
            "reason": self.reason,
            "keys": self.keys,
            "unmatched": self.unmatched[:SHOW_MAX],
            "unmatched_count": len(self.unmatched),
            "versions": [v.to_json() for v in self.versions],
            "keysets": self.keysets,
            "shards_rewritten": self.shards_rewritten,
            "bytes_to_rewrite": self.bytes_to_rewrite,
            "bytes_written": self.bytes_written,
            "deleted": len(self.deleted),
            "receipt": self.receipt,
            "seconds": round(self.seconds, 3),
            "attempts": self.attempts,
            "not_reached": list(UNREACHABLE),
        }

    def summary(self) -> str:
        lines = []
        verb = "would redact" if self.dry_run else "redacted"
        for v in self.versions:
            to = "" if v.new is None else f" -> {v.new}"
            where = "" if v.live else " (pruned, kept by a keyset)"
            lines.append(
                f"{verb} {v.tag} {v.old}{to}{where}: {plural(v.removed, 'sample')} removed, "
                f"{plural(v.shards, 'shard')} rewritten"
            )
        for name, n in self.keysets.items():
            lines.append(f"keyset {name}: {plural(n, 'key')} removed")
        if self.unmatched:
            shown = ", ".join(repr(k) for k in self.unmatched[:SHOW_MAX])
            lines.append(
                f"{len(self.unmatched)} selected key(s) are in no retained version: {shown}"
            )
        if not self.versions:
            lines.append("no retained version holds a selected sample; nothing changed")
        else:
            lines.append(
                f"{plural(self.keys, 'key')}; {plural(self.shards_rewritten, 'shard')} "
                f"({plural(self.bytes_to_rewrite, 'byte')}) "
                + ("to rewrite; nothing changed (dry run)" if self.dry_run else "rewritten, ")
                + (
                    ""
                    if self.dry_run
                    else f"{plural(self.bytes_written, 'byte')} written, {len(self.deleted)} superseded "
                    f"object(s) deleted; forget {self.forget_id}, receipt {self.receipt}"
                )
            )
        lines.append("forget cannot reach: " + "; ".join(UNREACHABLE))
        return "\n".join(lines)


# --- digests ---------------------------------------------------------------------------------


def salted(salt: str, data: bytes | memoryview | str) -> str:
    """The receipt's digest: sha256 of the salt's bytes, then ``data`` (a key: its UTF-8)."""
    h = hashlib.sha256(bytes.fromhex(salt))
    h.update(data.encode() if isinstance(data, str) else data)
    return h.hexdigest()


# --- the shard rewrite (a task: runs on the executor) ----------------------------------------


@dataclass(frozen=True)
class ShardRewrite:
    """A rewritten shard: its new entry (``members`` 0: nothing left, not written), where each
    kept key now lies, and the salted digests of the forgotten payloads."""

    old: str
    new: ShardEntry
    positions: dict[str, tuple[int, int]]  # key -> (member, offset)
    digests: list[str]
    forgotten: list[str]  # keys found in it
    read_bytes: int
    written: int


def _member_key(name: str, where: str) -> str:
    if not name.endswith(MEMBER_SUFFIX):
        raise FormatError(f"{where}: member {name!r} is not a shardlake sample member")
    return unescape_member_key(name[: -len(MEMBER_SUFFIX)])


class _RangeReader(io.RawIOBase):
    """A shard read sequentially through ranged reads of ``window`` bytes: a rewrite holds one
    window and one member in memory, never the whole shard."""

    def __init__(self, store: Store, key: str, size: int, window: int = 16 * 2**20) -> None:
        self.store, self.key, self.size, self.window = store, key, size, window
        self.pos = 0
        self.start = 0
        self.buf = b""
        self.fetched = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = base + offset
        return self.pos

    def readinto(self, b: Any) -> int:
        if self.pos >= self.size:
            return 0
        if not (self.start <= self.pos < self.start + len(self.buf)):
            end = min(self.size, self.pos + max(self.window, len(b)))
            self.buf = self.store.read_range(self.key, self.pos, end)
            self.start = self.pos
            self.fetched += len(self.buf)
        at = self.pos - self.start
        n = min(len(b), len(self.buf) - at)
        b[:n] = self.buf[at : at + n]
        self.pos += n
        return n

    def take(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` (one member's payload)."""
        self.seek(offset)
        out = bytearray()
        while len(out) < size:
            chunk = self.read(size - len(out))
            if not chunk:
                raise FormatError(f"{self.store.key_url(self.key)}: ends inside a member")
            out += chunk
        return bytes(out)


def rewrite_shard(
    store: Store, old_key: str, new_key: str, drop: frozenset[str], salt: str, size: int = -1
) -> ShardRewrite:
    """Write ``new_key``: shard ``old_key`` without the members of ``drop``'s keys; the members
    kept are byte-identical (same deterministic header, same payload bytes, same padding). The
    shard is streamed (ranged reads in, a streaming upload out); nothing is written when no
    member is left."""
    where = store.key_url(old_key)
    reader = _RangeReader(store, old_key, store.size(old_key) if size < 0 else size)
    decoder = Decoder()
    positions: dict[str, tuple[int, int]] = {}
    digests, forgotten = [], []
    with contextlib.ExitStack() as stack:
        writer: ShardWriter | None = None
        # tarfile seeks back to its next header itself, so payloads are read in between.
        for member in iter_members(reader, where):  # type: ignore[arg-type]
            key = _member_key(member.name, where)
            payload = reader.take(member.offset, member.size)
            if key in drop:
                forgotten.append(key)
                digests.append(salted(salt, decoder.decompress(payload, f"{where} key {key!r}")))
                continue
            if writer is None:
                # Opened at the first member kept: visible only when the block exits cleanly.
                writer = ShardWriter(stack.enter_context(store.open_writer(new_key)))
            positions[key] = writer.add(key, payload)
        if writer is None:
            return ShardRewrite(
                old_key, ShardEntry(new_key, 0, 0), {}, digests, forgotten, reader.size, 0
            )
        writer.close()
    # Deterministic bytes: a rerun after a kill writes the very same object again.
    entry = ShardEntry(new_key, writer.bytes_written, writer.members)
    return ShardRewrite(
        old_key, entry, positions, digests, forgotten, reader.size, writer.bytes_written
    )


# --- planning --------------------------------------------------------------------------------


@dataclass
class _Retained:
    version: StoredVersion
    live: bool
    listed: pa.Table = field(repr=False)  # key, partition, shard of forgotten keys it lists


@dataclass
class _Plan:
    forgotten: set[str]
    unmatched: list[str]
    retained: list[_Retained]
    # old shard key -> (new shard key, forgotten keys it holds)
    shards: dict[str, tuple[str, set[str]]]
    shard_sizes: dict[str, int]
    affected: list[_Retained]
    keysets: list[Keyset]


def _retained(store: Store, state: RootState, keysets: Sequence[Keyset]) -> list[_Retained]:
    """Live versions in publish order, then pruned ones keysets are bound to."""
    out = [(load_version_by_hash(store, tag, h), True) for tag, h in state.versions.items()]
    live = set(state.versions.values())
    pinned = sorted(
        {(k.version_tag, k.version_hash) for k in keysets if k.version_hash not in live}
    )
    out += [(load_version_by_hash(store, tag, h), False) for tag, h in pinned]
    return [_Retained(v, is_live, pa.table({})) for v, is_live in out]


def _selected_keys(
    store: Store, retained: Sequence[_Retained], options: ForgetOptions
) -> list[str]:
    if options.where is not None:
        keys: dict[str, None] = {}
        for r in retained:
            try:
                rows = (
                    Dataset(store, r.version)
                    .select(where=options.where)
                    .rows(["key"], allow_missing=None)
                )
            except SelectionError as exc:
                if "is empty" in str(exc):
                    continue
                raise
            keys.update(dict.fromkeys(rows.column("key").to_pylist()))
        return list(keys)
    if options.key_file is not None:
        namespace = None
        if options.strip_prefix is None and retained:
            namespace = retained[-1].version.record.source_namespace
        listed = read_key_list(
            options.key_file, strip_prefix=options.strip_prefix, source=namespace
        )
        if listed.unmapped:
            raise NotFoundError(
                f"{len(listed.unmapped)} entr{'y' if len(listed.unmapped) == 1 else 'ies'} of "
                f"{options.key_file} map to no key: "
                + ", ".join(repr(e) for e in listed.unmapped[:SHOW_MAX]),
                options=("strip_prefix",),
            )
        return list(dict.fromkeys(listed.keys))
    return list(dict.fromkeys(options.keys or ()))


def _plan(store: Store, state: RootState, options: ForgetOptions) -> _Plan:
    keysets = list_keysets(store)
    retained = _retained(store, state, keysets)
    selected = _selected_keys(store, retained, options)
    wanted = pa.array(selected, pa.string())
    found: set[str] = set()
    # old shard key -> forgotten keys it holds (by the manifests that list them)
    holds: dict[str, set[str]] = {}
    listed_count: dict[str, set[str]] = {}  # shard key -> keys some retained version lists there
    members: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for r in retained:
        rows = load_catalog(store, r.version).rows(["key", "partition", "shard"])
        hit = rows.filter(pc.is_in(rows.column("key"), value_set=wanted))
        r.listed = hit
        by_id = {e.id: e for e in r.version.entries}
        for key, pid, shard in zip(
            hit.column("key").to_pylist(),
            hit.column("partition").to_pylist(),
            hit.column("shard").to_pylist(),
            strict=True,
        ):
            found.add(key)
            holds.setdefault(by_id[pid].shards[shard].key, set()).add(key)
        for entry in r.version.entries:
            for s in entry.shards:
                members[s.key] = s.members
                sizes[s.key] = s.size
        # Shards with members no version lists (left by remove) are read below.
        if any(sum(s.members for s in e.shards) > e.samples for e in r.version.entries):
            for key, pid, shard in zip(
                rows.column("key").to_pylist(),
                rows.column("partition").to_pylist(),
                rows.column("shard").to_pylist(),
                strict=True,
            ):
                listed_count.setdefault(by_id[pid].shards[shard].key, set()).add(key)
    # A shard with more members than the retained versions list there (remove leaves them)
    # may hold a selected key no manifest names: its member names are read.
    selected_set = set(selected)
    scanned: set[str] = set()
    for r in retained:
        for entry in r.version.entries:
            if sum(s.members for s in entry.shards) <= entry.samples:
                continue
            for s in entry.shards:
                if s.key in holds or s.key in scanned:
                    continue
                scanned.add(s.key)
                if len(listed_count.get(s.key, ())) >= s.members:
                    continue
                for key in _member_keys(store, s.key):
                    if key in selected_set:
                        holds.setdefault(s.key, set()).add(key)
                        found.add(key)
    unmatched = [k for k in selected if k not in found]
    shards: dict[str, tuple[str, set[str]]] = {}
    affected = []
    for r in retained:
        touched = False
        for entry in r.version.entries:
            if not any(s.key in holds for s in entry.shards):
                continue
            touched = True
            new_rev = _new_data_rev(entry, holds)
            for index, s in enumerate(entry.shards):
                if s.key in holds and s.key not in shards:
                    shards[s.key] = (shard_key(entry.id, new_rev, index), holds[s.key])
        if touched:
            affected.append(r)
    return _Plan(found, unmatched, retained, shards, sizes, affected, keysets)


def _member_keys(store: Store, key: str) -> list[str]:
    where = store.key_url(key)
    return [_member_key(m.name, where) for m in iter_members(store.read(key), where)]


def _new_data_rev(entry: PartitionEntry, holds: Mapping[str, set[str]]) -> str:
    """The revision directory of a partition revision's rewritten shards: a function of the
    revision and of what is erased from it, so a rerun rewrites into the same names."""
    gone = sorted({k for s in entry.shards for k in holds.get(s.key, ())})
    return "f" + short_hash("forget", entry.data_rev, *gone, length=23)


# --- successors ------------------------------------------------------------------------------


def _redacted_entry(
    store: Store,
    entry: PartitionEntry,
    forgotten: pa.Array,
    rewrites: Mapping[str, ShardRewrite],
    new_rev: str,
) -> tuple[PartitionEntry | None, pa.Table | None, int, int]:
    """``(entry, manifest table, samples removed, bytes written)``; entry None: every sample of
    the partition is forgotten (it leaves the version)."""
    table, meta = read_entry_manifest(store, entry)
    keep = table.filter(pc.invert(pc.is_in(table.column("key"), value_set=forgotten)))
    removed = table.num_rows - keep.num_rows
    if keep.num_rows == 0:
        return None, None, removed, 0
    new_shards: list[ShardEntry] = []
    index_of: dict[int, int] = {}
    for i, s in enumerate(entry.shards):
        done = rewrites.get(s.key)
        if done is None:
            index_of[i] = len(new_shards)
            new_shards.append(s)
        elif done.new.members:
            index_of[i] = len(new_shards)
            new_shards.append(done.new)
    keys = keep.column("key").to_pylist()
    shard_col = keep.column("shard").to_pylist()
    member_col = keep.column("member").to_pylist()
    offset_col = keep.column("offset").to_pylist()
    for j, key in enumerate(keys):
        old = entry.shards[shard_col[j]].key
        done = rewrites.get(old)
        if done is not None:
            if key not in done.positions:
                raise FormatError(f"{store.key_url(old)}: has no member for key {key!r}")
            member_col[j], offset_col[j] = done.positions[key]
        shard_col[j] = index_of[shard_col[j]]
    for name, values, kind in (
        ("shard", shard_col, pa.int32()),
        ("member", member_col, pa.int32()),
        ("offset", offset_col, pa.int64()),
    ):
        keep = keep.set_column(keep.column_names.index(name), name, pa.array(values, kind))
    manifest_rev = "f" + short_hash("forget", entry.manifest_rev, new_rev, length=23)
    mkey = manifest_key(entry.id, new_rev, manifest_rev)
    new_meta = ManifestMeta(
        meta.partition_id,
        meta.partition_path,
        new_rev,
        meta.meta_rev,
        manifest_rev,
        meta.recipe,
        meta.format_version,
    )
    keep = keep.replace_schema_metadata(None)
    data = write_manifest(keep, new_meta)
    written = len(data)
    try:
        store.create(mkey, data)
    except AlreadyExistsError:
        # A rerun: the same revision with the same rows (parquet bytes may differ).
        data = store.read(mkey)
        table2, meta2 = parse_manifest(data, store.key_url(mkey))
        if table2.num_rows != keep.num_rows or meta2.manifest_rev != manifest_rev:
            raise
        keep, written = table2, 0
    new_entry = replace(
        entry,
        data_rev=new_rev,
        manifest_rev=manifest_rev,
        manifest=mkey,
        samples=keep.num_rows,
        payload_bytes=int(pc.sum(keep.column("size")).as_py() or 0),
        shards=tuple(new_shards),
        manifest_sha256=hashlib.sha256(data).hexdigest(),
        manifest_size=len(data),
        segment=None,
    )
    return new_entry, keep, removed, written


_COMPUTED = ("format", "format_version", "tag", "samples", "created_at", "partition_count")


def _successor(
    store: Store,
    old: StoredVersion,
    plan: _Plan,
    rewrites: Mapping[str, ShardRewrite],
    forget_id: str,
) -> tuple[StoredVersion, int, int, int]:
    """Publish-ready successor of ``old`` (record and catalog written, not committed):
    ``(version, samples removed, shards rewritten, bytes written)``."""
    forgotten = pa.array(sorted(plan.forgotten), pa.string())
    holds = {k: v[1] for k, v in plan.shards.items()}
    entries: list[PartitionEntry] = []
    fresh: dict[str, pa.Table] = {}
    dirty: set[str] = set()
    removed = rewritten = written = 0
    for entry in old.entries:
        touched = [s.key for s in entry.shards if s.key in rewrites]
        if not touched:
            entries.append(entry)
            continue
        rewritten += len(touched)
        new_entry, table, n, w = _redacted_entry(
            store, entry, forgotten, rewrites, _new_data_rev(entry, holds)
        )
        removed += n
        written += w
        if n and entry.segment:
            dirty.add(entry.segment)  # its rows name forgotten keys: not reused
        if new_entry is not None and table is not None:
            entries.append(new_entry)
            fresh[new_entry.id] = table
    if not entries:
        raise SelectionError(
            f"{store.url}: forgetting these samples would leave version {old.tag!r} empty; "
            "prune it first (shardlake prune-version), then forget",
        )
    base = load_catalog(store, old, build=False)
    catalog, parts = publish_catalog(store, entries, base, fresh, avoid=dirty)
    body = {k: v for k, v in old.header_doc.items() if k not in _COMPUTED}
    body["redacted"] = {"forget": forget_id, "from": old.hash}
    data = build_version_doc(old.tag, body, parts, catalog)
    new_hash = hash_bytes(data)
    key = version_key(old.tag, new_hash)
    try:
        store.create(key, data)
    except AlreadyExistsError:
        if store.read(key) != data:
            raise FormatError(
                f"{store.key_url(key)}: holds different bytes than its hash"
            ) from None
    version = StoredVersion.parse(old.tag, new_hash, data, store.key_url(key), store)
    return version, removed, rewritten, written + len(data)


# --- the operation ---------------------------------------------------------------------------


def _check_options(options: ForgetOptions) -> None:
    chosen = [x is not None for x in (options.keys, options.key_file, options.where)]
    if sum(chosen) != 1:
        raise UsageError(
            "forget takes exactly one of keys, key_file and where",
            options=("keys", "key_file", "where"),
        )
    if not options.reason.strip():
        raise UsageError(
            "forget needs a reason (recorded in the commit log and the receipt; no personal data)",
            options=("reason",),
        )
    if options.workers < 1:
        raise UsageError("workers must be >= 1", options=("workers",))


def forget(store: Store, options: ForgetOptions) -> ForgetReport:
    """Erase the selected samples from every retained version in one commit (see the module
    docs); ``dry_run`` only reports. Returns a :class:`ForgetReport`."""
    _check_options(options)
    started = time.monotonic()
    if not options.dry_run:
        store.ensure_create_enforced()
        complete_pending(store)
    forget_id = uuid.uuid4().hex
    salt = secrets.token_hex(16)
    for attempt in range(1, options.retries + 2):
        state = read_state(store)
        require_root(store, state)
        plan = _plan(store, state, options)
        if options.dry_run or not plan.affected:
            return _dry_report(plan, options, attempt, time.monotonic() - started)
        # gc keeps what this run writes (new revisions, records, catalog objects) until it ends.
        pids = {e.id for r in plan.affected for e in r.version.entries}
        tags = {r.version.tag for r in plan.affected}
        covers = [f"{DATA_DIR}/{p}/" for p in sorted(pids)]
        covers += [f"versions/{t}/" for t in sorted(tags)] + ["catalog/"]
        with Lease(store, "forget", covers=covers):
            report = _attempt(store, state, plan, options, forget_id, salt)
        if report is not None:
            report.attempts = attempt
            report.seconds = time.monotonic() - started
            return report
    raise ConflictError(
        f"{store.url}: other writers committed during each of {options.retries + 1} forget "
        "attempts; nothing was forgotten - re-run it",
    )


def _dry_report(plan: _Plan, options: ForgetOptions, attempt: int, seconds: float) -> ForgetReport:
    counts = _keyset_counts(plan)
    versions = []
    for r in plan.affected:
        shards = {s.key for e in r.version.entries for s in e.shards if s.key in plan.shards}
        versions.append(
            AffectedVersion(
                r.version.tag, r.version.hash, None, r.listed.num_rows, len(shards), r.live
            )
        )
    return ForgetReport(
        forget_id=None,
        dry_run=True,
        reason=options.reason,
        keys=len(plan.forgotten),
        unmatched=plan.unmatched,
        versions=versions,
        keysets=counts,
        shards_rewritten=len(plan.shards),
        bytes_to_rewrite=sum(plan.shard_sizes.get(k, 0) for k in plan.shards),
        bytes_written=0,
        seconds=seconds,
        attempts=attempt,
    )


def _keyset_counts(plan: _Plan) -> dict[str, int]:
    affected = {r.version.hash for r in plan.affected}
    return {
        k.name: sum(1 for key in k.keys if key in plan.forgotten)
        for k in plan.keysets
        if k.version_hash in affected
    }


def _rewrite(
    store: Store, plan: _Plan, options: ForgetOptions, salt: str
) -> dict[str, ShardRewrite]:
    spec = executor_for(
        store, "thread" if options.executor is None else options.executor, "rewritten"
    )
    tasks = [
        Task(
            old,
            rewrite_shard,
            (store, old, new, frozenset(keys), salt, plan.shard_sizes.get(old, -1)),
        )
        for old, (new, keys) in sorted(plan.shards.items())
    ]
    bar = Progress(len(tasks), "shardlake forget", unit="shards", enabled=options.progress)
    with bar:
        results, failures = run_tasks(tasks, spec, options.workers, bar)
    if failures:
        raise failures[0][1]  # nothing committed yet: the rerun rewrites the same names
    return {r.old: r for r in results}


def _attempt(
    store: Store,
    state: RootState,
    plan: _Plan,
    options: ForgetOptions,
    forget_id: str,
    salt: str,
) -> ForgetReport | None:
    rewrites = _rewrite(store, plan, options, salt)
    successors: dict[str, StoredVersion] = {}
    versions: list[AffectedVersion] = []
    written = sum(r.written for r in rewrites.values())
    for r in plan.affected:
        new, removed, shards, w = _successor(store, r.version, plan, rewrites, forget_id)
        successors[r.version.hash] = new
        written += w
        versions.append(
            AffectedVersion(r.version.tag, r.version.hash, new.hash, removed, shards, r.live)
        )
    # What no retained version references once the successors replace the old versions.
    after: set[str] = set()
    for r in plan.retained:
        after.update(version_closure(store, successors.get(r.version.hash, r.version)))
    before: set[str] = set()
    for r in plan.affected:
        before.update(version_closure(store, r.version))
    superseded = sorted(before - after)
    digests = sorted({d for rw in rewrites.values() for d in rw.digests})
    counts = _keyset_counts(plan)
    receipt = {
        "format": RECEIPT_SCHEMA,
        "forget_id": forget_id,
        "created_at": utc_now(),
        "reason": options.reason,
        "commit": state.seq + 1,
        "selection": _selection_doc(options, plan, salt),
        "salt": salt,
        "digest": DIGEST_RULE,
        "versions": [v.to_json() for v in versions],
        "keysets": [
            {
                "name": k.name,
                "old": k.version_hash,
                "new": successors[k.version_hash].hash,
                "removed": counts.get(k.name, 0),
            }
            for k in plan.keysets
            if k.version_hash in successors
        ],
        "payload_digests": digests,
        "shards_rewritten": len(rewrites),
        "superseded": superseded,
        "not_reached": list(UNREACHABLE),
    }
    rkey = receipt_key(forget_id)
    detail = {
        "forget": forget_id,
        "reason": options.reason,
        "receipt": rkey,
        "redacted": [[v.tag, v.old, v.new] for v in versions],
    }

    def commit(current: RootState) -> RootState:
        # The receipt names the commit that will record it (written first: a kill in between
        # leaves a receipt no commit names, which never counts).
        receipt["commit"] = current.seq + 1
        store.write(rkey, canonical_json(receipt))
        new_versions = {
            tag: (successors[h].hash if h in successors else h)
            for tag, h in current.versions.items()
        }
        new = RootState(current.seq + 1, new_versions, current.retired, current.latest)
        return commit_state(store, current, new, "forget", detail)

    try:
        # Waits for a gc holding the root, and goes again after gc's own commits.
        commit_beside_gc(store, state, commit, what="nothing was forgotten by this run")
    except ObjectsGoneError:
        raise
    except ConflictError:
        return None  # another writer committed: plan again on top of it
    deleted = _complete(store, receipt)
    return ForgetReport(
        forget_id=forget_id,
        dry_run=False,
        reason=options.reason,
        keys=len(plan.forgotten),
        unmatched=plan.unmatched,
        versions=versions,
        keysets=counts,
        shards_rewritten=len(rewrites),
        bytes_to_rewrite=sum(r.read_bytes for r in rewrites.values()),
        bytes_written=written,
        deleted=deleted,
        receipt=rkey,
    )


def _selection_doc(options: ForgetOptions, plan: _Plan, salt: str) -> dict[str, Any]:
    """The selection as the receipt records it: the SQL as given (it must hold no personal
    data), keys only as salted digests."""
    mode = "where" if options.where is not None else "key_file" if options.key_file else "keys"
    return {
        "mode": mode,
        "where": options.where,
        "keys_found": len(plan.forgotten),
        "keys_unmatched": len(plan.unmatched),
        "key_digests": sorted(salted(salt, k) for k in plan.forgotten),
        "unmatched_digests": sorted(salted(salt, k) for k in plan.unmatched),
    }


# --- after the commit: keysets, deletes; and a rerun's completion ---------------------------


def _complete(store: Store, receipt: Mapping[str, Any]) -> list[str]:
    """Rewrite keysets bound to a version the receipt redacted, delete its superseded
    objects, then mark it complete. Idempotent: a rerun after a kill repeats what is left."""
    salt = str(receipt["salt"])
    gone = set(receipt["selection"]["key_digests"])
    successor = {str(v["old"]): (str(v["tag"]), str(v["new"])) for v in receipt["versions"]}
    for keyset in list_keysets(store):
        if keyset.version_hash not in successor:
            continue
        tag, new_hash = successor[keyset.version_hash]
        version = load_version_by_hash(store, tag, new_hash)
        drop = {k for k in keyset.keys if salted(salt, k) in gone}
        redact_keyset(store, keyset, version, drop)
    # A kill between a keyset's rewrite and its index refresh leaves index.json behind.
    reindex_keysets(store)
    deleted = []
    for key in receipt["superseded"]:
        store.delete(key)  # a missing key is not an error
        deleted.append(key)
    if not receipt.get("completed_at"):
        store.write(
            receipt_key(str(receipt["forget_id"])),
            canonical_json({**receipt, "completed_at": utc_now()}),
        )
    return deleted


def complete_pending(store: Store) -> list[str]:
    """Finish every committed forget a kill left incomplete (its receipt not marked complete);
    the forget ids finished."""
    done = []
    for receipt in committed_receipts(store):
        if not receipt.get("completed_at"):
            _complete(store, receipt)
            done.append(str(receipt["forget_id"]))
    return done


# --- forget --check --------------------------------------------------------------------------


@dataclass
class ForgetCheckReport:
    """What ``forget --check`` found: ``ok`` when no object under the root holds a forgotten
    key or payload, no superseded object is left, and no keyset is bound to a redacted
    version."""

    forgets: list[str]
    objects: int
    bytes_read: int
    offending: list[str]
    incomplete: list[str]

    @property
    def ok(self) -> bool:
        return not self.offending and not self.incomplete

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "forgets": self.forgets,
            "objects": self.objects,
            "bytes_read": self.bytes_read,
            "offending": self.offending,
            "incomplete": self.incomplete,
        }

    def summary(self) -> str:
        if not self.forgets:
            return "no committed forget in this root; nothing to check"
        lines = [f"{o}" for o in self.offending]
        lines += [f"forget {f} is not complete (re-run shardlake forget)" for f in self.incomplete]
        verdict = "OK" if self.ok else "FAILED"
        lines.append(
            f"{verdict}: {len(self.forgets)} forget(s), {plural(self.objects, 'object')} "
            f"({plural(self.bytes_read, 'byte')}) re-read, {len(self.offending)} offending"
        )
        return "\n".join(lines)


class _Matcher:
    """Salted digests of each receipt: does a key or payload match any of them?"""

    def __init__(self, receipts: Sequence[Mapping[str, Any]]) -> None:
        self.sets = [
            (
                str(r["forget_id"]),
                hashlib.sha256(bytes.fromhex(str(r["salt"]))),
                set(r["selection"]["key_digests"]),
                set(r["payload_digests"]),
            )
            for r in receipts
        ]

    def _hits(self, data: bytes | memoryview, which: int) -> list[str]:
        out = []
        for fid, prefix, keys, payloads in self.sets:
            h = prefix.copy()
            h.update(data)
            if h.hexdigest() in (keys if which == 0 else payloads):
                out.append(fid)
        return out

    def key(self, key: str) -> list[str]:
        return self._hits(key.encode(), 0)

    def payload(self, raw: bytes) -> list[str]:
        return self._hits(raw, 1)


def _keys_of_parquet(data: bytes) -> list[str]:
    import pyarrow.parquet as pq

    table = pq.ParquetFile(pa.BufferReader(data)).read(columns=["key"], use_threads=False)
    return [k for k in table.column("key").to_pylist() if k is not None]


def check_forget(store: Store, forget_id: str | None = None) -> ForgetCheckReport:
    """Re-read every object under the root: no manifest, catalog segment or keyset lists a
    forgotten key, and no shard member (decompressed) carries a forgotten payload or key;
    every superseded object is gone. ``forget_id``: only that forget's receipt."""
    if forget_id is not None:
        if forget_id not in list_receipt_ids(store):
            raise NotFoundError(f"{store.url}: no forget receipt {forget_id!r}")
        receipts = [r for r in committed_receipts(store) if r["forget_id"] == forget_id]
        if not receipts:
            raise NotFoundError(f"{store.url}: forget {forget_id} never committed")
    else:
        require_root(store, read_state(store))
        receipts = committed_receipts(store)
    report = ForgetCheckReport([str(r["forget_id"]) for r in receipts], 0, 0, [], [])
    if not receipts:
        return report
    match = _Matcher(receipts)
    decoder = Decoder()
    superseded = {k: str(r["forget_id"]) for r in receipts for k in r["superseded"]}
    report.incomplete = [str(r["forget_id"]) for r in receipts if not r.get("completed_at")]
    for key in sorted(store.list("")):
        if key in superseded:
            report.offending.append(f"{key}: superseded by forget {superseded[key]}, still there")
        try:
            data = store.read(key)
        except KeyNotFoundError:
            continue
        report.objects += 1
        report.bytes_read += len(data)
        report.offending.extend(_check_object(store, key, data, match, decoder))
    redacted = {str(v["old"]): str(r["forget_id"]) for r in receipts for v in r["versions"]}
    for keyset in list_keysets(store):
        if keyset.version_hash in redacted:
            report.offending.append(
                f"keysets/{keyset.name}.parquet: bound to version {keyset.version_hash}, "
                f"redacted by forget {redacted[keyset.version_hash]}"
            )
    return report


def _check_object(
    store: Store, key: str, data: bytes, match: _Matcher, decoder: Decoder
) -> list[str]:
    where = store.key_url(key)
    out = []
    if key.endswith(".tar"):
        view = memoryview(data)
        try:
            members = list(iter_members(data, where))
        except FormatError as exc:
            return [f"{key}: unreadable tar ({exc}); cannot prove it holds no forgotten payload"]
        for m in members:
            payload = view[m.offset : m.offset + m.size]
            name = m.name[: -len(MEMBER_SUFFIX)] if m.name.endswith(MEMBER_SUFFIX) else m.name
            for fid in match.key(unescape_member_key(name)):
                out.append(f"{key}: member {m.name!r} is a key forgotten by {fid}")
            try:
                raw = decoder.decompress(payload, where)
            except Exception:  # noqa: BLE001 - not a zstd member: compare its bytes as they are
                raw = bytes(payload)
            for fid in match.payload(raw):
                out.append(f"{key}: member {m.name!r} carries a payload forgotten by {fid}")
        return out
    if key.endswith(".parquet"):
        try:
            keys = _keys_of_parquet(data)
        except (pa.ArrowException, OSError, KeyError):
            keys = []  # no key column (a partitions table)
        hits = {fid for k in keys for fid in match.key(k)}
        for fid in sorted(hits):
            out.append(f"{key}: lists a key forgotten by {fid}")
        return out
    return out
