"""The store's one retry policy (#11): classification of real exception objects, the deadline,
inner library retries turned off, and creates whose reply was lost settled by reading back."""

from __future__ import annotations

import errno
import time
from typing import Any

import aiohttp.client_exceptions
import pytest
import requests.exceptions
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    FlexibleChecksumError,
    ReadTimeoutError,
)
from gcsfs.retry import ChecksumError, HttpError
from s3fs.errors import translate_boto_error

import shardlake
from shardlake.errors import (
    AlreadyExistsError,
    OutcomeUnknownError,
    RetriesExhaustedError,
    UsageError,
)
from shardlake.store import RequestCounter, RetryPolicy, Store, open_store
from shardlake.store.backends.base import nested_options
from shardlake.store.classify import Verdict, classify
from shardlake.store.retry import RetryLoop
from shardlake.testing.faults import FaultInjector, FaultPlan
from shardlake.testing.proxy import FaultProxy

FAST = RetryPolicy(attempts=6, base_delay=0.001, max_delay=0.002, deadline=30.0)


def s3_error(code: str, status: int) -> BaseException:
    """What s3fs raises for an S3 error reply: its translation, raised from the ClientError."""
    error = ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "GetObject",
    )
    translated = translate_boto_error(error)
    assert translated.__cause__ is error
    return translated


def payload_error_from_content_length() -> BaseException:
    """What aiohttp raises for a body cut short: ClientPayloadError from ContentLengthError."""
    from aiohttp.http_exceptions import ContentLengthError

    try:
        try:
            raise ContentLengthError("Not enough data to satisfy content length header")
        except ContentLengthError as inner:
            raise aiohttp.client_exceptions.ClientPayloadError("payload not completed") from inner
    except aiohttp.client_exceptions.ClientPayloadError as outer:
        return outer


CASES = [
    # botocore / s3fs
    (FlexibleChecksumError(error_msg="Expected checksum AAAA did not match BBBB"), "transient"),
    (s3_error("InternalError", 500), "ambiguous"),  # OSError(EREMOTEIO)
    (s3_error("SlowDown", 503), "transient"),  # OSError(EBUSY)
    (s3_error("ServiceUnavailable", 503), "transient"),
    (s3_error("AccessDenied", 403), "permanent"),
    (s3_error("InvalidAccessKeyId", 403), "permanent"),
    (s3_error("NoSuchKey", 404), "permanent"),
    (s3_error("InvalidArgument", 400), "permanent"),
    (ReadTimeoutError(endpoint_url="http://127.0.0.1:1/b/k"), "ambiguous"),
    (ConnectionClosedError(endpoint_url="http://127.0.0.1:1/b/k"), "ambiguous"),
    (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), "transient"),
    (ConnectTimeoutError(endpoint_url="http://127.0.0.1:1"), "transient"),
    (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), "ambiguous"),
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), "transient"),
    # gcsfs / aiohttp / requests
    (HttpError({"code": 500, "message": "backend error"}), "ambiguous"),
    (HttpError({"code": 503, "message": "unavailable"}), "transient"),
    (HttpError({"code": 429, "message": "rate limit"}), "transient"),
    (HttpError({"code": 400, "message": "bad"}), "permanent"),
    (requests.exceptions.ProxyError(), "transient"),  # gcsfs' HTTP 502
    (ChecksumError("md5 mismatch"), "transient"),
    (aiohttp.client_exceptions.ServerDisconnectedError(), "ambiguous"),
    (aiohttp.client_exceptions.ClientPayloadError("truncated"), "ambiguous"),
    (payload_error_from_content_length(), "ambiguous"),  # its cause carries code 400
    # local disk and NFS
    (OSError(errno.ESTALE, "Stale file handle"), "transient"),
    (OSError(errno.EIO, "Input/output error"), "ambiguous"),
    (OSError(errno.ENOSPC, "No space left on device"), "permanent"),
    (FileNotFoundError(errno.ENOENT, "No such file"), "permanent"),
    (PermissionError(errno.EACCES, "Permission denied"), "permanent"),
]


@pytest.mark.parametrize(("exc", "verdict"), CASES, ids=lambda x: type(x).__name__)
def test_classification_of_real_exceptions(exc: BaseException, verdict: str) -> None:
    assert classify(exc) is Verdict(verdict)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds + 0.5  # every attempt costs half a second too


