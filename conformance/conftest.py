"""The conformance suite runs on every loopback backend - local, memory, S3 on moto, S3 on
SeaweedFS, GCS on fake-gcs-server, Azure Blob on Azurite - plus a real bucket when
SHARDLAKE_CONFORMANCE_URL is set (see conformance/README.md)."""

import pytest

from shardlake.testing.fixtures import LOOPBACK_KINDS, store_kinds

pytest_plugins = ["shardlake.testing.pytest_plugin"]


@pytest.fixture(params=store_kinds(include_env=True, default=LOOPBACK_KINDS))
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)
