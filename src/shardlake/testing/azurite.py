"""Azure Blob Storage on loopback: Microsoft's Azurite emulator (``azurite-blob``).

Usage, inside or outside pytest::

    from shardlake.store import open_store
    from shardlake.testing.azurite import azurite_server

    with azurite_server() as az:
        store = open_store(az.url("my/prefix"), az.storage_options)

Azurite is an npm package.  ``bash scripts/setup.sh`` installs it (when ``npm`` is there) into
``.cache/azurite/`` of the checkout, pinned by ``scripts/azurite/package-lock.json``; the
launcher looks for ``azurite-blob`` at ``$SHARDLAKE_AZURITE_BLOB``, then in that directory, then
on ``PATH``.  It runs with ``--loose --skipApiVersionCheck`` (the azure-storage-blob SDK may be
newer than the emulator), binds 127.0.0.1 on a free port and keeps its data in a temporary
directory.  The account is Azurite's well-known ``devstoreaccount1`` and its published key.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..tools.localhost import LOOPBACK
from ..tools.loopback import (
    DEFAULT_BUCKET,
    MissingServerError,
    StoreServer,
    _patched_env,
    process_server,
)

ENV_BINARY = "SHARDLAKE_AZURITE_BLOB"
# Azurite's fixed development account (published in Microsoft's documentation).
ACCOUNT_NAME = "devstoreaccount1"
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
# Streaming writes stage blocks of this size (small keeps the multi-block tests cheap).
AZURE_TEST_BLOCK_SIZE = 4 * 2**20
_INSTALL_DIR = Path(".cache") / "azurite"


class AzuriteServer(StoreServer):
    """A running ``azurite-blob``; see :func:`azurite_server`."""

    @property
    def scheme(self) -> str:
        return "az"

    @property
    def connection_string(self) -> str:
        return connection_string(self.endpoint_url)


def connection_string(endpoint_url: str) -> str:
    """The connection string of Azurite's development account at ``endpoint_url``."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT_NAME};AccountKey={ACCOUNT_KEY};"
        f"BlobEndpoint={endpoint_url}/{ACCOUNT_NAME};"
    )


def azure_storage_options(endpoint_url: str) -> dict[str, Any]:
    """adlfs options for Azurite at ``endpoint_url`` (connection string, small blocks)."""
    return {
        "connection_string": connection_string(endpoint_url),
        "blocksize": AZURE_TEST_BLOCK_SIZE,
        "skip_instance_cache": True,
    }


def azurite_binary() -> str:
    """``azurite-blob``: ``$SHARDLAKE_AZURITE_BLOB``, ``.cache/azurite`` of the checkout (or of
    the working directory), or ``PATH``."""
    named = os.environ.get(ENV_BINARY)
    if named:
        return named
    checkout = Path(__file__).resolve().parents[3]
    for base in (checkout, Path.cwd()):
        candidate = base / _INSTALL_DIR / "node_modules" / ".bin" / "azurite-blob"
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("azurite-blob")
    if found:
        return found
    raise MissingServerError(
        "a loopback Azure Blob server needs Azurite: run bash scripts/setup.sh (needs npm), or "
        f"npm install -g azurite, or set {ENV_BINARY} to the azurite-blob script"
    )


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((LOOPBACK, port)) == 0


def _create_container(endpoint: str, container: str) -> None:
    from azure.core.exceptions import ResourceExistsError
    from azure.storage.blob import BlobServiceClient

    client = BlobServiceClient.from_connection_string(connection_string(endpoint))
    with client, contextlib.suppress(ResourceExistsError):
        client.create_container(container)


@contextlib.contextmanager
def azurite_server(
    container: str = DEFAULT_BUCKET,
    *,
    set_env: bool = True,
    startup_timeout: float = 30.0,
    binary: str | None = None,
) -> Iterator[AzuriteServer]:
    """Run Azurite's blob service on 127.0.0.1 (free port) with ``container`` created.

    ``storage_options`` carry the connection string; ``env`` holds it as
    ``AZURE_STORAGE_CONNECTION_STRING``, put into ``os.environ`` while it runs when ``set_env``.
    """
    script = binary or azurite_binary()

    def argv(port: int, workdir: str) -> list[str]:
        return [
            script,
            "--loose",
            "--skipApiVersionCheck",
            "--disableTelemetry",
            "--silent",
            "--blobHost",
            LOOPBACK,
            "--blobPort",
            str(port),
            "--location",
            os.path.join(workdir, "data"),
        ]

    def ready(proc: subprocess.Popen[bytes], port: int) -> bool:
        deadline = time.monotonic() + startup_timeout
        while time.monotonic() < deadline and proc.poll() is None and not _listening(port):
            time.sleep(0.05)
        return proc.poll() is None and _listening(port)

    with process_server("Azurite", argv, ready) as endpoint:
        _create_container(endpoint, container)
        env = {"AZURE_STORAGE_CONNECTION_STRING": connection_string(endpoint)}
        info = AzuriteServer("azure", endpoint, container, azure_storage_options(endpoint), env)
        with _patched_env(env, set_env):
            yield info


__all__ = [
    "ACCOUNT_KEY",
    "ACCOUNT_NAME",
    "AZURE_TEST_BLOCK_SIZE",
    "ENV_BINARY",
    "AzuriteServer",
    "azure_storage_options",
    "azurite_binary",
    "azurite_server",
    "connection_string",
]
