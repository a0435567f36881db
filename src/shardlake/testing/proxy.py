"""A fault-injecting HTTP proxy for tests: put it between s3fs and a loopback S3 server.

Never part of the production path: tests point s3fs's ``endpoint_url`` at the proxy, which
forwards each request to the real (moto) endpoint and, on a seeded schedule, damages some of
them the way real networks and object stores do::

    with moto_s3_server() as s3, FaultProxy(s3.endpoint_url, rate=0.15, seed=3) as proxy:
        store = open_store(s3.url("root"), proxy.storage_options(s3.storage_options))
        ...
        print(proxy.injected)  # Counter({"503": 4, "lost_reply": 2, ...})

Fault kinds (:data:`FAULT_KINDS`):

* ``500`` / ``503``: an S3 XML error (``InternalError`` / ``SlowDown``) *without* forwarding.
* ``lost_reply``: forward the request (it takes effect on the server), then drop the
  connection without answering.
* ``reset``: forward, send the headers and half the body, then reset the connection.
* ``truncate``: forward, then send only half the body with a matching ``Content-Length``
  (silent: the HTTP layer cannot notice).
* ``delay``: wait ``delay_s`` seconds, then forward normally.
* ``stall``: accept the request and never answer (until ``stall_s`` passes or the proxy stops).
* ``flip``: forward, then flip one byte of a 200/206 body.
* ``flip_request``: flip one byte of the request's body (a PUT or POST: an upload damaged on
  its way to the store), then forward it.  Never drawn by the seeded schedule (aim it with
  :meth:`FaultProxy.inject` or name it in ``kinds``); a request without a body is forwarded
  untouched.

Body faults (``reset``, ``truncate``, ``flip``) need a response body; a request without one
gets a ``503`` instead. Decisions are deterministic for a seed: the n-th request with the same
method and path gets the same fate whatever the thread interleaving. ``stall_all`` makes the
whole endpoint stall (a hung server). :meth:`FaultProxy.inject` aims faults at the next
matching requests (e.g. lose the reply to gc's lock commit, then fail the read-back), in the
order they were aimed, ahead of the seeded schedule. ``history`` lists every request's
``(method, path, fault)``; ``served`` every answered request's ``(method, path, Range header,
body bytes sent)``, so a test counts what a client really fetched (after any merging of ranges
the client does on its own)::

    fetched = sum(n for method, path, _r, n in proxy.served if method == "GET")

:class:`CheckThenWriteGateway` is a proxy of another kind: an S3 gateway whose create-if-absent
is check-then-write, the bug SeaweedFS (#8800, older versions), versitygw (#2288) and rustfs
(#1659) shipped.  For a ``PUT`` carrying ``If-None-Match: *`` it drops the header, asks upstream
whether the object exists (``HEAD``), answers ``412`` in SeaweedFS's shape (no ``Condition``
element) if it does, and otherwise waits ``window_s`` and forwards the plain ``PUT``.  A lone
conditional create is answered correctly; concurrent ones all see "absent" and all win::

    with seaweedfs_server() as s3, CheckThenWriteGateway(s3.endpoint_url) as gateway:
        store = open_store(s3.url("root"), gateway.storage_options(s3.storage_options))
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import socket
import struct
import sys
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from ..tools.localhost import LOOPBACK

FAULT_KINDS = ("500", "503", "lost_reply", "reset", "truncate", "delay", "stall", "flip")
# Faults only ever aimed or named: adding them to FAULT_KINDS would change every seeded schedule.
AIMED_KINDS = ("flip_request",)
BODY_FAULTS = frozenset({"reset", "truncate", "flip"})
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "content-length",
    }
)
_S3_ERRORS = {
    "500": ("InternalError", "We encountered an internal error. Please try again."),
    "503": ("SlowDown", "Please reduce your request rate."),
}


class FaultProxy:
    """A threaded HTTP proxy on 127.0.0.1 (free port) injecting faults; see the module doc.

    Parameters
    ----------
    upstream:
        ``http://host:port`` of the real server.
    rate:
        Fraction of requests that get a fault (0 disables injection).
    seed:
        Schedule seed; the same seed gives the same faults for the same request sequence.
    kinds:
        Fault kinds to draw from (default: all of :data:`FAULT_KINDS`).
    delay_s, stall_s:
        How long a ``delay`` waits before forwarding, and a ``stall`` before giving up.
    """

    def __init__(
        self,
        upstream: str,
        *,
        rate: float = 0.15,
        seed: int = 0,
        kinds: Sequence[str] = FAULT_KINDS,
        delay_s: float = 0.5,
        stall_s: float = 600.0,
    ) -> None:
        unknown = set(kinds) - set(FAULT_KINDS + AIMED_KINDS)
        if unknown or not kinds:
            raise ValueError(
                f"unknown fault kinds {sorted(unknown)}; use {FAULT_KINDS + AIMED_KINDS}"
            )
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or LOOPBACK, parts.port or 80)
        self.rate, self.seed, self.kinds = rate, seed, tuple(kinds)
        self.delay_s, self.stall_s = delay_s, stall_s
        self.stall_all = False
        self.injected: Counter[str] = Counter()
        self.requests = 0
        self.history: list[tuple[str, str, str | None]] = []
        self.served: list[tuple[str, str, str | None, int]] = []
        self._aimed: list[_Aimed] = []
        self._seen: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = _Server((LOOPBACK, 0), _Handler)
        self._server.proxy = self
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def storage_options(self, base: dict[str, Any]) -> dict[str, Any]:
        """s3fs ``storage_options`` of ``base`` with the endpoint replaced by the proxy."""
        out = dict(base, endpoint_url=self.endpoint_url)
        out["client_kwargs"] = dict(base.get("client_kwargs", {}), endpoint_url=self.endpoint_url)
        return out

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving; stalled requests are released."""
        self._stop.set()
        if self._thread.is_alive():  # shutdown() waits for serve_forever: only when it runs
            self._server.shutdown()
            self._thread.join(timeout=10)
        self._server.server_close()

    def inject(
        self,
        kind: str,
        *,
        path_contains: str,
        method: str | None = None,
        times: int = 1,
        body_contains: bytes | None = None,
    ) -> None:
        """Give the next ``times`` requests whose path contains ``path_contains`` (and whose
        method is ``method``, and whose body contains ``body_contains``, if given: a GCS
        upload names its object in the body) the fault ``kind``. Aimed faults apply in the
        order they were aimed: one starts only when the one before it is used up."""
        if kind not in FAULT_KINDS + AIMED_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; use {FAULT_KINDS + AIMED_KINDS}")
        with self._lock:
            self._aimed.append(_Aimed(kind, method, path_contains, times, body_contains))

    def decide(self, method: str, path: str, body: bytes = b"") -> str | None:
        """The fault for this request (None: forward it untouched); counts what it injects."""
        kind = self._choose(method, path, body)
        with self._lock:
            self.history.append((method, path, kind))
            if kind is not None:
                self.injected[kind] += 1
        return kind

    def _choose(self, method: str, path: str, body: bytes = b"") -> str | None:
        with self._lock:
            self.requests += 1
            if self.stall_all:
                return "stall"
            self._aimed = [aimed for aimed in self._aimed if aimed.left > 0]
            if self._aimed and self._aimed[0].matches(method, path, body):
                self._aimed[0].left -= 1
                return self._aimed[0].kind
            what = f"{method} {path}"
            n = self._seen[what]
            self._seen[what] += 1
        digest = hashlib.sha256(f"{self.seed}\0{what}\0{n}".encode()).digest()
        draw, pick = struct.unpack(">QQ", digest[:16])
        if draw / 2**64 >= self.rate:
            return None
        kind: str = self.kinds[pick % len(self.kinds)]
        return kind

    def wait_or_stop(self, seconds: float) -> None:
        self._stop.wait(seconds)


