"""The root state a commit records (live tags, pruned tags, latest, the gc lock) and the JSON
forms shardlake writes its records in (canonical bytes, hashes, times).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..errors import FormatError
from ..format.documents import GcLock

__all__ = [
    "RootState",
    "canonical_json",
    "describe_lock",
    "hash_bytes",
    "lock_holder_gone",
    "parse_json",
    "takeover_note",
    "utc_now",
]


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


def describe_lock(lock: GcLock | None) -> str:
    """``gc holds the root until <UTC time> (owner ...)``, for messages."""
    return "no gc holds the root" if lock is None else lock.describe()
