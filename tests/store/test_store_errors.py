"""Bad input gives one clear error and writes nothing; errors never carry credentials."""

import errno
import logging
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fsspec.registry import _registry as fsspec_classes

import shardlake
from shardlake.errors import (
    AlreadyExistsError,
    BucketNotFoundError,
    CapabilityError,
    CredentialsMissingError,
    CredentialsRejectedError,
    EndpointError,
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
from shardlake.tools.loopback import s3_storage_options

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


def test_missing_package_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "adlfs", None)  # as if the azure extra were not installed
    # fsspec keeps a filesystem class it loaded once (an earlier Azure test in this process).
    for protocol in ("abfs", "az", "abfss"):
        monkeypatch.delitem(fsspec_classes, protocol, raising=False)
    with pytest.raises(UsageError) as caught:
        open_store("abfs://container/prefix", {"skip_instance_cache": True})
    assert "missing package" in str(caught.value)
    assert "shardlake[azure]" in str(caught.value)


# Keys are checked in Store before any backend sees them: two backends prove nothing is written.
@pytest.mark.parametrize("store_kind", ["local", "memory"])
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
    for op, attempt in _every_op(store).items():
        with pytest.raises(BucketNotFoundError) as caught:
            attempt()
        assert not isinstance(caught.value, KeyNotFoundError)  # not an absent key
        assert "bucket 'no-such-bucket-123' does not exist" in str(caught.value), op
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
    with pytest.raises(CredentialsMissingError) as caught:
        store.write("k", b"x")
    assert "credentials missing" in str(caught.value) and "AWS_ACCESS_KEY_ID" in str(caught.value)
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
    assert "2 attempts" in str(caught.value) and counter.requests["read"] == 2
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


class PlainServer:
    """A loopback http.server answering every request the same way: a web page (not S3) or
    an S3 XML error with S3's headers (HEAD replies carry no body, as on S3)."""

    def __init__(self) -> None:
        self.reply: tuple[int, str, bytes, dict[str, str]] = (200, "text/html", b"", {})
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

            def handle_any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                status, ctype, body, headers = owner.reply
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = handle_any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def web_page(self, status: int) -> None:
        self.reply = (status, "text/html", b"<html><body>It works!</body></html>", {})

    def s3_error(self, code: str, status: int = 403) -> None:
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
            f"<Message>{code}</Message><RequestId>R1</RequestId></Error>"
        ).encode()
        self.reply = (status, "application/xml", body, {"x-amz-request-id": "R1"})

    def store(self, secret: str = "not-the-secret"):
        options = dict(s3_storage_options(self.endpoint), secret=secret, retry_deadline=5)
        return open_store("s3://bucket/prefix", options)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def plain_server():
    server = PlainServer()
    yield server
    server.close()


def _every_op(store):
    return {
        "read": lambda: store.read("k"),
        "stat": lambda: store.stat("k"),
        "write": lambda: store.write("k", b"x"),
        "create": lambda: store.create("k", b"x"),
        "list": lambda: store.list(),
    }


@pytest.mark.parametrize("status", [404, 403, 405])
def test_endpoint_that_is_not_s3_says_so(plain_server, status: int) -> None:
    plain_server.web_page(status)
    for op, attempt in _every_op(plain_server.store()).items():
        with pytest.raises(EndpointError) as caught:
            attempt()
        message = str(caught.value)
        assert f"endpoint {plain_server.endpoint} does not speak the S3 API" in message, op
        assert "does not exist" not in message


def test_web_server_answering_200_is_not_s3(plain_server) -> None:
    plain_server.web_page(200)
    with pytest.raises(EndpointError):
        plain_server.store().list()  # every command lists the commit log first


@pytest.mark.parametrize("code", ["InvalidAccessKeyId", "SignatureDoesNotMatch"])
def test_rejected_credentials_are_not_access_denied(plain_server, code: str) -> None:
    plain_server.s3_error(code)
    store = plain_server.store(secret=SECRET)
    for op, attempt in _every_op(store).items():  # HEAD (read/stat) replies have no code
        with pytest.raises(CredentialsRejectedError) as caught:
            attempt()
        assert "credentials rejected" in str(caught.value), op
        assert SECRET not in str(caught.value) and SECRET not in repr(caught.value)


def test_access_denied_names_what_was_denied(plain_server) -> None:
    plain_server.s3_error("AccessDenied")
    for op, attempt in _every_op(plain_server.store()).items():
        with pytest.raises(StorePermissionError) as caught:
            attempt()
        assert not isinstance(caught.value, CredentialsRejectedError), op
        assert "access denied to s3://bucket/prefix" in str(caught.value)


def test_export_to_a_missing_bucket_names_the_bucket(store_servers, tmp_path) -> None:
    from support.pack import make_source, small_frame

    src = make_source(tmp_path / "src", {"log0/s0": small_frame(0)})
    shardlake.open(str(tmp_path / "root")).pack(src, tag="v1", executor="inline")
    server = store_servers.get("s3")
    dest = f"s3://no-such-bucket-456/{tmp_path.name}"
    with pytest.raises(BucketNotFoundError) as caught:
        shardlake.open(str(tmp_path / "root")).export(
            dest, dest_storage_options=server.storage_options
        )
    assert "bucket 'no-such-bucket-456' does not exist" in str(caught.value)
    assert "not a shardlake root" not in str(caught.value)