def test_deadline_bounds_attempts_and_pauses() -> None:
    clock = FakeClock()
    policy = RetryPolicy(base_delay=1.0, max_delay=4.0, deadline=20.0)
    loop = RetryLoop(policy, lambda: "read s3://b/k", sleep=clock.sleep, clock=clock)
    with pytest.raises(RetriesExhaustedError) as caught:
        while True:
            loop.backoff(ConnectionResetError(errno.ECONNRESET, "reset"))
    # No pause runs past the deadline and the last attempt starts before it (an attempt itself
    # is bounded by attempt_timeout: the worst case is deadline + attempt_timeout).
    assert clock.now - 0.5 <= 20.0 and len(clock.slept) >= 5
    assert "deadline 20s" in str(caught.value) and "read s3://b/k" in str(caught.value)


def test_deadline_from_environment_and_storage_option(monkeypatch) -> None:
    monkeypatch.setenv("SHARDLAKE_RETRY_DEADLINE", "7.5")
    store = open_store("memory://deadline")
    assert store.retry.deadline == 7.5 and store.retry.attempts is None
    store = open_store("memory://deadline", {"retry_deadline": 3, "retry_attempt_timeout": 2})
    assert (store.retry.deadline, store.retry.attempt_timeout) == (3.0, 2.0)
    assert "retry_deadline" not in store.storage_options  # consumed, never handed to fsspec
    with pytest.raises(UsageError):
        open_store("memory://deadline", {"retry_deadline": "soon"})
    monkeypatch.setenv("SHARDLAKE_RETRY_DEADLINE", "0")
    with pytest.raises(UsageError):
        open_store("memory://deadline")


def test_inner_library_retries_are_off(store_servers) -> None:
    s3 = store_servers.get("s3")
    store = open_store(s3.url("inner"), dict(s3.storage_options, retry_attempt_timeout=7))
    config = store.fs.config_kwargs
    assert config["retries"] == {"total_max_attempts": 1, "mode": "standard"}
    assert config["read_timeout"] == config["connect_timeout"] == 7.0
    assert store.fs.retries == 1
    gcs = store_servers.get("gcs")
    fs = open_store(gcs.url("inner"), gcs.storage_options).fs
    assert fs.requests_timeout.sock_read == 30.0
    short = open_store(s3.url("inner"), dict(s3.storage_options, retry_deadline=4))
    assert short.fs.config_kwargs["read_timeout"] == 4.0  # never longer than the deadline
    assert type(fs).__name__ == "SingleTryGCSFileSystem"


def test_nested_options_keep_the_users_settings_but_not_over_forced_ones() -> None:
    user = {"key": "k", "config_kwargs": {"read_timeout": 9, "retries": {"total_max_attempts": 5}}}
    out = nested_options(
        user, "config_kwargs", {"read_timeout": 3, "connect_timeout": 3}, {"retries": "one"}
    )
    assert out == {
        "key": "k",
        "config_kwargs": {"read_timeout": 9, "connect_timeout": 3, "retries": "one"},
    }
    assert user["config_kwargs"] == {"read_timeout": 9, "retries": {"total_max_attempts": 5}}
    assert nested_options({"client_kwargs": None}, "client_kwargs", {"timeout": 1}) == {
        "client_kwargs": {"timeout": 1}
    }


def lossy(store: Store, *plans: FaultPlan) -> tuple[Store, RequestCounter]:
    counter = RequestCounter()
    layers = [FaultInjector(plan) for plan in plans]
    return store.with_retry(FAST).with_layers(counter, *layers), counter


LOST_CREATE_REPLY = FaultPlan(lost_reply_rate=1.0, max_consecutive=1, ops=("create",))


def test_lost_create_reply_settled_by_a_retried_read_back() -> None:
    # The create lands but its reply is lost; the re-sent create is refused; the first two
    # read-backs fail too.  A single unretried read-back called this a lost race (#11).
    flaky_reads = FaultPlan(fail_rate=1.0, max_consecutive=2, ops=("stat", "read"))
    store, counter = lossy(open_store("memory://settle"), LOST_CREATE_REPLY, flaky_reads)
    store.create("commits/1", b"mine")
    assert counter.requests["create"] == 2 and counter.failures["stat"] == 2
    assert store.read("commits/1") == b"mine"


