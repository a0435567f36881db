"""A static HTTP server on loopback, for serving an exported root in tests.

It does what a static web server or CDN does and nothing more: ``GET`` and ``HEAD`` of files,
single ``Range: bytes=`` requests answered with 206 (or, with ``ranges=False``, ignored: 200
and the whole file, as some servers and proxies do), no directory listings (404). Every request
is recorded in :attr:`StaticServer.requests` so a test can prove what a reader asked for::

    with static_http_server(exported_dir) as server:
        shardlake.open(server.url).versions()
"""

from __future__ import annotations

import contextlib
import email.utils
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")


@dataclass(frozen=True)
class Served:
    """One request: method, path, the ``Range`` header sent (or None), the status answered,
    and every header sent."""

    method: str
    path: str
    range: str | None
    status: int
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class StaticServer:
    """A running server: its base :attr:`url` (``http://127.0.0.1:PORT``), the directory it
    serves and the requests it answered. Setting :attr:`fail_next` makes the next that many
    requests fail with 503 (a restarting server or overloaded CDN)."""

    url: str
    directory: str
    ranges: bool
    requests: list[Served] = field(default_factory=list)
    fail_next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def clear(self) -> None:
        self.requests.clear()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: StaticServer


class _Handler(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers do
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
        pass

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def _record(self, status: int) -> None:
        path = unquote(urlsplit(self.path).path)
        self.server.state.requests.append(
            Served(self.command, path, self.headers.get("Range"), status, dict(self.headers))
        )

    def _fail(self, status: int, extra: dict[str, str] | None = None) -> None:
        self._record(status)
        self.send_response(status)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _serve(self, *, body: bool) -> None:
        state = self.server.state
        with state._lock:
            failing = state.fail_next > 0
            state.fail_next -= int(failing)
        if failing:
            self._fail(503)
            return
        path = self.translate_path(self.path)
        if not os.path.isfile(path):  # directories too: a static server that does not list
            self._fail(404)
            return
        size = os.path.getsize(path)
        start, end, status = 0, size, 200
        wanted = self.headers.get("Range")
        if wanted and self.server.state.ranges:
            match = _RANGE_RE.match(wanted.strip())
            if match is None or match.groups() == ("", ""):
                self._fail(400)
                return
            first, last = match.groups()
            if first == "":  # the last N bytes
                start, end = max(0, size - int(last)), size
            else:
                start = int(first)
                end = size if last == "" else min(size, int(last) + 1)
            if start >= size:
                self._fail(416, {"Content-Range": f"bytes */{size}"})
                return
            status = 206
        self._record(status)
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        mtime = os.path.getmtime(path)
        self.send_header("Last-Modified", email.utils.formatdate(mtime, usegmt=True))
        if self.server.state.ranges:
            self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if not body:
            return
        with open(path, "rb") as f, contextlib.suppress(BrokenPipeError, ConnectionResetError):
            f.seek(start)
            remaining = end - start
            while remaining > 0:
                chunk = f.read(min(1 << 20, remaining))
                if not chunk:
                    break
                self.wfile.write(chunk)
                remaining -= len(chunk)


@contextlib.contextmanager
def static_http_server(
    directory: str | os.PathLike[str], *, ranges: bool = True
) -> Iterator[StaticServer]:
    """Serve ``directory`` on ``127.0.0.1`` (a free port) until the block ends.

    ``ranges=False``: ignore ``Range`` headers and always answer 200 with the whole file."""
    directory = os.fspath(directory)
    server = _Server(("127.0.0.1", 0), partial(_Handler, directory=directory))
    port = server.server_address[1]
    server.state = StaticServer(f"http://127.0.0.1:{port}", directory, ranges)
    thread = threading.Thread(target=server.serve_forever, name="static-http", daemon=True)
    thread.start()
    try:
        yield server.state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


__all__ = [
    "Served",
    "StaticServer",
    "static_http_server",
]
