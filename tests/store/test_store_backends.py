"""register_backend: a user's own fsspec filesystem behind a Store, proven by the conformance kit."""

from __future__ import annotations

import uuid

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from shardlake.errors import UsageError
from shardlake.store import Store, open_store, register_backend
from shardlake.store.backends import MemoryBackend
from shardlake.testing.conformance import (
    AtomicityConformance,
    BasicConformance,
    RetryConformance,
)


class TeamFileSystem(MemoryFileSystem):  # type: ignore[misc]
    """Stands in for a user's own fsspec filesystem (here: an in-process memory store)."""

    protocol = "teamfs"


class TeamBackend(MemoryBackend):
    """The user's backend: the memory backend's atomic create, on their filesystem."""


fsspec.register_implementation("teamfs", TeamFileSystem, clobber=True)
register_backend("teamfs", TeamBackend)


class TestRegisteredBackend(BasicConformance, AtomicityConformance, RetryConformance):
    shared_across_processes = False  # it lives in this process

    @pytest.fixture
    def store(self) -> Store:
        store = open_store(f"teamfs://conformance-{uuid.uuid4().hex[:12]}")
        assert type(store.backend) is TeamBackend and isinstance(store.fs, TeamFileSystem)
        return store


def test_register_backend_refuses_what_is_not_a_backend() -> None:
    with pytest.raises(UsageError, match="not a subclass"):
        register_backend("teamfs2", TeamFileSystem)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="invalid protocol"):
        register_backend("no such", TeamBackend)