class DamagedReads:
    """A layer that flips the first byte of the first ``count`` whole-object reads (a reply
    damaged in transit, on a connection without checksums)."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __call__(self, request: Any, send: Any) -> Any:
        result = send()
        if request.op == "read" and self.count > 0:
            self.count -= 1
            return bytes([result[0] ^ 0xFF]) + result[1:]
        return result


def test_lost_create_reply_with_a_damaged_read_back_is_still_ours() -> None:
    # The create lands, its reply is lost, the re-sent create is refused, and the read-back
    # arrives damaged: that is our record, not another writer's (a rerun of pack through a
    # faulty network once said "published by another writer; nothing was published").
    store, _ = lossy(open_store("memory://damaged"), LOST_CREATE_REPLY)
    store.with_layers(DamagedReads(1), *store.layers).create("commits/1", b"mine")
    # Reads that never agree leave the outcome open; a real other writer is still refused.
    unsure, _ = lossy(open_store("memory://unsure"), LOST_CREATE_REPLY)
    with pytest.raises(OutcomeUnknownError, match="outcome unknown"):
        unsure.with_layers(_EveryReadDiffers(), *unsure.layers).create("commits/1", b"mine")
    base = open_store("memory://theirs")
    base.create("commits/1", b"them")
    theirs, _ = lossy(base, LOST_CREATE_REPLY)
    with pytest.raises(AlreadyExistsError):
        theirs.create("commits/1", b"mine")


class _EveryReadDiffers:
    """A layer whose whole-object reads all come back damaged, each a different way."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, request: Any, send: Any) -> Any:
        result = send()
        if request.op == "read":
            self.n += 1
            return bytes([(result[0] + self.n) % 256]) + result[1:]
        return result


def test_lost_create_reply_that_cannot_be_read_back_is_outcome_unknown() -> None:
    dead_reads = FaultPlan(fail_rate=1.0, ops=("stat", "read"))
    store, _ = lossy(open_store("memory://unknown"), LOST_CREATE_REPLY, dead_reads)
    with pytest.raises(OutcomeUnknownError) as caught:
        store.create("commits/1", b"mine")
    assert "outcome unknown" in str(caught.value) and "commits/1" in str(caught.value)


def test_clean_refusal_stays_a_refusal_when_reads_fail() -> None:
    base = open_store("memory://refusal")
    base.create("commits/1", b"theirs")
    store, _ = lossy(base, FaultPlan(fail_rate=1.0, ops=("stat", "read")))
    with pytest.raises(AlreadyExistsError):
        store.create("commits/1", b"mine")


def test_create_that_never_landed_is_a_plain_failure() -> None:
    base = open_store("memory://never")
    store, _ = lossy(base, FaultPlan(fail_rate=1.0, ops=("create",)))
    with pytest.raises(RetriesExhaustedError):
        store.create("commits/1", b"mine")
    assert base.list() == []


def test_capability_probe_survives_lost_replies_and_bad_reads() -> None:
    flaky = FaultPlan(fail_rate=0.5, seed=4, max_consecutive=2, ops=("stat", "read", "delete"))
    store, _ = lossy(open_store("memory://probe"), LOST_CREATE_REPLY, flaky)
    store.ensure_create_enforced()  # no CapabilityError: the store does enforce create


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_s3_creates_through_lost_replies_and_5xx(store_servers, seed: int) -> None:
    s3 = store_servers.get("s3")
    with FaultProxy(
        s3.endpoint_url, rate=0.4, seed=seed, kinds=("500", "503", "lost_reply")
    ) as proxy:
        options = proxy.storage_options(s3.storage_options)
        store = open_store(s3.url(f"lossy-{seed}"), options, retry=FAST)
        for i in range(8):
            store.create(f"commits/{i}", f"record {i}".encode())
        for i in range(8):
            with pytest.raises(AlreadyExistsError):
                store.create(f"commits/{i}", b"another writer")
            assert store.read(f"commits/{i}") == f"record {i}".encode()
        assert proxy.injected["lost_reply"] > 0 and proxy.injected["500"] > 0


