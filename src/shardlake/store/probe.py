"""The create-if-absent probe: a store must refuse a second create of one key and let exactly one
of several racing creates win before shardlake publishes there (:meth:`Store.ensure_create_enforced`).
A passing result is remembered in the root for :data:`PROBE_RECORD_TTL_S`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import AlreadyExistsError, CapabilityError, KeyNotFoundError, StoreError
from ..progress.bar import plural

if TYPE_CHECKING:
    from .core import Store

__all__ = [
    "PROBE_RECORD_KEY",
    "PROBE_RECORD_TTL_S",
    "ProbeCheck",
    "ProbeInconclusiveError",
    "check_create_race",
    "check_create_sequential",
    "prove_create_enforced",
    "run_create_checks",
]


PROBE_PREFIX = "_shardlake/probe"
PROBE_RECORD_KEY = "_shardlake/probe-record.json"
# How long a probe record vouches for a store (a server upgrade may change its behaviour).
PROBE_RECORD_TTL_S = 24 * 3600.0
PROBE_RACERS = 8
_ROOT_MARKER = "shardlake.json"  # the record is kept only in a dataset root (format layer's key)
_RECORD_FORMAT = "shardlake-probe-record"
CREATE_CHECKS = ("create-if-absent", "create-if-absent-race")


@dataclass(frozen=True)
class ProbeCheck:
    """The outcome of one named store check: ``ok`` and a detail for people."""

    name: str
    ok: bool
    detail: str


class ProbeInconclusiveError(StoreError):
    """A probe whose outcome could not be read back (transport errors or damaged replies that
    outlasted the re-reads): the store is not judged, the command fails with what happened."""


def _read_back(store: Store, key: str, expected: bytes) -> tuple[bool, str]:
    """``(equal, detail)``: whether ``key`` holds ``expected``. A transport error or bytes that
    differ are re-read (``retry.integrity_rereads``); only reads that agree with each other are a
    verdict, otherwise :class:`ProbeInconclusiveError` says what happened."""
    seen: list[bytes] = []
    last = ""
    for _ in range(1 + store.retry.integrity_rereads):
        try:
            data = store.read(key)
        except KeyNotFoundError:
            return False, "the key vanished after the create"
        except StoreError as exc:
            last = f"read-back failed: {exc}"
            continue
        if data == expected:
            return True, "read-back matches"
        seen.append(data)
        last = f"read-back differs (sha256 {hashlib.sha256(data).hexdigest()[:12]})"
    if len(seen) >= 2 and all(d == seen[0] for d in seen):
        return False, f"{last} on {len(seen)} agreeing reads"
    raise ProbeInconclusiveError(
        f"{store.key_url(key)}: create-if-absent probe inconclusive - {last} "
        f"({plural(1 + store.retry.integrity_rereads, 'read')}); the store was not judged, try again"
    )


def check_create_sequential(store: Store, key: str) -> ProbeCheck:
    """Create ``key``, create it again with other bytes: the second must be refused and the
    first bytes kept."""
    name = "create-if-absent"
    store.create(key, b"first")
    try:
        store.create(key, b"second")
    except AlreadyExistsError:
        ok, detail = _read_back(store, key, b"first")
        if ok:
            return ProbeCheck(name, True, "a second create of one key was refused")
        return ProbeCheck(name, False, f"a second create was refused but {detail}")
    return ProbeCheck(name, False, "a second create of an existing key succeeded (overwrite)")


def check_create_race(store: Store, key: str, racers: int = PROBE_RACERS) -> ProbeCheck:
    """``racers`` threads create ``key`` at once, each with its own bytes: exactly one must win
    and the key must hold the winner's bytes."""
    name = "create-if-absent-race"
    store.backend  # noqa: B018 - build the filesystem once, not in every racer
    barrier = threading.Barrier(racers)
    won: list[bytes] = []
    failed: list[str] = []
    guard = threading.Lock()

    def race(i: int) -> None:
        data = f"racer {i} {uuid.uuid4().hex}".encode()
        try:
            barrier.wait(timeout=30)
            store.create(key, data)
        except AlreadyExistsError:
            return
        except Exception as exc:  # noqa: BLE001 - reported in the check's detail
            with guard:
                failed.append(f"{type(exc).__name__}: {exc}")
            return
        with guard:
            won.append(data)

    threads = [threading.Thread(target=race, args=(i,), daemon=True) for i in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise ProbeInconclusiveError(
            f"{store.key_url(key)}: create-if-absent race inconclusive - {len(failed)} of "
            f"{racers} creates failed (first: {failed[0]})"
        )
    if len(won) != 1:
        return ProbeCheck(
            name, False, f"{len(won)} of {racers} concurrent creates of one key won (need 1)"
        )
    ok, detail = _read_back(store, key, won[0])
    if not ok:
        return ProbeCheck(name, False, f"one of {racers} racers won but {detail}")
    return ProbeCheck(name, True, f"exactly 1 of {racers} concurrent creates won")


def run_create_checks(store: Store, prefix: str = PROBE_PREFIX) -> list[ProbeCheck]:
    """The sequential and the racing create-if-absent checks on fresh keys under ``prefix``;
    the keys are deleted afterwards."""
    keys = [f"{prefix}/{uuid.uuid4().hex}", f"{prefix}/{uuid.uuid4().hex}"]
    try:
        return [check_create_sequential(store, keys[0]), check_create_race(store, keys[1])]
    finally:
        for key in keys:
            store.delete(key)


def _store_identity(store: Store) -> dict[str, Any]:
    """What the record is tied to: the protocol, the root URL and the endpoint it was reached at
    (the store's own, as its client finds it: ``StoreConfig.endpoint``)."""
    endpoint = store.config.endpoint
    return {
        "protocol": store.protocol,
        "url": store.url,
        "endpoint": None if endpoint is None else endpoint.url,
    }


def _shardlake_version() -> str:
    try:
        return importlib.metadata.version("shardlake")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _trusted_record(store: Store, now: float) -> bool:
    """Whether a fresh probe record of this very store (same identity, same shardlake version,
    every create check passed, younger than :data:`PROBE_RECORD_TTL_S`) is at the root."""
    try:
        doc = json.loads(store.read(PROBE_RECORD_KEY))
    except (StoreError, ValueError):
        return False  # absent, unreadable or damaged: probe afresh
    if not isinstance(doc, dict) or doc.get("format") != _RECORD_FORMAT:
        return False
    checked_at = doc.get("checked_at")
    return (
        isinstance(checked_at, (int, float))
        and 0 <= now - checked_at < PROBE_RECORD_TTL_S
        and doc.get("store") == _store_identity(store)
        and doc.get("shardlake_version") == _shardlake_version()
        and set(CREATE_CHECKS) <= set(doc.get("checks_passed") or ())
    )


def _remember(store: Store, now: float, checks: list[ProbeCheck]) -> None:
    """Keep the record (in a dataset root only, so a bare store keeps no shardlake object)."""
    if not store.exists(_ROOT_MARKER):
        return
    doc = {
        "format": _RECORD_FORMAT,
        "checked_at": now,
        "store": _store_identity(store),
        "shardlake_version": _shardlake_version(),
        "checks_passed": [c.name for c in checks if c.ok],
    }
    store.write(PROBE_RECORD_KEY, json.dumps(doc, sort_keys=True).encode())


def prove_create_enforced(store: Store, *, trust_record: bool) -> None:
    """Run the create checks unless a trusted record vouches for ``store``
    (``trust_record``); :class:`CapabilityError` names a failed check; a pass is remembered."""
    now = time.time()
    if trust_record and _trusted_record(store, now):
        return
    checks = run_create_checks(store)
    failed = [c for c in checks if not c.ok]
    if failed:
        what = "; ".join(f"{c.name}: {c.detail}" for c in failed)
        raise CapabilityError(
            f"{store.url} does not enforce create-if-absent (conditional writes) - "
            f"failed check {what}; refusing to publish there. Use a store that honours "
            "If-None-Match / ifGenerationMatch=0 atomically."
        )
    if trust_record:
        _remember(store, now, checks)
