"""The pytest plugin of shardlake's test support: store fixtures on every backend.

Load it from a ``conftest.py`` with ``pytest_plugins = ["shardlake.testing.pytest_plugin"]``.
It is the only module of :mod:`shardlake.testing` that imports pytest.  Fixtures:

* ``store_kind`` - parametrised over ``local``, ``memory``, ``s3`` (moto), ``gcs``
  (fake-gcs-server), ``seaweedfs`` (SeaweedFS) and ``azure`` (Azurite) by default, or over
  ``SHARDLAKE_STORE_KINDS`` (``all`` or a comma list); narrow it per test with ``@pytest.mark.parametrize("store_kind", [...])``;
* ``store_location`` / ``store_url`` / ``store`` - a fresh, empty prefix on that backend, its URL,
  the opened :class:`~shardlake.store.Store`;
* ``store_factory`` - ``store_factory(kind=None, label="t")`` makes further fresh locations;
* ``store_servers`` - the session's lazily started loopback servers;
* ``seaweedfs_server`` / ``azurite_server`` - two of them, started for the session: a
  :class:`~shardlake.testing.servers.StoreServer` each (``endpoint_url``, ``bucket``,
  ``storage_options``, ``env``, ``url(prefix)``, ``fresh_url(label)``), SeaweedFS speaking S3
  (``s3://`` URLs) and Azurite Azure Blob (``az://`` URLs).

While a test runs, the ``env`` of every location it made (``AWS_ENDPOINT_URL``...) is in
``os.environ`` too, so a bare URL or a CLI call in the test reaches the same server.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import pytest

from ..store import Store
from .fixtures import (
    StoreLocation,
    cleanup_location,
    new_location,
    shared_servers,
    store_kinds,
)
from .servers import StoreServer, StoreServers


def _forget_s3_filesystems() -> None:
    # fsspec caches filesystems by their arguments, not by the AWS_* environment: an s3fs made
    # without options while AWS_ENDPOINT_URL named SeaweedFS would keep reaching it when the
    # variable names moto again.
    s3fs = sys.modules.get("s3fs")
    if s3fs is not None:
        s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="session")
def store_servers() -> StoreServers:
    return shared_servers()


@pytest.fixture(scope="session")
def seaweedfs_server(store_servers: StoreServers) -> StoreServer:
    """SeaweedFS (master, volume, filer, S3 gateway) on 127.0.0.1, one per session."""
    return store_servers.get("seaweedfs")


@pytest.fixture(scope="session")
def azurite_server(store_servers: StoreServers) -> StoreServer:
    """Azurite's blob service on 127.0.0.1, one per session."""
    return store_servers.get("azure")


@pytest.fixture(params=store_kinds())
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_factory(
    store_kind: str, store_servers: StoreServers, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., StoreLocation]]:
    made: list[StoreLocation] = []
    env = pytest.MonkeyPatch()

    def make(kind: str | None = None, label: str = "t") -> StoreLocation:
        kind = kind or store_kind
        if kind == "local":
            location = StoreLocation("local", str(tmp_path_factory.mktemp(f"store-{label}")))
        else:
            location = new_location(kind, label, store_servers)
        for name, value in location.env.items():
            env.setenv(name, value)
        if location.env:
            _forget_s3_filesystems()
        made.append(location)
        return location

    try:
        yield make
    finally:
        env.undo()
        if any(location.env for location in made):
            _forget_s3_filesystems()
        for location in made:
            cleanup_location(location)


@pytest.fixture
def store_location(store_factory: Callable[..., StoreLocation]) -> StoreLocation:
    return store_factory()


@pytest.fixture
def store_url(store_location: StoreLocation) -> str:
    return store_location.url


@pytest.fixture
def store(store_location: StoreLocation) -> Store:
    return store_location.open()


__all__ = [
    "azurite_server",
    "seaweedfs_server",
    "store",
    "store_factory",
    "store_kind",
    "store_location",
    "store_servers",
    "store_url",
]
