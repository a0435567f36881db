"""Fault injection for any store, as an explicit store layer (tests only).

A :class:`FaultInjector` is a :class:`~shardlake.store.StoreLayer`: every attempt of every
request of a store made with ``store.with_layers(FaultInjector(plan))`` first consults a
:class:`FaultPlan`:

* ``fail_rate``: that fraction of requests fail *transiently* (a ``ConnectionResetError``) before
  reaching the backend; the store's retry policy retries them.  Decisions are deterministic for a
  given ``seed``: the n-th request for the same (operation, key) in a process always gets the
  same answer, whatever the thread interleaving.  ``max_consecutive`` caps how often the same
  request fails in a row, so a retry limit above it always succeeds.
* ``lost_reply_rate``: that fraction of ``write``/``create`` requests *do* reach the backend but
  then report a failure (a reply lost on the way back); the store must cope.
* ``permanent``: key prefixes whose requests fail with "access denied" (never retried).
* ``ignore_create``: ``create`` silently overwrites, like an S3-compatible server that ignores
  If-None-Match; :meth:`Store.ensure_create_enforced` must refuse such a store.
* ``flip_reads``: the first that many ``read_range``/``read_ranges`` attempts of each key come
  back with the first byte of every range flipped (a reply damaged in transit).
* ``racy_create``: ``create`` is check-then-write (``exists()``, a pause of ``racy_create`` seconds,
  then a plain write), like a gateway that answers a lone conditional PUT correctly but lets
  concurrent ones all win; :meth:`Store.ensure_create_enforced` must refuse it too
  (:class:`CheckThenWriteStore` is the same as a ready-made layer).

Count requests with :class:`shardlake.store.RequestCounter` as another layer::

    counter, injector = RequestCounter(), FaultInjector(FaultPlan(fail_rate=0.1, seed=7))
    faulty = store.with_layers(counter, injector)   # the counter sees every attempt

For faults below the client (lost replies, resets, flipped bytes on the wire) in any process,
including CLI subprocesses, use the HTTP proxy in :mod:`shardlake.testing.proxy`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar, cast

from ..store import Store
from ..store.layers import PerProcessLayer, Request

T = TypeVar("T")

__all__ = [
    "CheckThenWriteStore",
    "FaultInjector",
    "FaultPlan",
    "InjectedFault",
    "inject_faults",
]


class InjectedFault(ConnectionResetError):
    """A failure injected by a :class:`FaultPlan` (retried like a reset connection)."""

    def __init__(self, what: str) -> None:
        super().__init__(errno.ECONNRESET, f"injected fault: {what}")


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
    flip_reads: int = 0
    racy_create: float = 0.0

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

    def draw(self, what: str, n: int) -> float:
        """A uniform number in [0, 1) fixed by seed, request identity and occurrence ``n``."""
        digest = hashlib.blake2b(f"{self.seed}|{what}|{n}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64


class FaultInjector(PerProcessLayer):
    """A store layer injecting the faults of ``plan``; ``injected`` counts them per operation
    (in this process)."""

    def __init__(self, plan: FaultPlan) -> None:
        self.plan = plan
        self.injected: Counter[str] = Counter()
        self._seen: Counter[str] = Counter()
        self._streak: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"plan": self.plan}

    def __repr__(self) -> str:
        return f"FaultInjector({self.plan!r})"

    def __call__(self, request: Request, send: Callable[[], T]) -> T:
        plan, op, key = self.plan, request.op, request.key
        what = f"{op}|{key}"
        with self._lock:
            n = self._seen[what]
            self._seen[what] += 1
            capped = plan.max_consecutive is not None and self._streak[what] >= plan.max_consecutive
        if any(key.startswith(prefix) for prefix in plan.permanent):
            raise PermissionError(errno.EACCES, f"injected: access denied to {key}")
        eligible = plan.ops is None or op in plan.ops
        if eligible and not capped and plan.draw(what, n) < plan.fail_rate:
            self._fault(op, what)
            raise InjectedFault(f"{op} {key}")
        if op == "create" and plan.ignore_create and request.data is not None:
            # What a server that ignores If-None-Match does: a plain overwrite.
            request.backend.write(request.path, request.data)
            result = cast(T, None)
        elif op == "create" and plan.racy_create > 0 and request.data is not None:
            result = cast(T, _check_then_write(request, plan.racy_create))
        else:
            result = send()
        if op in ("read_range", "read_ranges") and plan.flip_reads:
            with self._lock:
                n_read = self._seen["flip|" + key]
                self._seen["flip|" + key] += 1
            if n_read < plan.flip_reads:
                self._fault("flip", "flip|" + key)
                result = cast(T, _flipped(result))
        if (
            eligible
            and op in ("write", "create")
            and not capped
            and plan.draw("lost|" + what, n) < plan.lost_reply_rate
        ):
            self._fault(op, what)
            raise InjectedFault(f"{op} {key} (reply lost after the request succeeded)")
        with self._lock:
            self._streak[what] = 0
        return result

    def _fault(self, op: str, what: str) -> None:
        with self._lock:
            self._streak[what] += 1
            self.injected[op] += 1


def _flipped(result: Any) -> Any:
    """A read's reply with the first byte of every range flipped."""

    def flip(data: bytes | memoryview) -> bytes | memoryview:
        return bytes([data[0] ^ 0xFF]) + bytes(data[1:]) if data else data  # bytes or a view

    return [flip(b) for b in result] if isinstance(result, list) else flip(result)


def _check_then_write(request: Request, pause: float) -> None:
    """A non-atomic create: look, pause, then overwrite (concurrent creators all win)."""
    if request.backend.exists(request.path):
        raise FileExistsError(errno.EEXIST, f"exists: {request.path}")
    time.sleep(pause)
    request.backend.write(request.path, request.data or b"")


class CheckThenWriteStore(FaultInjector):
    """A store layer whose create is check-then-write with a ``pause`` between the check and
    the write: every concurrent create of one key wins (the bug of SeaweedFS #8800, versitygw
    #2288, rustfs #1659); a lone create is refused correctly."""

    def __init__(self, pause: float = 0.05) -> None:
        super().__init__(FaultPlan(racy_create=pause))


def inject_faults(store: Store, plan: FaultPlan) -> Store:
    """``store`` with a :class:`FaultInjector` for ``plan`` as its outermost layer."""
    return store.with_layers(FaultInjector(plan))
