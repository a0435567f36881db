"""shardlake's own backends run the StoreConformance kit (shardlake.testing.conformance) on
every loopback backend - local, memory, S3 (moto), S3 (SeaweedFS), GCS (fake-gcs-server),
Azure Blob (Azurite) - and on a real bucket when SHARDLAKE_CONFORMANCE_URL is set."""

from collections.abc import Callable

import pytest

from shardlake.store import Store
from shardlake.testing.conformance import StoreConformance
from shardlake.testing.fixtures import StoreLocation


class TestBackends(StoreConformance):
    @pytest.fixture
    def store(self, store_location: StoreLocation) -> Store:
        return store_location.open()

    @pytest.fixture
    def new_store(self, store_factory: Callable[..., StoreLocation]) -> Callable[[], Store]:
        return lambda: store_factory(label="copy").open()
