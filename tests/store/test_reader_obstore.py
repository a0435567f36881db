"""Reads through obstore on S3, GCS and Azure (the default where installed;
``read_client="fsspec"`` opts out), everything else (and edge cases) on the fsspec client."""

from __future__ import annotations

import multiprocessing
import os
import warnings
from pathlib import Path
from typing import Any

import pytest

from shardlake.errors import KeyNotFoundError, UsageError
from shardlake.store import ReadClientWarning, RequestCounter, open_store
from shardlake.store.backends import obstore as obstore_backend
from shardlake.store.backends.obstore import obstore_config, obstore_config_or_reason
from shardlake.testing.faults import FaultInjector, FaultPlan
from shardlake.testing.fixtures import StoreLocation, new_location


def _child_read(store: Any, queue: Any) -> None:
    queue.put(store.read_ranges([("b", 0, 4)]))


@pytest.fixture(params=["s3", "gcs", "azure"])
def s3(request: pytest.FixtureRequest, store_servers: Any) -> StoreLocation:
    """A fresh location on each object store obstore reads (S3 on moto, fake-gcs-server,
    Azurite)."""
    return new_location(request.param, "obstore", store_servers)


def test_reads_go_through_obstore(s3: StoreLocation) -> None:
    store = open_store(s3.url, {**s3.storage_options, "read_client": "obstore"})
    store.create("a/blob", bytes(range(256)) * 100)
    backend: Any = store.backend
    assert backend.fast_reads is not None

    def no_fsspec(*_: Any, **__: Any) -> Any:
        raise AssertionError("read through the fsspec client")

    backend.fs.cat_ranges = no_fsspec  # the fast path must answer alone
    data = bytes(range(256)) * 100
    got = store.read_ranges([("a/blob", 0, 10), ("a/blob", 300, 9000), ("a/blob", 25000, 25600)])
    assert got == [data[0:10], data[300:9000], data[25000:25600]]


def test_the_given_endpoint_wins_over_the_environment(
    store_servers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """obstore reads AWS_ENDPOINT_URL_S3 over its own endpoint: reads went to another server
    (another loopback server's variables in this environment) and fell back to s3fs."""
    s3 = new_location("s3", "endpoint", store_servers)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    store = open_store(s3.url, s3.storage_options)
    store.write("e/blob", b"0123456789")
    backend: Any = store.backend

    def no_fsspec(*_: Any, **__: Any) -> Any:
        raise AssertionError("read through the fsspec client")

    backend.fs.cat_ranges = no_fsspec
    assert store.read_ranges([("e/blob", 2, 6)]) == [b"2345"]


def test_views_are_obstore_buffers_without_a_copy(s3: StoreLocation) -> None:
    store = open_store(s3.url, {**s3.storage_options, "read_client": "obstore"})
    data = bytes(range(256)) * 100
    store.create("v/blob", data)
    ranges = [("v/blob", 0, 10), ("v/blob", 300, 9000)]
    views = store.read_ranges(ranges, views=True)
    # The loader's path: read-only views of obstore's own buffers, the same bytes.
    assert all(isinstance(v, memoryview) and v.readonly for v in views)
    assert [bytes(v) for v in views] == [data[0:10], data[300:9000]]
    # Every other caller still gets bytes.
    assert all(type(b) is bytes for b in store.read_ranges(ranges))
    # A fault layer that damages replies handles views too (the loader's reads under test).
    flipped = store.with_layers(FaultInjector(FaultPlan(flip_reads=1)))
    assert bytes(flipped.read_ranges(ranges[:1], views=True)[0]) == bytes([0xFF]) + data[1:10]


def test_edge_cases_keep_the_store_semantics(s3: StoreLocation) -> None:
    store = open_store(s3.url, {**s3.storage_options, "read_client": "obstore"})
    store.write("b", b"0123456789")
    # Past the end is clipped, a missing key is KeyNotFoundError: the fsspec path answers both.
    assert store.read_ranges([("b", 5, 50), ("b", 20, 30)]) == [b"56789", b""]
    with pytest.raises(KeyNotFoundError):
        store.read_ranges([("missing", 0, 4)])
    # A child forked after this process started obstore's runtime reads through fsspec.
    ctx = multiprocessing.get_context("fork")
    queue: Any = ctx.Queue()
    child = ctx.Process(target=_child_read, args=(store, queue))
    child.start()
    assert queue.get(timeout=60) == [b"0123"]
    child.join(timeout=30)
    assert child.exitcode == 0
    with pytest.raises(UsageError, match="read_client"):
        open_store("memory://x", {"read_client": "obstore"}).list()


def test_obstore_is_the_default_read_client_and_fsspec_can_be_chosen(s3: StoreLocation) -> None:
    default: Any = open_store(s3.url, s3.storage_options).backend
    assert default.fast_reads is not None  # obstore is installed in the test environment
    own_name = {"s3": "s3fs", "gcs": "gcsfs", "azure": "adlfs"}[s3.kind]
    for name in ("fsspec", own_name):
        pinned: Any = open_store(s3.url, {**s3.storage_options, "read_client": name}).backend
        assert pinned.fast_reads is None
    with pytest.raises(UsageError, match="read_client='nope'"):
        open_store(s3.url, {**s3.storage_options, "read_client": "nope"}).list()
    # Other protocols keep their fsspec client.
    assert getattr(open_store("memory://x").backend, "fast_reads", None) is None


def test_credentials_obstore_cannot_use_keep_the_fsspec_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Options obstore cannot sign with map to None (the fsspec client reads), and asking for
    obstore then is a clear error, not a silent fall-back on every read."""
    assert obstore_config("gs", {"token": "anon", "endpoint_url": "http://127.0.0.1:1"}) == {
        "base_url": "http://127.0.0.1:1",
        "skip_signature": True,
    }
    assert obstore_config("gs", {"token": {"type": "authorized_user"}}) is None
    assert obstore_config("gs", {"token": "/no/such/credentials.json"}) is None
    assert obstore_config("gs", {"requester_pays": True}) is None
    # No token: the default credentials file where google.auth finds it, else gcsfs (which
    # would go on to the metadata server and anonymous access).
    creds = tmp_path / "adc.json"
    creds.write_text("{}")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(creds))
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:3")
    assert obstore_config("gs", {}) == {
        "base_url": "http://127.0.0.1:3",
        "application_credentials": str(creds),
    }
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))
    assert obstore_config("gs", {"token": None}) is None
    text = (
        "DefaultEndpointsProtocol=http;AccountName=acct;AccountKey=a2V5;"
        "BlobEndpoint=http://127.0.0.1:2/acct;"
    )
    assert obstore_config("az", {"connection_string": text}) == {
        "account_name": "acct",
        "account_key": "a2V5",
        "endpoint": "http://127.0.0.1:2/acct",
    }
    assert obstore_config("az", {"account_name": "acct", "sas_token": "?sv=1&sig=x"}) == {
        "account_name": "acct",
        "sas_key": "sv=1&sig=x",
    }
    assert obstore_config("az", {"account_name": "acct", "credential": object()}) is None
    assert obstore_config("az", {"account_name": "acct"}) is None  # DefaultAzureCredential
    with pytest.raises(UsageError, match="obstore cannot sign for gs://"):
        open_store(
            "gs://bucket/x", {"token": {"type": "authorized_user"}, "read_client": "obstore"}
        )


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_an_http_endpoint_given_only_in_the_environment_is_read_through_obstore(
    variable: str, store_servers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#31 item 4: as botocore, obstore takes the endpoint from the environment; an http one
    built obstore without allow_http (every read failed with 'builder error' and went to s3fs
    without a word)."""
    s3 = new_location("seaweedfs", "env-endpoint", store_servers)
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(
        "AWS_ENDPOINT_URL_S3" if variable == "AWS_ENDPOINT_URL" else "AWS_ENDPOINT_URL"
    )
    assert os.environ[variable].startswith("http://")
    counter = RequestCounter()
    store = open_store(s3.url).with_layers(counter)  # no storage options at all
    data = bytes(range(256)) * 40
    store.write("env/blob", data)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReadClientWarning)  # no fall-back, silent or not
        got = store.read_ranges([("env/blob", 0, 10), ("env/blob", 500, 9000)])
        assert store.read_ranges([("env/blob", 100, 200)]) == [data[100:200]]
    assert got == [data[0:10], data[500:9000]]
    assert counter.read_clients == {"obstore": 2}


