"""The fault-injecting proxy itself: each fault kind does what it says, on a seeded schedule."""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator

import pytest

from shardlake.testing.proxy import FaultProxy
from shardlake.testing.servers import S3Server, moto_s3_server

BODY = bytes(range(256)) * 64  # 16 KiB


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with moto_s3_server(set_env=False) as server:
        _request(server.endpoint_url, "PUT", f"/{server.bucket}/obj", BODY)
        yield server


def _request(
    endpoint: str, method: str, path: str, body: bytes | None = None, timeout: float = 10
) -> tuple[int, bytes]:
    host, port = endpoint.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        # Public-read objects: moto refuses unsigned reads of private ones.
        headers = {"x-amz-acl": "public-read"} if method == "PUT" else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _proxy(s3: S3Server, kind: str, **kw: float) -> FaultProxy:
    return FaultProxy(s3.endpoint_url, rate=1.0, kinds=[kind], **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kind", "code"), [("500", "InternalError"), ("503", "SlowDown")])
def test_error_replies_are_s3_xml_and_never_reach_the_server(
    s3: S3Server, kind: str, code: str
) -> None:
    with _proxy(s3, kind) as proxy:
        status, body = _request(proxy.endpoint_url, "PUT", f"/{s3.bucket}/e{kind}", b"x")
    assert status == int(kind) and f"<Code>{code}</Code>".encode() in body
    assert _request(s3.endpoint_url, "GET", f"/{s3.bucket}/e{kind}")[0] == 404
    assert proxy.injected == {kind: 1} and proxy.requests == 1


def test_lost_reply_takes_effect_but_never_answers(s3: S3Server) -> None:
    with (
        _proxy(s3, "lost_reply") as proxy,
        pytest.raises((http.client.HTTPException, ConnectionError)),
    ):
        _request(proxy.endpoint_url, "PUT", f"/{s3.bucket}/lost", b"landed")
    assert _request(s3.endpoint_url, "GET", f"/{s3.bucket}/lost") == (200, b"landed")


def test_reset_mid_body(s3: S3Server) -> None:
    with (
        _proxy(s3, "reset") as proxy,
        pytest.raises((http.client.IncompleteRead, ConnectionError)),
    ):
        _request(proxy.endpoint_url, "GET", f"/{s3.bucket}/obj")


def test_silent_truncation_and_flipped_byte(s3: S3Server) -> None:
    with _proxy(s3, "truncate") as proxy:
        status, body = _request(proxy.endpoint_url, "GET", f"/{s3.bucket}/obj")
    assert status == 200 and body == BODY[: len(BODY) // 2]
    with _proxy(s3, "flip") as proxy:
        status, body = _request(proxy.endpoint_url, "GET", f"/{s3.bucket}/obj")
    assert status == 200 and len(body) == len(BODY)
    assert sum(a != b for a, b in zip(body, BODY, strict=True)) == 1
    # A reply without a body cannot be damaged: it becomes a throttle.
    with _proxy(s3, "flip") as proxy:
        assert _request(proxy.endpoint_url, "PUT", f"/{s3.bucket}/f", b"x")[0] == 503


def test_delay_and_stall(s3: S3Server) -> None:
    with _proxy(s3, "delay", delay_s=0.3) as proxy:
        started = time.monotonic()
        assert _request(proxy.endpoint_url, "GET", f"/{s3.bucket}/obj") == (200, BODY)
        assert time.monotonic() - started >= 0.3
    with _proxy(s3, "stall") as proxy:
        started = time.monotonic()
        with pytest.raises((TimeoutError, OSError)):
            _request(proxy.endpoint_url, "GET", f"/{s3.bucket}/obj", timeout=0.5)
        assert 0.5 <= time.monotonic() - started < 5


def test_schedule_is_seeded_and_counted(s3: S3Server) -> None:
    def fates(seed: int) -> list[str | None]:
        proxy = FaultProxy(s3.endpoint_url, rate=0.3, seed=seed)
        try:
            return [proxy.decide("GET", f"/b/k{i % 7}") for i in range(200)]
        finally:
            proxy.close()

    first = fates(1)
    assert first == fates(1) and first != fates(2)
    faulted = [f for f in first if f is not None]
    assert 30 <= len(faulted) <= 90 and len(set(faulted)) >= 6
    with FaultProxy(s3.endpoint_url, rate=0.0) as proxy:
        for _ in range(3):
            assert _request(proxy.endpoint_url, "GET", f"/{s3.bucket}/obj") == (200, BODY)
        proxy.stall_all = True
        with pytest.raises((TimeoutError, OSError)):
            _request(proxy.endpoint_url, "GET", f"/{s3.bucket}/obj", timeout=0.3)
    assert proxy.requests == 4 and proxy.injected == {"stall": 1}


def test_aimed_fault_hits_the_next_matching_requests_only(s3: S3Server) -> None:
    with FaultProxy(s3.endpoint_url, rate=0.0) as proxy:
        proxy.inject("503", method="PUT", path_contains="/aimed/", times=2)
        assert _request(proxy.endpoint_url, "GET", f"/{s3.bucket}/obj")[0] == 200
        assert _request(proxy.endpoint_url, "PUT", f"/{s3.bucket}/other", b"x")[0] == 200
        for _ in range(2):
            assert _request(proxy.endpoint_url, "PUT", f"/{s3.bucket}/aimed/k", b"x")[0] == 503
        assert _request(proxy.endpoint_url, "PUT", f"/{s3.bucket}/aimed/k", b"x")[0] == 200
    assert proxy.injected == {"503": 2}
    with FaultProxy(s3.endpoint_url, rate=0.0) as proxy:  # in order: the 500 waits its turn
        proxy.inject("503", method="PUT", path_contains="/aimed/")
        proxy.inject("500", path_contains="/aimed/")
        assert _request(proxy.endpoint_url, "GET", f"/{s3.bucket}/aimed/k")[0] == 200
        assert _request(proxy.endpoint_url, "PUT", f"/{s3.bucket}/aimed/k", b"x")[0] == 503
        assert _request(proxy.endpoint_url, "GET", f"/{s3.bucket}/aimed/k")[0] == 500
    assert [fault for _m, _p, fault in proxy.history] == [None, "503", "500"]
    with pytest.raises(ValueError):
        proxy.inject("nonsense", method="GET", path_contains="/")
