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
import sys
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
    requests fail with 503 (a restarting server or overloaded CDN); :attr:`missing_status` 403
    answers a missing name as a bucket does to readers who may not list."""

    url: str
    directory: str
    ranges: bool
    requests: list[Served] = field(default_factory=list)
    fail_next: int = 0
    # The status of a request for a name that is not there: 404, or 403 as S3 and GCS answer
    # readers who may not list.
    missing_status: int = 404
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def clear(self) -> None:
        self.requests.clear()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: StaticServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client closing a kept-alive connection is not an error worth a traceback.
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


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
            self._fail(state.missing_status)
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


def self_signed_certificate(directory: str | os.PathLike[str]) -> tuple[str, str]:
    """``(cert.pem, key.pem)`` in ``directory``: a self-signed certificate for ``127.0.0.1``
    and ``localhost`` (its own CA: trust it with ``SSL_CERT_FILE=cert.pem``). Needs the
    ``cryptography`` package."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path = os.path.join(os.fspath(directory), "cert.pem")
    key_path = os.path.join(os.fspath(directory), "key.pem")
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return cert_path, key_path


@contextlib.contextmanager
def static_http_server(
    directory: str | os.PathLike[str],
    *,
    ranges: bool = True,
    tls: tuple[str, str] | None = None,
) -> Iterator[StaticServer]:
    """Serve ``directory`` on ``127.0.0.1`` (a free port) until the block ends.

    ``ranges=False``: ignore ``Range`` headers and always answer 200 with the whole file.
    ``tls``: ``(certfile, keyfile)`` to serve ``https://`` (see :func:`self_signed_certificate`)."""
    directory = os.fspath(directory)
    server = _Server(("127.0.0.1", 0), partial(_Handler, directory=directory))
    port = server.server_address[1]
    scheme = "http"
    if tls is not None:
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    server.state = StaticServer(f"{scheme}://127.0.0.1:{port}", directory, ranges)
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
    "self_signed_certificate",
    "static_http_server",
]