def test_a_fall_back_to_the_fsspec_client_is_said_once_per_process(
    store_servers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = new_location("seaweedfs", "fallback", store_servers)
    counter = RequestCounter()
    store = open_store(s3.url, s3.storage_options).with_layers(counter)
    store.write("f/blob", b"0123456789")
    backend: Any = store.backend

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("Generic S3 error: HTTP error: builder error")

    monkeypatch.setattr(backend.fast_reads, "read_ranges", broken)
    monkeypatch.setattr(obstore_backend, "_warned_pid", None)
    with pytest.warns(ReadClientWarning) as caught:
        for _ in range(3):
            assert store.read_ranges([("f/blob", 2, 6)]) == [b"2345"]
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "reads of s3:// go through s3fs, not obstore" in message
    assert "builder error" in message
    assert counter.read_clients == {"fsspec": 3}


def test_credentials_only_a_profile_holds_keep_s3fs_and_say_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    credentials = tmp_path / "credentials"
    credentials.write_text("[work]\naws_access_key_id = AKIA\naws_secret_access_key = s\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_PROFILE", "work")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    reason = obstore_config_or_reason("s3", {"endpoint_url": "http://127.0.0.1:1"})
    assert isinstance(reason, str) and "AWS profile" in reason
    # A key in the environment is what botocore signs with first: obstore reads it too.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA")
    config = obstore_config_or_reason("s3", {"endpoint_url": "http://127.0.0.1:1"})
    assert isinstance(config, dict) and config["endpoint"] == "http://127.0.0.1:1"


def test_profile_credentials_are_said_at_the_first_read_obstore_would_have_served(
    store_servers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = new_location("seaweedfs", "profile", store_servers)
    credentials = tmp_path / "credentials"
    credentials.write_text("[default]\naws_access_key_id = k\naws_secret_access_key = s\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    monkeypatch.setattr(obstore_backend, "_warned_pid", None)
    options = {k: v for k, v in s3.storage_options.items() if k not in ("key", "secret")}
    counter = RequestCounter()
    store = open_store(s3.url, options).with_layers(counter)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReadClientWarning)  # writes and listings: nothing to say
        store.write("p/blob", b"0123456789")
        assert store.list("p") == ["p/blob"]
    with pytest.warns(ReadClientWarning, match=r"credentials come from an AWS profile"):
        assert store.read_ranges([("p/blob", 2, 6)]) == [b"2345"]
    assert counter.read_clients == {"fsspec": 1}
