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

import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..errors import (
    SHOW_MAX,
    ConflictError,
    ObjectsGoneError,
    SelectionError,
)
from ..executors.tasks import Task, executor_for, run_tasks
from ..format.documents import PartitionEntry
from ..format.layout import DATA_DIR, receipt_key
from ..meta.catalog import load_catalog, publish_catalog
from ..meta.commits import commit_state, read_state
from ..meta.gcwait import commit_beside_gc
from ..meta.keysets import list_keysets, redact_keyset, reindex_keysets
from ..meta.leases import Lease
from ..meta.publish import VersionBody, build_version_doc, store_version_doc
from ..meta.rootmarker import require_root
from ..meta.state import RootState, canonical_json, utc_now
from ..meta.versions import StoredVersion, load_version_by_hash
from ..progress.bar import Progress, plural
from ..read.receipts import RECEIPT_SCHEMA, committed_receipts
from ..store import Store
from .common import version_closure
from .forget_plan import UNREACHABLE, ForgetOptions, _check_options, _Plan, _plan
from .forget_shards import (
    DIGEST_RULE,
    ShardRewrite,
    _new_data_rev,
    _redacted_entry,
    rewrite_shard,
    salted,
)

__all__ = ["ForgetReport", "forget"]


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
    body = VersionBody.successor(
        old.header_doc,
        tag=old.tag,
        base=old.header_doc.get("base"),
        partitions=parts,
        redacted={"forget": forget_id, "from": old.hash},
    )
    data = build_version_doc(body, parts, catalog)
    new_hash, key = store_version_doc(store, old.tag, data)
    version = StoredVersion.parse(old.tag, new_hash, data, store.key_url(key), store)
    return version, removed, rewritten, written + len(data)


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
        results, failures = run_tasks(tasks, spec, options.worker_count(), bar)
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
