"""Fresh store locations on every backend, for tests and conformance runs (no pytest here).

The pytest fixtures built on these live in :mod:`shardlake.testing.pytest_plugin`, which
``tests/conftest.py`` and ``conformance/conftest.py`` load with ``pytest_plugins``; any test can
ask for:

* ``store_kind`` - parametrised over every loopback kind (:data:`LOOPBACK_KINDS`) by default:
  ``local``, ``memory``, ``s3`` (moto), ``gcs`` (fake-gcs-server), ``seaweedfs`` (a real
  S3-compatible store) and ``azure`` (Azurite); ``SHARDLAKE_STORE_KINDS`` (``all`` or a comma
  list) chooses another default set.  Narrow it per test with
  ``@pytest.mark.parametrize("store_kind", ["local", "s3"])``.
* ``store_location`` - a :class:`StoreLocation` (url, storage_options, env) for a fresh, empty
  prefix of that backend; ``store_url`` is its URL and ``store`` the opened :class:`Store`.
* ``store_factory`` - ``store_factory(kind=None, label="t")`` makes further fresh locations
  (e.g. an export target), defaulting to the test's ``store_kind``.
* ``store_servers`` - the session's lazily started loopback servers; ``seaweedfs_server`` and
  ``azurite_server`` are two of them (each a :class:`~shardlake.testing.servers.StoreServer`).

Servers start on first use only (a local-only run starts none) and are shared by every conftest
in the process; they stop when the interpreter exits.  While they run, their settings are also
in ``os.environ`` (``AWS_ENDPOINT_URL``, ``STORAGE_EMULATOR_HOST``,
``AZURE_STORAGE_CONNECTION_STRING``...), so a bare ``open_store("s3://...")`` or a CLI subprocess
reaches them too.  SeaweedFS's ``AWS_*`` settings would redirect moto's, so they are in
``os.environ`` only during a test whose ``store_kind`` is ``seaweedfs`` (and always in
:attr:`StoreLocation.env`).

With ``SHARDLAKE_CONFORMANCE_URL`` set, :func:`store_kinds` adds the kind ``env``: a fresh prefix
under that URL (``SHARDLAKE_CONFORMANCE_STORAGE_OPTIONS`` may hold JSON storage options).
"""

from __future__ import annotations

import atexit
import json
import os
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..store import Store, open_store
from .servers import StoreServers

# Every kind that runs on this machine; DEFAULT_KINDS is what ``store_kind`` covers by default:
# all of them (a test narrows it where a backend adds nothing, see tests/).
LOOPBACK_KINDS = ("local", "memory", "s3", "gcs", "seaweedfs", "azure")
DEFAULT_KINDS = LOOPBACK_KINDS
SERVER_KINDS = ("s3", "gcs", "seaweedfs", "azure")
ENV_URL = "SHARDLAKE_CONFORMANCE_URL"
ENV_OPTIONS = "SHARDLAKE_CONFORMANCE_STORAGE_OPTIONS"
ENV_KINDS = "SHARDLAKE_STORE_KINDS"

_shared: StoreServers | None = None


def shared_servers() -> StoreServers:
    """The process-wide lazily started servers (stopped at interpreter exit)."""
    global _shared
    if _shared is None:
        _shared = StoreServers()
        atexit.register(_shared.close)
    return _shared


def store_kinds(
    *, include_env: bool = False, default: tuple[str, ...] = DEFAULT_KINDS
) -> list[str]:
    """The store kinds to run on: ``SHARDLAKE_STORE_KINDS`` (``all``, or a comma list of
    :data:`LOOPBACK_KINDS`) or else ``default``; plus ``env`` when ``include_env`` and
    ``SHARDLAKE_CONFORMANCE_URL`` is set."""
    chosen = os.environ.get(ENV_KINDS, "").strip()
    if chosen == "all":
        kinds = list(LOOPBACK_KINDS)
    elif chosen:
        kinds = [kind.strip() for kind in chosen.split(",") if kind.strip()]
        unknown = sorted(set(kinds) - set(LOOPBACK_KINDS))
        if unknown:
            raise ValueError(
                f"{ENV_KINDS}: unknown store kind(s) {', '.join(unknown)}: use 'all' or some of "
                f"{', '.join(LOOPBACK_KINDS)}"
            )
    else:
        kinds = list(default)
    if include_env and os.environ.get(ENV_URL):
        kinds.append("env")
    return kinds


@dataclass(frozen=True)
class StoreLocation:
    """A fresh empty place to put a store: URL plus what it takes to open it."""

    kind: str
    url: str
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False)
    env: dict[str, str] = field(default_factory=dict, repr=False)

    def open(self, **kwargs: Any) -> Store:
        return open_store(self.url, self.storage_options, **kwargs)


def new_location(kind: str, label: str = "t", servers: StoreServers | None = None) -> StoreLocation:
    """A fresh, empty prefix on backend ``kind`` (outside pytest too)."""
    tag = f"{label}-{uuid.uuid4().hex[:12]}"
    if kind == "local":
        return StoreLocation(kind, tempfile.mkdtemp(prefix=f"shardlake-{tag}-"))
    if kind == "memory":
        return StoreLocation(kind, f"memory://{tag}")
    if kind in SERVER_KINDS:
        server = (servers or shared_servers()).get(kind)
        return StoreLocation(kind, server.url(tag), dict(server.storage_options), dict(server.env))
    if kind == "env":
        base = os.environ.get(ENV_URL, "")
        if not base:
            raise ValueError(f"store kind 'env' needs {ENV_URL}")
        options = json.loads(os.environ.get(ENV_OPTIONS) or "{}")
        return StoreLocation(kind, f"{base.rstrip('/')}/{tag}", options)
    raise ValueError(f"unknown store kind {kind!r}: one of {', '.join(LOOPBACK_KINDS)}, env")


def cleanup_location(location: StoreLocation) -> None:
    # Loopback servers keep everything in memory and die with the session; a local dir lives in
    # pytest's tmp area.  Only a real bucket needs tidying.
    if location.kind != "env":
        return
    store = location.open()
    for key in store.list():
        store.delete(key)


__all__ = [
    "DEFAULT_KINDS",
    "ENV_KINDS",
    "ENV_OPTIONS",
    "ENV_URL",
    "LOOPBACK_KINDS",
    "SERVER_KINDS",
    "StoreLocation",
    "cleanup_location",
    "new_location",
    "shared_servers",
    "store_kinds",
]