def test_stalled_endpoint_fails_within_the_deadline(store_servers) -> None:
    s3 = store_servers.get("s3")
    with FaultProxy(s3.endpoint_url, rate=0.0, stall_s=60) as proxy:
        proxy.stall_all = True
        options = dict(
            proxy.storage_options(s3.storage_options), retry_deadline=3, retry_attempt_timeout=1
        )
        store = open_store(s3.url("stalled"), options)
        started = time.monotonic()
        with pytest.raises(RetriesExhaustedError) as caught:
            store.read("k")
        elapsed = time.monotonic() - started
    assert elapsed < 6.0, elapsed
    assert "deadline 3s" in str(caught.value)


class LoseCommitReply:
    """A layer that lets the first commit record's create land, loses its reply, and fails every
    later read of that record (a flaky network right after the publishing request)."""

    def __init__(self) -> None:
        self.lost: set[str] = set()

    def __call__(self, request, send):
        if request.key in self.lost and request.op in ("stat", "read", "exists"):
            raise ConnectionResetError(errno.ECONNRESET, f"injected: {request.op} lost")
        if request.op == "create" and request.key.startswith("commits/") and not self.lost:
            send()
            self.lost.add(request.key)
            raise ConnectionResetError(errno.ECONNRESET, "injected: create reply lost")
        return send()


def test_unsettled_publish_says_outcome_unknown(tmp_path) -> None:
    from support.pack import make_source, small_frame

    from shardlake.meta.commits import read_state

    src = make_source(tmp_path / "src", {f"log{i}/s0": small_frame(i) for i in range(2)})
    plain = open_store(str(tmp_path / "root"))
    store = plain.with_retry(RetryPolicy(attempts=3, base_delay=0.001)).with_layers(
        LoseCommitReply()
    )
    with pytest.raises(OutcomeUnknownError) as caught:
        shardlake.open(store).pack(src, tag="v1", executor="inline")
    message = str(caught.value)
    assert "outcome unknown; run `shardlake versions` to see whether v1 exists" in message
    assert "nothing was published" not in message
    assert "v1" in read_state(plain).versions  # it was in fact published


@pytest.mark.parametrize("seed", [1, 2])
def test_silently_truncated_ranges_are_read_again(store_servers, seed: int) -> None:
    # The proxy sends half the body with a matching Content-Length: the HTTP layer sees a
    # complete reply. A short range inside the object is retried, never returned.
    s3 = store_servers.get("s3")
    blob = bytes(range(256)) * 400  # 102400 bytes
    open_store(s3.url(f"trunc-{seed}"), s3.storage_options).write("blob", blob)
    with FaultProxy(s3.endpoint_url, rate=0.5, seed=seed, kinds=("truncate",)) as proxy:
        store = open_store(
            s3.url(f"trunc-{seed}"),
            proxy.storage_options(s3.storage_options),
            retry=RetryPolicy(base_delay=0.001, max_delay=0.01, deadline=30),
        )
        for start in range(0, 100000, 9999):
            assert store.read_range("blob", start, start + 5000) == blob[start : start + 5000]
        ranges = [("blob", s, s + 3000) for s in range(0, 99000, 7000)]
        assert store.read_ranges(ranges) == [blob[s:e] for _, s, e in ranges]
        assert store.read_range("blob", 100000, 200000) == blob[100000:]  # clipped, not short
        assert proxy.injected["truncate"] > 0


def test_streaming_upload_parts_are_retried(store_servers) -> None:
    # Every request of a multipart upload (create, parts, complete) meets 500s and 503s.
    s3 = store_servers.get("s3")
    part = int(s3.storage_options["default_block_size"])
    blob = bytes(range(256)) * (2 * part // 256 + 100)
    with FaultProxy(s3.endpoint_url, rate=0.4, seed=5, kinds=("500", "503")) as proxy:
        options = proxy.storage_options(s3.storage_options)
        store = open_store(s3.url("streamed"), options, retry=FAST)
        with store.open_writer("shard.tar") as out:
            for start in range(0, len(blob), 1 << 20):
                out.write(blob[start : start + (1 << 20)])
        assert proxy.injected["500"] + proxy.injected["503"] > 0
    assert open_store(s3.url("streamed"), s3.storage_options).read("shard.tar") == blob
