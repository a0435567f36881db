"""The pytest plugin of shardlake's test support: store fixtures on every backend.

Load it from a ``conftest.py`` with ``pytest_plugins = ["shardlake.testing.pytest_plugin"]``.
It is the only module of :mod:`shardlake.testing` that imports pytest.  Fixtures:

* ``store_kind`` - parametrised over ``local``, ``memory``, ``s3`` (moto), ``gcs``
  (fake-gcs-server); narrow it per test with ``@pytest.mark.parametrize("store_kind", [...])``;
* ``store_location`` / ``store_url`` / ``store`` - a fresh, empty prefix on that backend, its URL,
  the opened :class:`~shardlake.store.Store`;
* ``store_factory`` - ``store_factory(kind=None, label="t")`` makes further fresh locations;
* ``store_servers`` - the session's lazily started loopback servers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from ..store import Store
from .fixtures import (
    LOOPBACK_KINDS,
    StoreLocation,
    cleanup_location,
    new_location,
    shared_servers,
)
from .servers import StoreServers


@pytest.fixture(scope="session")
def store_servers() -> StoreServers:
    return shared_servers()


@pytest.fixture(params=LOOPBACK_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_factory(
    store_kind: str, store_servers: StoreServers, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., StoreLocation]]:
    made: list[StoreLocation] = []

    def make(kind: str | None = None, label: str = "t") -> StoreLocation:
        kind = kind or store_kind
        if kind == "local":
            location = StoreLocation("local", str(tmp_path_factory.mktemp(f"store-{label}")))
        else:
            location = new_location(kind, label, store_servers)
        made.append(location)
        return location

    yield make
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
