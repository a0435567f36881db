"""Bad input gives one clear error and writes nothing; errors never carry credentials."""

import errno
import logging
import os

import pytest

from shardlake.errors import (
    AlreadyExistsError,
    CapabilityError,
    InvalidKeyError,
    InvalidURLError,
    KeyNotFoundError,
    RetriesExhaustedError,
    ShardlakeError,
    StoreError,
    StorePermissionError,
    UsageError,
)
from shardlake.store import RequestCounter, RetryPolicy, open_store
from shardlake.testing.faults import FaultInjector, FaultPlan

SECRET = "SUPERSECRET-9f3a"


def test_error_hierarchy() -> None:
    assert issubclass(KeyNotFoundError, FileNotFoundError)
    assert issubclass(AlreadyExistsError, FileExistsError)
    assert issubclass(StorePermissionError, PermissionError)
    for cls in (KeyNotFoundError, AlreadyExistsError, StorePermissionError, RetriesExhaustedError):
        assert issubclass(cls, StoreError) and issubclass(cls, ShardlakeError)
    assert issubclass(StoreError, OSError)
    assert issubclass(InvalidURLError, UsageError) and issubclass(InvalidURLError, ValueError)
    assert issubclass(InvalidKeyError, UsageError)


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("foo://bucket/x", "unknown store protocol 'foo'"),
        ("data/store", "relative"),
        ("./store", "relative"),
        ("file://relative/path", "file:///absolute/path"),
        ("s3://", "names no bucket"),
        ("gs:///", "names no bucket"),
        ("", "empty"),
        ("s3://bucket/a/../b", "'..'"),
        ("s3://bucket/p?versionId=1", "query"),
    ],
)
def test_bad_url_is_one_clear_error(url: str, fragment: str) -> None:
    with pytest.raises(InvalidURLError) as caught:
        open_store(url)
    assert fragment in str(caught.value)


def test_relative_path_error_suggests_absolute(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidURLError) as caught:
        open_store("data")
    assert str(tmp_path / "data") in str(caught.value)
    assert not (tmp_path / "data").exists()


def test_credentials_in_url_are_refused_and_redacted() -> None:
    with pytest.raises(InvalidURLError) as caught:
        open_store(f"s3://AKIAEXAMPLE:{SECRET}@bucket/prefix")
    assert SECRET not in str(caught.value)
    assert "storage_options" in str(caught.value)


def test_missing_package_names_the_extra() -> None:
    with pytest.raises(UsageError) as caught:
        open_store("abfs://container/prefix")  # adlfs is not a shardlake dependency
    assert "missing package" in str(caught.value)


@pytest.mark.parametrize(
    "key",
    ["../escape", "a/../../b", "/abs/key", "", "a//b", "a/./b", "a\\b", "a/", "x/.shardlake-tmp-1"],
)
def test_bad_key_is_refused_and_nothing_written(store, key: str) -> None:
    for attempt in (
        lambda: store.write(key, b"x"),
        lambda: store.create(key, b"x"),
        lambda: store.read(key),
        lambda: store.delete(key),
    ):
        with pytest.raises(InvalidKeyError) as caught:
            attempt()
        assert repr(key) in str(caught.value)
    with pytest.raises(InvalidKeyError), store.open_writer(key) as out:
        out.write(b"x")
    assert store.list() == []
    if store.protocol == "file":
        assert not os.path.exists(store.root) or os.listdir(store.root) == []


@pytest.mark.parametrize("store_kind", ["s3", "gcs"])
def test_missing_bucket_names_the_bucket(store_servers, store_kind: str) -> None:
    server = store_servers.get(store_kind)
    store = open_store(f"{server.scheme}://no-such-bucket-123/prefix", server.storage_options)
    for attempt in (lambda: store.write("k", b"x"), lambda: store.read("k"), lambda: store.list()):
        with pytest.raises(KeyNotFoundError) as caught:
            attempt()
        assert "bucket 'no-such-bucket-123' does not exist" in str(caught.value)
    assert not open_store(server.url(), server.storage_options).exists("prefix/k")


