"""Shared fixtures: run any test on every store backend (see shardlake.testing.fixtures)."""

from shardlake.testing.fixtures import (  # noqa: F401 - pytest finds fixtures by name
    store,
    store_factory,
    store_kind,
    store_location,
    store_servers,
    store_url,
)
