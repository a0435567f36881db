"""Store layers: explicit wrappers around every request a store sends.

A layer sees each *attempt* of a backend request (inside the retry loop) and decides whether and
how to send it.  Layers are added with :meth:`Store.with_layers`, travel with the store when it is
pickled into worker processes, and are the only way to observe or alter requests: production
code never consults an environment variable for them.

:class:`RequestCounter` counts requests and bytes (``shardlake bench load`` and the request-count
tests use it); :class:`shardlake.testing.faults.FaultInjector` injects faults for tests.
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from .backends import Backend

T = TypeVar("T")


@dataclass(frozen=True)
class Request:
    """One attempt of a backend request: the operation, the key (relative to the root), the
    filesystem path, the bytes written (writes only) and the backend that will serve it."""

    op: str
    key: str
    path: str
    data: bytes | None
    backend: Backend


class StoreLayer(Protocol):
    """Wraps one attempt: call ``send()`` to pass it on (or don't, or raise instead)."""

    def __call__(self, request: Request, send: Callable[[], T]) -> T: ...


_served = threading.local()


def note_read_client(name: str) -> None:
    """Record which client (``obstore``, ``fsspec``) served this thread's current multi-range
    read (backends call it; :class:`RequestCounter` reports it)."""
    _served.client = name


def _take_read_client() -> str | None:
    name: str | None = getattr(_served, "client", None)
    _served.client = None
    return name


def payload_size(result: object) -> int:
    """Bytes a request returned (a read's bytes, or a multi-range read's list of them)."""
    if isinstance(result, (bytes, bytearray, memoryview)):
        return len(result)
    if isinstance(result, list):
        return sum(len(b) for b in result if isinstance(b, (bytes, bytearray, memoryview)))
    return 0


class PerProcessLayer:
    """Base of a store layer whose counts belong to the process that made them: a pickled copy
    (a DataLoader worker's, a spawned task's) carries only what ``__getstate__`` returns,
    the arguments the layer was made with, and is made again from them, its counts at zero."""

    def __getstate__(self) -> dict[str, Any]:
        raise NotImplementedError

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, **state)


class RequestCounter(PerProcessLayer):
    """Counts requests (attempts) per operation and bytes read/written, in this process; with
    ``log_path``, also appends one JSON line per request to that file, so requests of DataLoader
    workers and other processes that received the pickled store can be summed
    (:func:`summarize_request_log`)."""

    def __init__(self, log_path: str | None = None) -> None:
        self.log_path = log_path  # the one setting a pickled copy keeps: the log spans processes
        self.requests: Counter[str] = Counter()
        # Multi-range reads per client that served them (obstore or fsspec).
        self.read_clients: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.bytes_read = 0
        self.bytes_written = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"log_path": self.log_path}

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    def __call__(self, request: Request, send: Callable[[], T]) -> T:
        with self._lock:
            self.requests[request.op] += 1
        _take_read_client()
        try:
            result = send()
        except Exception as exc:
            with self._lock:
                self.failures[request.op] += 1
            self._log(request, ok=False, nbytes=0, error=type(exc).__name__)
            raise
        nbytes = payload_size(result)
        client = _take_read_client()
        with self._lock:
            self.bytes_read += nbytes
            self.bytes_written += len(request.data or b"")
            if client is not None:
                self.read_clients[client] += 1
        self._log(request, ok=True, nbytes=nbytes, error=None, client=client)
        return result

    def _log(
        self,
        request: Request,
        *,
        ok: bool,
        nbytes: int,
        error: str | None,
        client: str | None = None,
    ) -> None:
        if not self.log_path:
            return
        line = json.dumps(
            {
                "pid": os.getpid(),
                "op": request.op,
                "key": request.key,
                "ok": ok,
                "error": error,
                "bytes": nbytes,
                "client": client,
            }
        )
        # One O_APPEND write per line: lines from concurrent processes do not interleave.
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


def read_request_log(path: str) -> list[dict[str, Any]]:
    """The JSON lines a :class:`RequestCounter` log collected (all processes)."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def summarize_request_log(path: str) -> dict[str, Any]:
    """Totals over a request log: requests, failed ones, bytes fetched, per op, processes."""
    records = read_request_log(path)
    return {
        "requests": len(records),
        "failures": sum(1 for r in records if not r["ok"]),
        "bytes_read": sum(r["bytes"] for r in records if r["ok"]),
        "by_op": dict(Counter(r["op"] for r in records)),
        # Multi-range reads per client that served them (obstore, fsspec).
        "by_client": dict(Counter(r["client"] for r in records if r.get("client"))),
        "processes": len({r["pid"] for r in records}),
    }


__all__ = [
    "PerProcessLayer",
    "Request",
    "RequestCounter",
    "StoreLayer",
    "note_read_client",
    "payload_size",
    "read_request_log",
    "summarize_request_log",
]