class CheckThenWriteGateway(FaultProxy):
    """An S3 gateway with a racy create-if-absent (check, then write); see the module doc.

    Parameters
    ----------
    upstream:
        ``http://host:port`` of a real S3 server (SeaweedFS on loopback in shardlake's tests).
    window_s:
        The pause between the existence check and the write: the window in which concurrent
        creates all see "absent".  Real gateways have one too (a filer lookup, a metadata RPC);
        this one makes it wide enough to hit on a loaded machine.
    rate:
        As for :class:`FaultProxy` (no faults by default).
    **kw:
        ``seed``, ``kinds``, ``delay_s``, ``stall_s``: as for :class:`FaultProxy`.

    Attributes
    ----------
    creates:
        What it did with conditional creates: ``checked``, ``refused`` (412), ``written``.
    """

    def __init__(self, upstream: str, *, window_s: float = 0.25, rate: float = 0.0, **kw: Any):
        super().__init__(upstream, rate=rate, **kw)
        self.window_s = window_s
        self.creates: Counter[str] = Counter()

    def __enter__(self) -> CheckThenWriteGateway:
        super().__enter__()
        return self

    def count(self, what: str) -> None:
        with self._lock:
            self.creates[what] += 1


@dataclass
class _Aimed:
    """A fault aimed at the next ``left`` requests matching ``method`` and a path part."""

    kind: str
    method: str | None
    path_contains: str
    left: int
    body_contains: bytes | None = None

    def matches(self, method: str, path: str, body: bytes = b"") -> bool:
        return (
            self.method in (None, method)
            and self.path_contains in path
            and (self.body_contains is None or self.body_contains in body)
        )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    proxy: FaultProxy

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gives up on a faulted request resets the connection: that is the
        # point of the exercise, not an error worth a traceback on stderr.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        return  # keep test output quiet

    def do_GET(self) -> None:
        self._handle()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _handle(self) -> None:
        proxy = self.server.proxy
        body = self._request_body()
        if (
            isinstance(proxy, CheckThenWriteGateway)
            and self._is_conditional_create()
            and self._check_then_write(proxy, body)
        ):
            return
        kind = proxy.decide(self.command, self.path.split("?", 1)[0], body)
        if kind == "stall":
            proxy.wait_or_stop(proxy.stall_s)
            self._drop()
            return
        if kind in _S3_ERRORS:
            self._s3_error(kind)
            return
        if kind == "delay":
            proxy.wait_or_stop(proxy.delay_s)
        if kind == "flip_request" and body:
            damaged = bytearray(body)
            damaged[len(damaged) // 2] ^= 0x01
            body = bytes(damaged)
        status, reason, headers, data = self._forward(proxy, body)
        if kind == "lost_reply":
            self._drop()
            return
        if kind in BODY_FAULTS and not (data and self.command == "GET" and status in (200, 206)):
            self._s3_error("503")  # nothing to damage: degrade to a throttle
            return
        self._reply(status, reason, headers, data, kind)

    def _is_conditional_create(self) -> bool:
        # A single-request PutObject only: parts and copies carry a query or a copy source.
        return (
            self.command == "PUT"
            and self.headers.get("If-None-Match", "").strip() == "*"
            and "?" not in self.path
            and "x-amz-copy-source" not in self.headers
        )

    def _check_then_write(self, proxy: CheckThenWriteGateway, body: bytes) -> bool:
        """The racy create: HEAD, then (after the window) a plain PUT.  True when answered."""
        proxy.count("checked")
        conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
        try:
            conn.request("HEAD", self.path)
            response = conn.getresponse()
            response.read()
            exists = response.status == 200
        finally:
            conn.close()
        if exists:
            proxy.count("refused")
            self._precondition_failed()
            return True
        proxy.wait_or_stop(proxy.window_s)
        del self.headers["If-None-Match"]  # the write no longer carries the condition
        proxy.count("written")
        return False

    def _precondition_failed(self) -> None:
        # SeaweedFS's 412 body: Key and BucketName, but no <Condition> element (which s3fs
        # needs to map a 412 to FileExistsError).
        path = self.path.split("?", 1)[0]
        bucket, _, key = path.lstrip("/").partition("/")
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            "<Error><Code>PreconditionFailed</Code>"
            "<Message>At least one of the pre-conditions you specified did not hold</Message>"
            f"<Resource>{path}</Resource><RequestId>shardlake-check-then-write</RequestId>"
            f"<Key>{key}</Key><BucketName>{bucket}</BucketName></Error>"
        ).encode()
        self.send_response(412)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _request_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _forward(
        self, proxy: FaultProxy, body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            if body or self.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body or None, headers=headers)
            response = conn.getresponse()
            data = response.read()
            return response.status, response.reason, response.getheaders(), data
        finally:
            conn.close()

    def _reply(
        self,
        status: int,
        reason: str,
        headers: list[tuple[str, str]],
        data: bytes,
        kind: str | None,
    ) -> None:
        length = next((v for k, v in headers if k.lower() == "content-length"), None)
        if kind == "flip":
            damaged = bytearray(data)
            damaged[len(damaged) // 2] ^= 0x01
            data = bytes(damaged)
        elif kind in ("truncate", "reset"):
            data = data[: len(data) // 2]
        self.send_response(status, reason)
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        if self.command == "HEAD":
            self.send_header("Content-Length", length or "0")
        elif kind == "reset":
            self.send_header("Content-Length", str(len(data) * 2 or 1))  # promise the whole body
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        proxy = self.server.proxy
        with proxy._lock:
            sent = 0 if self.command == "HEAD" else len(data)
            path = self.path.split("?", 1)[0]
            proxy.served.append((self.command, path, self.headers.get("Range"), sent))
        if kind == "reset":
            self.wfile.flush()
            self._drop()

    def _s3_error(self, kind: str) -> None:
        code, message = _S3_ERRORS[kind]
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            f"<Resource>{self.path.split('?', 1)[0]}</Resource>"
            "<RequestId>shardlake-fault-proxy</RequestId></Error>"
        ).encode()
        self.send_response(int(kind))
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _drop(self) -> None:
        """Close the connection with a reset (SO_LINGER 0) and send nothing more."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.wfile.flush()
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def fault_proxy(upstream: str, **options: Any) -> Iterator[FaultProxy]:
    """``with fault_proxy(url, rate=..., seed=...) as proxy:`` - a started :class:`FaultProxy`."""
    with FaultProxy(upstream, **options) as proxy:
        yield proxy


@contextlib.contextmanager
def check_then_write_gateway(upstream: str, **options: Any) -> Iterator[CheckThenWriteGateway]:
    """``with check_then_write_gateway(url) as gateway:`` - a started
    :class:`CheckThenWriteGateway`."""
    with CheckThenWriteGateway(upstream, **options) as gateway:
        yield gateway


__all__ = [
    "AIMED_KINDS",
    "BODY_FAULTS",
    "CheckThenWriteGateway",
    "FAULT_KINDS",
    "FaultProxy",
    "check_then_write_gateway",
    "fault_proxy",
]
