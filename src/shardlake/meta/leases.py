"""Writer leases: what a running writer tells gc to keep (``leases/<id>.json``, docs/format.md).

A writer (pack, ``Root.writer``, ``write_bag``, import-wds, export, remove, forget) creates its
lease with create-if-absent before it writes anything, naming the key prefixes it writes
(``data/<pid>/``, ``versions/<tag>/``, ``catalog/``); it renews the record in the background
every ``ttl / 4`` (an overwrite of its own record, a later ``expires_at``) and deletes it when
it ends, on failure too. gc keeps every object a live lease covers, whatever its grace; a lease
that is not renewed (a killed writer) lapses after its ``ttl`` and its writer's leftovers are
ordinary garbage again. Coverage only grows: a writer adds a prefix (one synchronous record
write) before its first object under it, and gc lists objects before it reads the leases, so an
object gc sees was written under a lease gc sees too.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from types import TracebackType

from ..errors import FormatError, KeyNotFoundError, ObjectsGoneError, UsageError
from ..format.documents import LeaseRecord
from ..format.layout import DATA_DIR, LEASES_DIR, commit_key, is_owned_key, lease_key
from ..progress.bar import plural
from ..store import Store
from .commits import read_state

__all__ = [
    "DEFAULT_LEASE_TTL_S",
    "LEASE_TTL_ENV",
    "Lease",
    "LeaseSet",
    "MAX_COVERS",
    "gone_error",
    "lease_ttl",
    "owner_name",
    "parse_duration",
    "read_leases",
]

log = logging.getLogger("shardlake.lease")

# A killed writer's objects stay protected this long after its last renewal; renewed every
# quarter of it, so gc's clock may run ahead of the writer's by up to 3/4 of it.
DEFAULT_LEASE_TTL_S = 600.0
LEASE_TTL_ENV = "SHARDLAKE_LEASE_TTL"
RENEW_FRACTION = 4
# Above this many data prefixes a lease covers all of data/ (the record stays small).
MAX_COVERS = 512

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``90``/``90s``, ``30m``, ``6h``, ``2d`` -> seconds."""
    match = _DURATION_RE.match(str(text))
    if not match:
        raise UsageError(f"invalid duration {text!r}: use e.g. 90s, 30m, 6h or 2d")
    return float(match.group(1)) * _UNITS[match.group(2)]


def lease_ttl() -> float:
    """The lease duration: ``SHARDLAKE_LEASE_TTL`` (e.g. ``90s``, ``10m``), else 10 minutes."""
    text = os.environ.get(LEASE_TTL_ENV, "").strip()
    if not text:
        return DEFAULT_LEASE_TTL_S
    ttl = parse_duration(text)
    if ttl <= 0:
        raise UsageError(f"{LEASE_TTL_ENV}={text!r}: a lease must last more than 0 seconds")
    return ttl


def owner_name() -> str:
    """``user@host pid N``: who holds a lease or gc's lock, for operators."""
    return f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"


def _utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


def _merged(covers: Sequence[str], more: Iterable[str]) -> tuple[str, ...]:
    """``covers`` plus ``more`` (order kept, no repeats); too many data prefixes -> ``data/``."""
    out = list(dict.fromkeys([*covers, *more]))
    data = [c for c in out if c.startswith(DATA_DIR + "/")]
    if len(data) > MAX_COVERS or DATA_DIR + "/" in out:
        out = [DATA_DIR + "/"] + [c for c in out if not c.startswith(DATA_DIR + "/")]
    return tuple(out)


