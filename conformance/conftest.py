"""The conformance suite runs on every loopback backend, plus a real bucket when
SHARDLAKE_CONFORMANCE_URL is set (see conformance/README.md)."""

import pytest

from shardlake.testing.fixtures import store_kinds

pytest_plugins = ["shardlake.testing.pytest_plugin"]


@pytest.fixture(params=store_kinds(include_env=True))
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)
