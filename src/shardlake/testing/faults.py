"""Fault injection and request accounting for any store (tests and benchmarks only).

A :class:`FaultyStore` is a :class:`~shardlake.store.Store` whose every backend request (one
attempt of ``read``, ``read_range``, ``read_ranges``, ``stat``, ``exists``, ``list``, ``write``,
``create``, ``delete``) first consults a :class:`FaultPlan`:

* ``fail_rate``: that fraction of requests fail *transiently* (a ``ConnectionResetError``) before
  reaching the backend; the store's retry policy retries them.  Decisions are deterministic for a
  given ``seed``: the n-th request for the same (operation, key) in a process always gets the
  same answer, whatever the thread interleaving.  ``max_consecutive`` caps how often the same
  request fails in a row, so a retry limit above it always succeeds.
* ``lost_reply_rate``: that fraction of ``write``/``create`` requests *do* reach the backend but
  then report a transient failure (a reply lost on the way back); the retry must cope.
* ``permanent``: key prefixes whose requests fail with "access denied" (never retried).
* ``ignore_create``: ``create`` silently overwrites, like an S3-compatible server that ignores
  If-None-Match; :meth:`Store.ensure_create_enforced` must refuse such a store.
* ``log_path``: every request appends one JSON line (pid, op, key, ok, fault, bytes) to this
  file, so requests and bytes fetched can be counted across DataLoader worker processes.

In-process counters are on ``store.stats`` (:class:`FaultStats`).

Three ways to use it:

1. Wrap a store you hand to code (pickles into spawn/fork workers with its plan)::

       from shardlake.testing.faults import FaultPlan, FaultyStore
       store = FaultyStore.wrap(open_store(url, opts), FaultPlan(fail_rate=0.1, seed=7))

2. Open one directly: ``FaultyStore(url, opts, plan=FaultPlan(...))``.

3. Environment, for code that opens stores itself (CLI subprocesses, DataLoader workers started
   with spawn inherit the variable): ``SHARDLAKE_TEST_FAULTS='{"fail_rate": 0.1, "seed": 7,
   "log_path": "/tmp/requests.jsonl"}'`` makes every ``open_store`` in the process return a
   ``FaultyStore`` with that plan.  Use :func:`read_request_log` / :func:`summarize_log` to count.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from ..store import RetryPolicy, Store
from ..store.core import FAULTS_ENV

T = TypeVar("T")

WRITE_OPS = frozenset({"write", "create", "delete"})

__all__ = [
    "FAULTS_ENV",
    "FaultPlan",
    "FaultStats",
    "FaultyStore",
    "InjectedFault",
    "read_request_log",
    "summarize_log",
]


class InjectedFault(ConnectionResetError):
    """A transient failure injected by a :class:`FaultPlan` (retried like a reset connection)."""

    def __init__(self, what: str) -> None:
        super().__init__(errno.ECONNRESET, f"injected transient fault: {what}")


@dataclass(frozen=True)
class FaultPlan:
    """What to inject; see the module docstring."""

    fail_rate: float = 0.0
    lost_reply_rate: float = 0.0
    seed: int = 0
    ops: tuple[str, ...] | None = None  # operations subject to transient faults (None: all)
    max_consecutive: int | None = None
    permanent: tuple[str, ...] = ()  # key prefixes that are "access denied"
    ignore_create: bool = False
    log_path: str | None = None

    def __post_init__(self) -> None:
        for name in ("fail_rate", "lost_reply_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"FaultPlan.{name} must be within [0, 1], got {value}")

    @classmethod
    def from_json(cls, text: str) -> FaultPlan:
        doc = json.loads(text)
        for name in ("ops", "permanent"):
            if doc.get(name) is not None:
                doc[name] = tuple(doc[name])
        return cls(**doc)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def env(self) -> dict[str, str]:
        """``{SHARDLAKE_TEST_FAULTS: ...}`` for a subprocess environment."""
        return {FAULTS_ENV: self.to_json()}

    def draw(self, what: str, n: int) -> float:
        """A uniform number in [0, 1) fixed by seed, request identity and occurrence ``n``."""
        digest = hashlib.blake2b(f"{self.seed}|{what}|{n}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64


@dataclass
class FaultStats:
    """Per-process counters (thread-safe)."""

    requests: Counter[str] = field(default_factory=Counter)  # attempts per operation
    injected: Counter[str] = field(default_factory=Counter)  # injected transient faults per op
    bytes_read: int = 0
    bytes_written: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())


class FaultyStore(Store):
    """A :class:`Store` that injects faults per its :class:`FaultPlan` and counts requests."""

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        plan: FaultPlan,
        retry: RetryPolicy | None = None,
    ) -> None:
        super().__init__(url, storage_options, retry=retry)
        self.plan = plan
        self._init_counters()

    @classmethod
    def wrap(cls, store: Store, plan: FaultPlan, retry: RetryPolicy | None = None) -> FaultyStore:
        """A faulty twin of ``store`` (same location and options)."""
        faulty = cls.__new__(cls)
        Store.__setstate__(faulty, store.__getstate__())
        faulty.plan = plan
        faulty._create_checked = False  # its own capability, probed afresh
        if retry is not None:
            faulty.retry = retry
        faulty._init_counters()
        return faulty

    def _init_counters(self) -> None:
        self.stats = FaultStats()
        self._seen: Counter[str] = Counter()
        self._streak: Counter[str] = Counter()
        self._count_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["plan"] = self.plan
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.plan = state["plan"]
        self._init_counters()

    def __repr__(self) -> str:
        return f"FaultyStore({self.url!r}, fail_rate={self.plan.fail_rate})"

    # --- the hook ------------------------------------------------------------------------------

    def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        return super()._call(op, key, lambda: self._attempt(op, key, fn))

    def _attempt(self, op: str, key: str, fn: Callable[[], T]) -> T:
        plan = self.plan
        what = f"{op}|{key}"
        with self._count_lock:
            n = self._seen[what]
            self._seen[what] += 1
            streak = self._streak[what]
        with self.stats._lock:
            self.stats.requests[op] += 1
        if any(key.startswith(prefix) for prefix in plan.permanent):
            self._log(op, key, ok=False, fault="denied", nbytes=0)
            raise PermissionError(errno.EACCES, f"injected: access denied to {key}")
        eligible = plan.ops is None or op in plan.ops
        capped = plan.max_consecutive is not None and streak >= plan.max_consecutive
        if eligible and not capped and plan.draw(what, n) < plan.fail_rate:
            self._fault(op, what)
            raise InjectedFault(f"{op} {key}")
        result = fn()
        nbytes = _size_of(result)
        if nbytes:
            with self.stats._lock:
                self.stats.bytes_read += nbytes
        if (
            eligible
            and op in ("write", "create")
            and not capped
            and plan.draw("lost|" + what, n) < plan.lost_reply_rate
        ):
            self._fault(op, what)
            raise InjectedFault(f"{op} {key} (reply lost after the request succeeded)")
        with self._count_lock:
            self._streak[what] = 0
        self._log(op, key, ok=True, fault=None, nbytes=nbytes)
        return result

    def _fault(self, op: str, what: str) -> None:
        with self._count_lock:
            self._streak[what] += 1
        with self.stats._lock:
            self.stats.injected[op] += 1
        if self.plan.log_path:
            op_name, key = what.split("|", 1)
            self._log(op_name, key, ok=False, fault="transient", nbytes=0)

    def _log(self, op: str, key: str, *, ok: bool, fault: str | None, nbytes: int) -> None:
        if not self.plan.log_path:
            return
        line = json.dumps(
            {"pid": os.getpid(), "op": op, "key": key, "ok": ok, "fault": fault, "bytes": nbytes}
        )
        # One O_APPEND write per line: lines from concurrent processes do not interleave.
        fd = os.open(self.plan.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    # --- writes: count bytes, optionally ignore create-if-absent -----------------------------

    def write(self, key: str, data: bytes) -> None:
        super().write(key, data)
        with self.stats._lock:
            self.stats.bytes_written += len(data)

    def create(self, key: str, data: bytes) -> None:
        if self.plan.ignore_create:
            self.write(key, data)  # what a server that ignores If-None-Match does
            return
        super().create(key, data)
        with self.stats._lock:
            self.stats.bytes_written += len(data)


def _size_of(result: object) -> int:
    if isinstance(result, (bytes, bytearray, memoryview)):
        return len(result)
    if isinstance(result, list) and result and isinstance(result[0], (bytes, bytearray)):
        return sum(len(b) for b in result)
    return 0


def read_request_log(path: str) -> list[dict[str, Any]]:
    """The JSON lines a plan's ``log_path`` collected (all processes)."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def summarize_log(path: str) -> dict[str, Any]:
    """Totals over a request log: requests, faults, bytes fetched, per op and per process."""
    records = read_request_log(path)
    return {
        "requests": len(records),
        "faults": sum(1 for r in records if r["fault"]),
        "bytes_read": sum(r["bytes"] for r in records if r["ok"]),
        "by_op": dict(Counter(r["op"] for r in records)),
        "processes": len({r["pid"] for r in records}),
    }
