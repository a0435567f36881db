"""Shared fixtures: run any test on every store backend (see shardlake.testing.pytest_plugin)."""

import os

import pytest

# Off unless a test turns it on: request counts must not depend on what an earlier test (or
# the user's ~/.cache) left in the node-local catalog cache (tests/test_catalog_cache.py).
os.environ["SHARDLAKE_CATALOG_CACHE"] = "off"

pytest_plugins = ["shardlake.testing.pytest_plugin"]


@pytest.fixture(params=["threads", "processes"])
def loader_engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a loader test on both engines: the default engine comes from
    ``SHARDLAKE_LOADER_ENGINE``, which DDP ranks started as subprocesses inherit."""
    engine: str = request.param
    monkeypatch.setenv("SHARDLAKE_LOADER_ENGINE", engine)
    return engine