class Lease:
    """One writer's lease at a root, renewed in a background thread while it is held.

    ``with Lease(store, "pack", tag="v2", covers=[...]) as lease:`` creates the record (create-
    if-absent) and deletes it on the way out, whatever happened; :meth:`cover` adds prefixes.
    """

    def __init__(
        self,
        store: Store,
        op: str,
        *,
        tag: str | None = None,
        covers: Iterable[str] = (),
        ttl_s: float | None = None,
    ) -> None:
        self.store, self.op, self.tag = store, op, tag
        self.ttl_s = lease_ttl() if ttl_s is None else float(ttl_s)
        self.id = uuid.uuid4().hex
        self.key = lease_key(self.id)
        self.owner = owner_name()
        self.created_at = _utc(time.time()).replace("+00:00", "Z")
        self.covers = _merged((), covers)
        self.expires_at = 0.0
        self.lapsed_at: float | None = None  # set when a renewal came after the expiry
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def record(self) -> LeaseRecord:
        return LeaseRecord(
            id=self.id,
            owner=self.owner,
            op=self.op,
            created_at=self.created_at,
            expires_at=self.expires_at,
            ttl_s=self.ttl_s,
            covers=self.covers,
            tag=self.tag,
        )

    def _data(self) -> bytes:
        doc = self.record().to_json()  # canonical JSON (docs/format.md)
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    def start(self) -> Lease:
        """Create the record (create-if-absent: ids are unique) and start renewing it (once)."""
        if self._thread is not None:
            return self
        self.store.require_writable(f"{self.op} (its lease)")
        with self._lock:
            self.expires_at = time.time() + self.ttl_s
            self.store.create(self.key, self._data())
        self._thread = threading.Thread(target=self._run, name="shardlake-lease", daemon=True)
        self._thread.start()
        return self

    def _renew(self) -> None:
        """Write the record with a fresh expiry (the caller holds ``_lock``)."""
        now = time.time()
        if now >= self.expires_at and self.lapsed_at is None and self.expires_at:
            self.lapsed_at = self.expires_at
            log.warning("%s: %s lapsed before it was renewed", self.store.url, self.describe())
        previous, self.expires_at = self.expires_at, now + self.ttl_s
        try:
            self.store.write(self.key, self._data())
        except BaseException:
            self.expires_at = previous  # what the stored record still says
            raise

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / RENEW_FRACTION):
            try:
                with self._lock:
                    if self._stop.is_set():
                        return
                    self._renew()
            except Exception as exc:  # noqa: BLE001 - retried next round; lapses if it keeps failing
                log.warning("%s: renewing %s failed: %s", self.store.url, self.describe(), exc)

    def cover(self, more: Iterable[str]) -> None:
        """Add key prefixes; the record says so before this returns (write under them next)."""
        with self._lock:
            covers = _merged(self.covers, more)
            if covers == self.covers:
                return
            self.covers = covers
            if self._thread is not None:
                self._renew()

    def release(self) -> None:
        """Stop renewing and delete the record (a failed delete only logs: the lease lapses)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            try:
                self.store.delete(self.key)
            except Exception as exc:  # noqa: BLE001 - never hides the writer's own outcome
                log.warning("%s: removing %s failed (it lapses): %s", self.store.url, self.key, exc)

    def describe(self) -> str:
        return self.record().describe()

    def __enter__(self) -> Lease:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def read_leases(store: Store) -> list[LeaseRecord]:
    """Every lease record at the root, live or lapsed; an unreadable one stops the caller (gc
    cannot tell what it protects) with a :class:`FormatError` naming it."""
    out = []
    for key in store.list(LEASES_DIR):
        if not is_owned_key(key):
            continue  # not a name shardlake writes: foreign, ignored
        try:
            data = store.read(key)
        except KeyNotFoundError:
            continue  # released since the listing
        where = store.key_url(key)
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise FormatError(
                f"{where}: lease record is not valid JSON ({exc}); remove it once no writer runs"
            ) from exc
        record = LeaseRecord.from_json(doc, where)
        if lease_key(record.id) != key:
            raise FormatError(f"{where}: lease record names id {record.id!r}")
        out.append(record)
    return out


class LeaseSet:
    """The leases read at one moment, split into live and lapsed, with a key -> holder lookup."""

    def __init__(self, records: Iterable[LeaseRecord], now: float | None = None) -> None:
        now = time.time() if now is None else now
        records = list(records)
        self.live = [r for r in records if r.live(now)]
        self.lapsed = [r for r in records if not r.live(now)]
        self._by_cover: dict[str, LeaseRecord] = {}
        for record in self.live:
            for cover in record.covers:
                self._by_cover.setdefault(cover, record)

    @classmethod
    def read(cls, store: Store) -> LeaseSet:
        return cls(read_leases(store))

    def holder(self, key: str) -> LeaseRecord | None:
        """The live lease covering ``key`` (the key itself or a prefix ending in ``/``)."""
        found = self._by_cover.get(key)
        if found is not None:
            return found
        for i, ch in enumerate(key):
            if ch == "/":
                found = self._by_cover.get(key[: i + 1])
                if found is not None:
                    return found
        return None


def _gc_runs_since(store: Store, since_seq: int) -> list[str]:
    """``commit N: grace Xs, by OWNER`` for each gc that took the root after ``since_seq``."""
    runs: list[str] = []
    for seq in range(since_seq + 1, read_state(store).seq + 1):
        try:
            doc = json.loads(store.read(commit_key(seq)))
        except (KeyNotFoundError, ValueError):
            continue
        if doc.get("op") != "gc-lock":
            continue
        grace = doc.get("grace_s")
        grace_text = "grace unknown" if grace is None else f"grace {float(grace):g}s"
        owner = ((doc.get("state") or {}).get("gc_lock") or {}).get("owner") or "unknown owner"
        runs.append(f"commit {seq}: {grace_text}, by {owner}")
    return runs


def gone_error(
    store: Store,
    missing: Sequence[str],
    *,
    since_seq: int,
    lease: Lease | None,
    what: str = "nothing was published by this run - re-run it",
) -> ObjectsGoneError:
    """The error for objects a run wrote or reused that are gone: which gc removed them (its
    grace) and what the run's lease was, never a bare "no such key"."""
    try:
        runs = _gc_runs_since(store, since_seq)
    except Exception:  # noqa: BLE001 - the message must not fail
        runs = []
    if runs:
        who = f"gc removed them ({'; '.join(runs[-3:])})"
    else:
        who = f"no gc committed since this run began (commit {since_seq}): something else removed them"
    if lease is None:
        held = "this run held no lease over them"
    elif lease.lapsed_at is not None:
        held = (
            f"this run's {lease.describe()} lapsed at {_utc(lease.lapsed_at)} (not renewed in time)"
        )
    elif missing and LeaseSet([lease.record()]).holder(missing[0]) is not None:
        held = (
            f"this run's {lease.describe()} covered them: that gc did not honour leases (a "
            "release before them?)"
        )
    else:
        held = f"this run's {lease.describe()} covers {', '.join(lease.covers[:3]) or 'nothing'}"
    first = missing[0] if missing else "?"
    return ObjectsGoneError(
        f"{store.url}: {plural(len(missing), 'object')} this run wrote or reuses are gone (e.g. "
        f"{first}): {who}; {held}; {what}",
        missing=missing,
    )
