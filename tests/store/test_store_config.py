"""Storage options are parsed once per store (``StoreConfig.parse``, issue #45): the endpoint
every part of the store uses (requests, the probe record, obstore reads) is the one the
protocol's client uses, and shardlake's own options never reach the filesystem."""

from __future__ import annotations

from typing import Any

import pytest

from shardlake.errors import UsageError
from shardlake.store import Store, open_store
from shardlake.store.backends.options import SHARDLAKE_OPTIONS
from shardlake.store.config import StoreConfig
from shardlake.store.probe import _store_identity

_ENDPOINT_VARIABLES = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
    "STORAGE_EMULATOR_HOST",
)


@pytest.fixture(autouse=True)
def _no_endpoint_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_the_probe_record_names_the_endpoint_botocore_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore drops the environment's endpoints under AWS_IGNORE_CONFIGURED_ENDPOINT_URLS; the
    probe record's identity did not (it named a server the store never talked to)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    assert _store_identity(Store("s3://bucket/root"))["endpoint"] == "http://127.0.0.1:9"
    monkeypatch.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    store = Store("s3://bucket/root")
    assert store.config.endpoint is None
    assert _store_identity(store)["endpoint"] is None
    # Given as a storage option, the endpoint is the store's whatever the environment says.
    given = Store("s3://bucket/root", {"endpoint_url": "http://127.0.0.1:10"})
    assert _store_identity(given)["endpoint"] == "http://127.0.0.1:10"


@pytest.mark.parametrize(
    ("environment", "options"),
    [
        ("127.0.0.1:4443", {}),
        ("http://127.0.0.1:4443/", {}),
        ("https://gcs.example", {}),
        ("127.0.0.1:1", {"endpoint_url": "http://127.0.0.1:4443"}),
        (None, {"endpoint_url": "http://127.0.0.1:4443/"}),
    ],
)
def test_obstore_reads_gcs_where_gcsfs_does(
    environment: str | None, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("obstore")
    if environment is not None:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", environment)
    store = open_store("gs://bucket/root", {"token": "anon", **options})
    backend: Any = store.backend
    gcsfs_location = backend.fs._location.rstrip("/")
    assert backend.fast_reads._config["base_url"] == gcsfs_location
    assert store.config.endpoint is not None
    assert store.config.endpoint.url.rstrip("/") == gcsfs_location
    assert _store_identity(store)["endpoint"].rstrip("/") == gcsfs_location


def test_shardlake_options_are_taken_out_once_and_never_reach_the_filesystem() -> None:
    values = {"read_client": "fsspec", "retry_deadline": "7", "retry_attempt_timeout": 2}
    assert set(values) == SHARDLAKE_OPTIONS  # the one list
    config = StoreConfig.parse("s3", {**values, "anon": True})
    assert config.fs_options == {"anon": True}
    assert (config.read_client, config.retry_deadline, config.retry_attempt_timeout) == (
        "fsspec",
        7.0,
        2.0,
    )
    store = open_store("memory://config", {"retry_deadline": 3, "retry_attempt_timeout": 1})
    assert (store.retry.deadline, store.retry.attempt_timeout) == (3.0, 1.0)
    assert store.storage_options == {}
    assert store.backend.fs.storage_options == {}


def test_a_read_client_the_protocol_lacks_is_refused_when_parsed() -> None:
    with pytest.raises(UsageError, match="read_client='nope'"):
        StoreConfig.parse("s3", {"read_client": "nope"})
    with pytest.raises(UsageError, match="'obstore' reads"):
        StoreConfig.parse("memory", {"read_client": "obstore"})
    assert StoreConfig.parse("gs", {"read_client": "gcsfs"}).read_client == "gcsfs"