def test_missing_s3_credentials_say_what_to_set(store_servers, monkeypatch) -> None:
    server = store_servers.get("s3")
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    # Keep botocore off the network and away from any real credentials on this machine.
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    store = open_store(server.url("nocreds"), {"endpoint_url": server.endpoint_url})
    with pytest.raises(StorePermissionError) as caught:
        store.write("k", b"x")
    assert "no credentials" in str(caught.value) and "AWS_ACCESS_KEY_ID" in str(caught.value)
    assert open_store(server.url("nocreds"), server.storage_options).list() == []


def test_secrets_never_in_repr_errors_or_logs(store_servers, caplog) -> None:
    server = store_servers.get("s3")
    options = dict(server.storage_options, secret=SECRET)
    store = open_store(server.url("redact"), options)
    assert SECRET not in repr(store) and SECRET not in str(store) and SECRET not in store.url
    unreachable = dict(options, endpoint_url="http://127.0.0.1:9")
    unreachable["client_kwargs"] = {
        "endpoint_url": "http://127.0.0.1:9",
        "region_name": "us-east-1",
    }
    unreachable["config_kwargs"] = {"retries": {"max_attempts": 1}, "connect_timeout": 1}
    policy = RetryPolicy(attempts=2, base_delay=0.001, max_delay=0.001)
    caplog.set_level(logging.DEBUG)
    messages = []
    for candidate in (
        open_store(server.url("redact"), unreachable, retry=policy),
        open_store(server.url("redact"), options, retry=policy).with_layers(
            FaultInjector(FaultPlan(fail_rate=1.0))
        ),
    ):
        with pytest.raises(StoreError) as caught:
            candidate.read("k")
        messages += [str(caught.value), repr(caught.value), repr(candidate)]
    messages += [record.getMessage() for record in caplog.records]
    assert any("attempt" in m for m in messages)
    assert not [m for m in messages if SECRET in m]


def test_retry_limits_are_configurable(monkeypatch) -> None:
    monkeypatch.setenv("SHARDLAKE_RETRY_ATTEMPTS", "2")
    monkeypatch.setenv("SHARDLAKE_RETRY_BASE_DELAY", "0")
    counter = RequestCounter()
    store = open_store("memory://retry-env").with_layers(
        counter, FaultInjector(FaultPlan(fail_rate=1.0))
    )
    assert store.retry.attempts == 2
    with pytest.raises(RetriesExhaustedError) as caught:
        store.read("k")
    assert "2 attempt(s)" in str(caught.value) and counter.requests["read"] == 2
    monkeypatch.setenv("SHARDLAKE_RETRY_ATTEMPTS", "many")
    with pytest.raises(UsageError):
        open_store("memory://retry-env")
    with pytest.raises(UsageError):
        RetryPolicy(attempts=0)


def test_backoff_is_bounded_and_jittered() -> None:
    policy = RetryPolicy(attempts=10, base_delay=0.1, max_delay=1.0)
    delays = [policy.delay(n) for n in range(1, 10) for _ in range(20)]
    assert all(0 <= d <= 1.0 for d in delays)
    assert len({round(d, 6) for d in delays}) > 100  # jittered, not a fixed schedule
    assert max(policy.delay(1) for _ in range(50)) <= 0.1


def test_local_create_survives_nfs_link_retransmit(tmp_path, monkeypatch) -> None:
    store = open_store(str(tmp_path))
    real_link = os.link

    def link_then_eexist(src, dst):  # NFSv3: the LINK landed, its reply was lost, the retry saw it
        real_link(src, dst)
        raise FileExistsError(errno.EEXIST, "File exists", dst)

    monkeypatch.setattr(os, "link", link_then_eexist)
    store.create("commits/1", b"ours")
    assert store.read("commits/1") == b"ours"
    monkeypatch.setattr(os, "link", real_link)
    with pytest.raises(AlreadyExistsError):
        store.create("commits/1", b"theirs")
    assert sorted(os.listdir(tmp_path / "commits")) == ["1"]  # no temp file left


def test_local_without_hard_links_is_a_capability_error(tmp_path, monkeypatch) -> None:
    def no_links(src, dst):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "link", no_links)
    store = open_store(str(tmp_path))
    with pytest.raises(CapabilityError) as caught:
        store.create("k", b"x")
    assert "hard links" in str(caught.value)
    assert store.list() == [] and os.listdir(tmp_path) == []
