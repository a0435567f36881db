"""A wrong endpoint fails fast; refusals after a first answer keep the full retry policy."""

import errno
import os
import socket
import subprocess
import sys
import time

import pytest

from shardlake.errors import EndpointError, RetriesExhaustedError
from shardlake.store import retry


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_versions_at_a_closed_port_fails_fast_saying_what_to_check():
    port = _closed_port()
    argv = [sys.executable, "-m", "shardlake.cli.main", "versions", "s3://bucket/driving"]
    for opt in (f"endpoint_url=http://127.0.0.1:{port}", "key=a", "secret=b"):
        argv += ["--storage-option", opt]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert time.monotonic() - started < 15
    assert proc.returncode == 1
    assert f"nothing listens at http://127.0.0.1:{port} - check the endpoint URL" in proc.stderr


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def _refused() -> BaseException:
    from botocore.exceptions import EndpointConnectionError

    try:
        try:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
        except ConnectionRefusedError as inner:
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9/b/k") from inner
    except EndpointConnectionError as exc:
        return exc


def _spend(monkeypatch, answered: bool) -> BaseException:
    monkeypatch.setattr(retry, "_answered", answered)
    monkeypatch.setattr(retry, "_first_refusal", {})
    clock = _Clock()
    policy = retry.RetryPolicy(deadline=60.0, max_delay=2.0)
    loop = retry.RetryLoop(policy, lambda: "read k", sleep=clock.sleep, clock=clock)
    with pytest.raises((EndpointError, RetriesExhaustedError)) as info:
        while True:
            loop.backoff(_refused())
    return info.value


def test_first_contact_refusals_stop_within_seconds(monkeypatch):
    err = _spend(monkeypatch, answered=False)
    assert isinstance(err, EndpointError)
    assert str(err) == "nothing listens at http://127.0.0.1:9 - check the endpoint URL"


def test_mid_run_refusals_keep_the_retry_policy(monkeypatch):
    err = _spend(monkeypatch, answered=True)
    assert isinstance(err, RetriesExhaustedError) and "deadline 60s" in str(err)
