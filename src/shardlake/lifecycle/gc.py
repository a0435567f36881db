"""``gc``: delete every object that no live version and no keyset references.

Garbage is an object whose name has one of the shapes shardlake writes under ``data/``,
``versions/`` and ``catalog/`` (:func:`~shardlake.format.layout.is_owned_key`) and that lies
outside the closure of the live versions (and of versions a keyset is bound to, pruned or not),
plus staging left by killed writers (local ``.shardlake-tmp-*`` files, unfinished S3 multipart
uploads; see :meth:`Store.leftovers`). The root marker, the commit log, keysets and the
capability-probe area, forget receipts and writers' lease records (lapsed ones excepted) are
never touched. Every other object under the root is *foreign*: it is counted and shown, never
deleted, at any grace.

Safety against concurrent writers (the commit log is the only lock there is):

* Every writer holds a lease (``leases/<id>.json``, :mod:`shardlake.meta.leases`) naming the
  prefixes it writes; gc lists the root, then reads the leases, and keeps everything a live
  lease covers at any grace (read again after its lock commit and every
  :data:`LEASE_REFRESH_S` while it deletes). Lapsed lease records are deleted.
* Objects modified within the grace period (default 6 h) are kept too: what an aborted pack
  left, which its re-run would reuse.
* A gc that finds nothing to delete commits nothing.
* gc brackets its deletions with two commits: a *lock* (``op: gc-lock``, state unchanged plus
  ``gc_lock``, ``grace_s``) and an *unlock*. ``publish_version`` refuses to publish while the
  lock is held (publishers wait for it, :mod:`shardlake.meta.gcwait`), and a writer that read
  the root state before the unlock retries its commit on the new state. So a writer that
  reused an old unreferenced revision (pack's "revision already complete" path) can never
  publish a version referencing what gc deleted.
  The lock is a short lease (``id``, ``owner``, ``expires_at``, :data:`LOCK_TTL_S`) that the
  holder renews every :data:`LOCK_RENEW_S` while it deletes (a ``gc-renew`` commit carrying the
  same id, later expiry), so a killed gc's lease lapses within a minute; a lock whose owner ran
  on this host and whose process is gone is taken over at once, with a note. A gc never
  deletes after its lease is about to expire (renewal failed: it stops, reports
  ``incomplete``, and the next run continues). A lost reply
  on the lock commit is settled by reading the commit back (its id is unique), and an operator
  who knows the holder is dead releases it at once with :func:`break_lock`
  (``shardlake gc --break-lock``).
* ``publish_version`` also checks that every object the new version references exists, so a
  writer that reused a revision before gc deleted it is refused, not published with holes.
* Each object is stat'ed again right before it is deleted and kept if it changed since the
  listing (a writer re-created the same deterministic key, e.g. rebuilt a revision).
* Afterwards gc re-reads the commit log and names any version committed meanwhile that
  references a deleted object (possible only after an expired lock) as an IntegrityError.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConflictError, FormatError, IntegrityError, KeyNotFoundError, UsageError
from ..format.documents import GcLock, LeaseRecord
from ..format.layout import (
    COMMITS_DIR,
    KEYSETS_DIR,
    LEASES_DIR,
    PROBE_DIR,
    RECEIPTS_DIR,
    ROOT_INDEX,
    ROOT_MARKER,
    is_owned_key,
    lease_key,
)
from ..meta.commits import commit_state, read_commit, read_state
from ..meta.gcwait import GcWait
from ..meta.keysets import list_keysets, referenced_versions
from ..meta.leases import LeaseSet, owner_name, parse_duration, read_leases
from ..meta.rootmarker import require_root
from ..meta.state import RootState, lock_holder_gone, takeover_note
from ..meta.versions import load_version_by_hash
from ..options import options_class
from ..progress.bar import Progress, plural
from ..store import Leftover, ObjectInfo, Store
from ..store.keys import TEMP_PREFIX
from .common import version_closure

__all__ = [
    "GcOptions",
    "GcReport",
    "break_lock",
    "collect_garbage",
    "new_lock",
    "parse_duration",
]

DEFAULT_GRACE_S = 6 * 3600.0
# The lease: a crashed gc's lock stops blocking publishes this long after its last renewal.
LOCK_TTL_S = 60.0
LOCK_RENEW_S = 20.0  # the holder renews this often while it works
LOCK_MARGIN_S = 15.0  # no deletion this close to the lease's expiry
# Forget receipts are the root's history, like the commit log: never garbage. Lease records are
# removed only once lapsed (_drop_lapsed).
_KEEP_PREFIXES = (
    COMMITS_DIR + "/",
    KEYSETS_DIR + "/",
    PROBE_DIR + "/",
    RECEIPTS_DIR + "/",
    LEASES_DIR + "/",
)
FENCE_ATTEMPTS = 5
FOREIGN_EXAMPLES = 5
# While deleting, gc re-reads the writers' leases this often (a writer that started since).
LEASE_REFRESH_S = 2.0
# Staging of the root's own records (commits, index, leases, keysets) is kept at least this long.
PROTECTED_STAGING_S = 3600.0


@options_class
@dataclass(frozen=True)
class GcOptions:
    """How ``gc`` runs.

    Parameters
    ----------
    grace_s
        Keep unreferenced objects younger than this: seconds, or a duration such as ``"6h"``,
        ``"30m"``, ``"2d"``.
    dry_run
        Only list what would be deleted.
    progress
        Show deletions on standard error (``None``: only on a terminal).
    """

    grace_s: float | str = DEFAULT_GRACE_S
    dry_run: bool = False
    progress: bool | None = None

    @property
    def grace_seconds(self) -> float:
        grace = parse_duration(self.grace_s) if isinstance(self.grace_s, str) else self.grace_s
        if grace < 0:
            raise UsageError("the grace period cannot be negative", options=("grace_s",))
        return float(grace)


@dataclass
class GcReport:
    dry_run: bool
    grace_s: float
    live_versions: list[str] = field(default_factory=list)
    referenced: int = 0
    garbage: list[ObjectInfo] = field(default_factory=list)  # deleted (or would be)
    young: list[ObjectInfo] = field(default_factory=list)  # unreferenced but within grace
    # staging of killed writers (local temp files, unfinished multipart uploads) removed
    leftovers: list[Leftover] = field(default_factory=list)
    young_leftovers: list[Leftover] = field(default_factory=list)  # within grace: kept
    incomplete: bool = False  # stopped before its lock expired; run gc again
    # objects shardlake did not write (names outside docs/format.md's shapes): never deleted
    foreign: list[ObjectInfo] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. a dead holder's lock taken over
    # writers' leases: live ones keep what they cover at any grace; lapsed records are removed
    leases: list[LeaseRecord] = field(default_factory=list)
    leased: list[ObjectInfo] = field(default_factory=list)  # unreferenced, kept for a lease
    leased_leftovers: list[Leftover] = field(default_factory=list)  # staging of live writers
    lapsed_leases: list[LeaseRecord] = field(default_factory=list)  # removed (or would be)

    @property
    def garbage_bytes(self) -> int:
        return sum(o.size for o in self.garbage)

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "grace_s": self.grace_s,
            "live_versions": self.live_versions,
            "referenced": self.referenced,
            "deleted" if not self.dry_run else "would_delete": [
                {"key": o.key, "size": o.size} for o in self.garbage
            ],
            "count": len(self.garbage),
            "bytes": self.garbage_bytes,
            "kept_young": len(self.young),
            "kept_young_bytes": sum(o.size for o in self.young),
            "leftovers": [item.path for item in self.leftovers],
            "kept_young_leftovers": len(self.young_leftovers),
            "incomplete": self.incomplete,
            "foreign": len(self.foreign),
            "foreign_examples": [o.key for o in self.foreign[:FOREIGN_EXAMPLES]],
            "notes": self.notes,
            "leases": [record.to_json() for record in self.leases],
            "kept_leased": len(self.leased),
            "kept_leased_bytes": sum(o.size for o in self.leased),
            "kept_leased_leftovers": len(self.leased_leftovers),
            "lapsed_leases": [record.id for record in self.lapsed_leases],
        }


def _references(store: Store, state: RootState) -> tuple[set[str], list[str]]:
    """Keys referenced by live versions and by versions keysets are bound to."""
    wanted = dict(state.versions)
    live = [f"{t}@{h}" for t, h in wanted.items()]
    # Keysets pin their version even after prune-version; an unreadable keyset stops gc.
    for tag, version_hash in sorted(referenced_versions(list_keysets(store))):
        if wanted.get(tag) != version_hash:
            wanted.setdefault(f"{tag}\0{version_hash}", version_hash)
            live.append(f"{tag}@{version_hash} (keyset)")
    refs: set[str] = set()
    for label, version_hash in wanted.items():
        tag = label.split("\0", 1)[0]
        refs.update(version_closure(store, load_version_by_hash(store, tag, version_hash)))
    return refs, live


def _owned_leftover(store: Store, leftover: Leftover) -> bool:
    """A local temp file is shardlake's by its name; an unfinished upload only if its key is one
    shardlake writes (another team's upload under a bucket-top root is foreign)."""
    if leftover.upload_id is None:
        return True
    prefix = store.root.rstrip("/") + "/"
    key = leftover.path[len(prefix) :] if leftover.path.startswith(prefix) else leftover.path
    return is_owned_key(key)


def _is_protected(key: str) -> bool:
    return key in (ROOT_MARKER, ROOT_INDEX) or key.startswith(_KEEP_PREFIXES)


def _delete_order(info: ObjectInfo) -> tuple[int, str]:
    # Manifests and version documents first: without them nothing reuses the shards.
    name = info.key.rsplit("/", 1)[-1]
    first = name.startswith("manifest-") or info.key.startswith("versions/")
    return (0 if first else 1, info.key)


@dataclass
class _Fenced:
    """A survey taken under a committed gc lock: what to delete, and the lease to do it under."""

    report: GcReport
    leftovers: list[Leftover]
    cutoff: float
    lock: GcLock
    locked: RootState


def collect_garbage(store: Store, options: GcOptions) -> GcReport:
    """Delete (or with ``dry_run`` only list) unreferenced objects older than the grace period
    (:class:`GcOptions`)."""
    grace_s, dry_run, progress = options.grace_seconds, options.dry_run, options.progress
    store.require_writable("gc")
    fenced = _survey_under_lock(store, grace_s, dry_run)
    if isinstance(fenced, GcReport):
        return fenced  # a dry run, or nothing to delete
    report = fenced.report
    renewer = _Renewer(store, fenced.lock)
    try:
        deleted = _delete_garbage(store, fenced, progress, renewer)
    finally:
        renewer.stop()
        _unlock(store, renewer.lock)
    report.garbage = [info for info in report.garbage if info.key in deleted]
    _check_after(store, fenced.locked, deleted)
    return report


def _survey(
    store: Store, state: RootState, grace_s: float, dry_run: bool
) -> tuple[GcReport, list[Leftover], float]:
    """Sort every unreferenced object of ``state`` into garbage and young (within grace)."""
    refs, live = _references(store, state)
    cutoff = time.time() - grace_s
    report = GcReport(dry_run, grace_s, live, len(refs))
    for info in store.list_info(""):
        if not is_owned_key(info.key):
            report.foreign.append(info)
            continue
        if _is_protected(info.key) or info.key in refs:
            continue
        # Unknown mtime counts as young unless there is no grace at all.
        if (info.mtime is None and grace_s > 0) or (
            info.mtime is not None and info.mtime >= cutoff
        ):
            report.young.append(info)
        else:
            report.garbage.append(info)
    # Every leftover with a start time, so that those the grace keeps are counted too.
    found = [item for item in store.leftovers(older_than=math.inf) if _owned_leftover(store, item)]
    leftovers = [item for item in found if _staging_old(store, item, cutoff)]
    report.young_leftovers = [item for item in found if item not in leftovers]
    # Leases are read after the listings: a writer adds a prefix to its lease before it writes
    # under it, so every object listed above that a writer still needs is covered here.
    leases = LeaseSet.read(store)
    report.leases, report.lapsed_leases = leases.live, leases.lapsed
    leftovers = _keep_leased(store, report, leftovers, leases)
    return report, leftovers, cutoff


def _leftover_key(store: Store, leftover: Leftover) -> str:
    prefix = store.root.rstrip("/") + "/"
    return leftover.path[len(prefix) :] if leftover.path.startswith(prefix) else leftover.path


def _staging_target(store: Store, leftover: Leftover) -> str:
    """The key a leftover was to become (a local temp file is ``.shardlake-tmp-<hex>-<name>``
    beside its key)."""
    key = _leftover_key(store, leftover)
    head, _, name = key.rpartition("/")
    if leftover.upload_id is None and name.startswith(TEMP_PREFIX):
        name = name[len(TEMP_PREFIX) :].partition("-")[2]
    return f"{head}/{name}" if head else name


def _staging_old(store: Store, leftover: Leftover, cutoff: float) -> bool:
    """Whether a leftover is older than the grace. Staging of a name gc never collects (a
    commit, the index, a lease record, a keyset) is in flight at any grace unless it is older
    than :data:`PROTECTED_STAGING_S`: only a killed writer leaves it that long."""
    if leftover.started is None:
        return False
    if _is_protected(_staging_target(store, leftover)):
        cutoff = min(cutoff, time.time() - PROTECTED_STAGING_S)
    return leftover.started < cutoff


def _keep_leased(
    store: Store, report: GcReport, leftovers: list[Leftover], leases: LeaseSet
) -> list[Leftover]:
    """Move what a live lease covers from the garbage to ``report.leased``; the leftovers no
    live lease covers (a writer's in-flight staging is its own)."""
    garbage: list[ObjectInfo] = []
    for info in report.garbage:
        (report.leased if leases.holder(info.key) else garbage).append(info)
    report.garbage = garbage
    free: list[Leftover] = []
    for item in leftovers:
        (report.leased_leftovers if leases.holder(_leftover_key(store, item)) else free).append(
            item
        )
    return free


def _drop_lapsed(store: Store, report: GcReport) -> None:
    """Remove lapsed lease records (read again first: a late renewal keeps its record)."""
    if not report.lapsed_leases:
        return
    now = {record.id: record for record in read_leases(store)}
    removed = []
    for record in report.lapsed_leases:
        current = now.get(record.id)
        if current is None or current.live(time.time()):
            continue
        store.delete(lease_key(record.id))
        removed.append(record)
    report.lapsed_leases = removed


def _survey_under_lock(store: Store, grace_s: float, dry_run: bool) -> _Fenced | GcReport:
    """Survey, then commit a gc lock on the surveyed state (re-surveying if a writer committed
    meanwhile); the bare report when there is nothing to delete or this is a dry run. A gc that
    deletes nothing commits nothing; one that finds another gc holding the root waits for it."""
    gc_wait = GcWait(store)
    attempts = 0
    while True:
        state = read_state(store)
        require_root(store, state)  # a mistyped root is not an empty one
        report, leftovers, cutoff = _survey(store, state, grace_s, dry_run)
        if dry_run:
            report.leftovers = leftovers
            return report
        _drop_lapsed(store, report)  # records only: no lock needed
        if not report.garbage and not leftovers:
            return report
        if state.gc_locked():
            gc_wait.until_free(state, what="this gc deleted nothing; re-run it later")
            continue
        held = state.gc_lock
        if held is not None and held.expires_at > time.time() and lock_holder_gone(held):
            report.notes.append(takeover_note(held))
        store.ensure_create_enforced()
        lock = new_lock()
        locked = RootState(state.seq + 1, dict(state.versions), state.retired, state.latest, lock)
        if _take_lock(store, state, locked, grace_s):
            # Leases taken between the survey and the lock: their writers' reuse is kept too.
            leftovers = _keep_leased(store, report, leftovers, LeaseSet.read(store))
            return _Fenced(report, leftovers, cutoff, lock, locked)
        attempts += 1
        if attempts >= FENCE_ATTEMPTS:
            raise ConflictError(
                f"{store.url}: the commit log kept moving ({plural(FENCE_ATTEMPTS, 'attempt')}); re-run "
                "gc later"
            )


class _Renewer:
    """Renews the gc lease every :data:`LOCK_RENEW_S` in a background thread while gc works;
    ``lock`` is the lease in force. A lease lost to a takeover is never renewed again."""

    def __init__(self, store: Store, lock: GcLock) -> None:
        self.store, self.lock, self.lost = store, lock, False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shardlake-gc-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(LOCK_RENEW_S):
            try:
                renewed = _renew(self.store, self.lock)
            except Exception:  # noqa: BLE001 - retried next round; deletions stop at expiry
                continue
            if renewed is None:
                self.lost = True
                return
            self.lock = renewed

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def expiring(self) -> bool:
        return self.lost or time.time() > self.lock.expires_at - LOCK_MARGIN_S


def _renew(store: Store, lock: GcLock) -> GcLock | None:
    """Commit ``lock`` with a fresh expiry; None if the root no longer holds it."""
    for _attempt in range(FENCE_ATTEMPTS):
        current = read_state(store)
        if current.gc_lock is None or current.gc_lock.id != lock.id:
            return None
        renewed = GcLock(id=lock.id, expires_at=time.time() + LOCK_TTL_S, owner=lock.owner)
        new = RootState(current.seq + 1, current.versions, current.retired, current.latest, renewed)
        try:
            commit_state(store, current, new, "gc-renew", {})
            return renewed
        except ConflictError:
            if _take_lock_settled(store, new):
                return renewed
    return lock  # the log kept moving: the current lease stands, try again next round


def _delete_garbage(
    store: Store, fenced: _Fenced, progress: bool | None, renewer: _Renewer
) -> set[str]:
    """Delete the surveyed garbage while the lease holds; the keys deleted."""
    report = fenced.report
    deleted: set[str] = set()
    bar = Progress(len(report.garbage), "gc", unit="objects", enabled=progress)
    leases, read_at = LeaseSet.read(store), time.monotonic()
    try:
        for info in sorted(report.garbage, key=_delete_order):
            bar.update()
            if renewer.expiring():
                report.incomplete = True  # never delete without a valid lock; re-run gc
                break
            if not is_owned_key(info.key):  # never, whatever a caller put in the list
                continue
            if time.monotonic() - read_at > LEASE_REFRESH_S:
                leases, read_at = LeaseSet.read(store), time.monotonic()
            if leases.holder(info.key) is not None:  # a writer that started since the survey
                report.leased.append(info)
                continue
            # Re-stat right before deleting: a writer may have re-created the same deterministic
            # key (a revision rebuilt from scratch) since the listing.
            try:
                now = store.stat(info.key)
            except KeyNotFoundError:
                continue
            rewritten = now.size != info.size or now.mtime != info.mtime
            if rewritten or (now.mtime is not None and now.mtime >= fenced.cutoff):
                report.young.append(now)
                continue
            store.delete(info.key)
            deleted.add(info.key)
        leases = LeaseSet.read(store)
        for leftover in fenced.leftovers:
            if leases.holder(_leftover_key(store, leftover)) is not None:
                report.leased_leftovers.append(leftover)
                continue
            store.discard_leftover(leftover)
            report.leftovers.append(leftover)
    finally:
        bar.close()
    return deleted


def new_lock(ttl_s: float = LOCK_TTL_S) -> GcLock:
    """A fresh lease: a unique id, who holds it (for operators) and when it expires."""
    return GcLock(id=uuid.uuid4().hex, expires_at=time.time() + ttl_s, owner=owner_name())


def _take_lock(store: Store, state: RootState, locked: RootState, grace_s: float) -> bool:
    """Commit the lock; False if another writer committed first.

    A create whose reply was lost is settled by reading back what is at the lock's commit: the
    lock id is unique, so finding ours there means we hold it (never refuse ourselves).
    """
    try:
        # The grace is recorded: a writer whose objects are gone names it (meta.leases).
        commit_state(store, state, locked, "gc-lock", {"grace_s": grace_s})
        return True
    except ConflictError:
        return _take_lock_settled(store, locked)


def _take_lock_settled(store: Store, locked: RootState) -> bool:
    """Whether the commit at ``locked.seq`` is ours after all (a create whose reply was lost)."""
    try:
        there = read_commit(store, locked.seq)
    except (KeyNotFoundError, FormatError):
        return False
    mine = None if locked.gc_lock is None else locked.gc_lock
    return there.gc_lock is not None and there.gc_lock == mine


def break_lock(store: Store) -> RootState:
    """Release whatever gc lock the root holds (the operator's last resort).

    Only for a gc that is known to be dead: a live gc keeps deleting until its own lease runs
    out. Returns the state that held the lock; :class:`UsageError` if none is held.
    """
    for _attempt in range(FENCE_ATTEMPTS):
        state = read_state(store)
        if state.gc_lock is None:
            raise UsageError(f"{store.url}: no gc lock is held")
        new = RootState(state.seq + 1, state.versions, state.retired, state.latest)
        try:
            commit_state(store, state, new, "gc-break-lock", {"broken": state.gc_lock.to_json()})
            return state
        except ConflictError:
            continue
    raise ConflictError(f"{store.url}: the commit log kept moving; break the gc lock again")


def _unlock(store: Store, lock: GcLock) -> None:
    """Commit the state without ``lock`` (keeping whatever others committed meanwhile)."""
    for _attempt in range(FENCE_ATTEMPTS * 4):
        current = read_state(store)
        if current.gc_lock is None or current.gc_lock.id != lock.id:
            return  # taken over after expiry, or already released
        new = RootState(current.seq + 1, current.versions, current.retired, current.latest)
        try:
            commit_state(store, current, new, "gc-unlock", {})
            return
        except ConflictError:
            continue
    raise ConflictError(f"{store.url}: could not release the gc lock; it expires by itself")


def _check_after(store: Store, fence: RootState, deleted: set[str]) -> None:
    """Name any version committed during gc that references an object gc deleted."""
    now = read_state(store)
    if now.seq == fence.seq:
        return
    for tag, version_hash in now.versions.items():
        if fence.versions.get(tag) == version_hash:
            continue
        lost = sorted(
            set(version_closure(store, load_version_by_hash(store, tag, version_hash))) & deleted
        )
        if lost:
            raise IntegrityError(
                f"{store.url}: version {tag!r} was published while gc ran and references "
                f"{plural(len(lost), 'object')} gc deleted (e.g. {lost[0]}); prune it and re-run its pack"
            )
