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


def _spend(monkeypatch, answered: bool, failure=_refused) -> BaseException:
    endpoint = "http://127.0.0.1:9"
    monkeypatch.setattr(retry, "_answered", {endpoint} if answered else set())
    monkeypatch.setattr(retry, "_first_failure", {})
    clock = _Clock()
    policy = retry.RetryPolicy(deadline=60.0, max_delay=2.0)
    loop = retry.RetryLoop(
        policy, lambda: "read k", endpoint=endpoint, sleep=clock.sleep, clock=clock
    )
    with pytest.raises((EndpointError, RetriesExhaustedError)) as info:
        while True:
            loop.backoff(failure())
    return info.value


def test_first_contact_refusals_stop_within_seconds(monkeypatch):
    err = _spend(monkeypatch, answered=False)
    assert isinstance(err, EndpointError)
    assert str(err) == "nothing listens at http://127.0.0.1:9 - check the endpoint URL"


def test_mid_run_refusals_keep_the_retry_policy(monkeypatch):
    err = _spend(monkeypatch, answered=True)
    assert isinstance(err, RetriesExhaustedError) and "deadline 60s" in str(err)


def _cli(
    *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    argv = [sys.executable, "-m", "shardlake.cli.main", *args]
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **(env or {}))
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=90, env=full_env)
    return proc, time.monotonic() - started


def _s3_args(endpoint: str) -> list[str]:
    out = ["versions", "s3://bucket/driving"]
    for opt in (f"endpoint_url={endpoint}", "key=a", "secret=b"):
        out += ["--storage-option", opt]
    return out


def test_an_unresolvable_host_fails_fast_naming_it():
    proc, took = _cli(*_s3_args("http://minio.invalid:9000"))
    assert took < 15, proc.stderr
    assert proc.returncode == 1
    assert "cannot resolve host 'minio.invalid' in the endpoint URL" in proc.stderr
    assert "Traceback" not in proc.stderr


def _lookup_failed(code: int):
    import aiohttp
    from aiohttp.client_reqrep import ConnectionKey
    from botocore.exceptions import EndpointConnectionError

    key = ConnectionKey("minio.invalid", 9000, False, True, None, None, None)

    def make() -> BaseException:
        try:
            try:
                try:
                    raise socket.gaierror(code, "lookup failed")
                except socket.gaierror as lookup:
                    raise aiohttp.ClientConnectorDNSError(key, lookup) from lookup
            except aiohttp.ClientConnectorError as inner:
                raise EndpointConnectionError(endpoint_url="http://minio.invalid:9000/b") from inner
        except EndpointConnectionError as exc:
            return exc

    return make


def test_a_host_dns_does_not_know_fails_at_once_and_a_failing_lookup_within_seconds(monkeypatch):
    err = _spend(monkeypatch, answered=False, failure=_lookup_failed(socket.EAI_NONAME))
    assert isinstance(err, EndpointError)
    assert str(err).startswith("cannot resolve host 'minio.invalid' in the endpoint URL")
    err = _spend(monkeypatch, answered=False, failure=_lookup_failed(socket.EAI_AGAIN))
    assert isinstance(err, EndpointError) and "cannot resolve host 'minio.invalid'" in str(err)
    # An endpoint that answered this job: a failing lookup mid-run keeps the retry policy.
    err = _spend(monkeypatch, answered=True, failure=_lookup_failed(socket.EAI_NONAME))
    assert isinstance(err, RetriesExhaustedError)


@pytest.mark.parametrize("where", ["option", "environment"])
def test_credentials_in_the_endpoint_url_are_refused_before_any_request_and_never_printed(where):
    with socket.socket() as listener:  # a request would connect here: none may
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.1)
        port = listener.getsockname()[1]
        url = f"http://u:SECRET@127.0.0.1:{port}"
        if where == "option":
            proc, took = _cli(*_s3_args(url))
        else:
            proc, took = _cli(
                "versions",
                "s3://bucket/driving",
                "--storage-option",
                "key=a",
                env={"AWS_ENDPOINT_URL": url, "AWS_ENDPOINT_URL_S3": ""},
            )
        with pytest.raises(TimeoutError):
            listener.accept()
    assert proc.returncode == 2 and took < 15
    assert "SECRET" not in proc.stderr + proc.stdout
    assert f"endpoint URL 'http://***@127.0.0.1:{port}'" in proc.stderr
    assert "carries credentials: remove them from the URL" in proc.stderr


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("ftp://127.0.0.1:9", "has scheme 'ftp': an endpoint URL starts with http:// or https://"),
        ("127.0.0.1:9", "has no scheme: write http://127.0.0.1:9"),
        ("http://[::1", "cannot be parsed: Invalid IPv6 URL"),
        ("http://127.0.0.1:99999", "has an invalid port"),
    ],
)
def test_a_wrong_scheme_is_a_usage_error_saying_what_to_write(endpoint, expected):
    proc, took = _cli(*_s3_args(endpoint))
    assert proc.returncode == 2 and took < 15
    assert expected in proc.stderr


def test_https_to_a_plain_http_server_says_to_write_http(tmp_path):
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc, took = _cli(*_s3_args(f"https://127.0.0.1:{server.server_address[1]}"))
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 1 and took < 15
    assert "does not speak TLS - if it is a plain HTTP server" in proc.stderr
    assert "with http://, not https://" in proc.stderr


def test_a_worker_given_the_store_inherits_that_its_endpoint_answered(monkeypatch):
    import pickle

    from shardlake.store import open_store

    monkeypatch.setattr(retry, "_answered", set())
    store = open_store("s3://bucket/x", {"endpoint_url": "http://127.0.0.1:9", "key": "a"})
    retry.mark_answered("http://127.0.0.1:9")
    sent = pickle.dumps(store)
    monkeypatch.setattr(retry, "_answered", set())  # a worker process: nothing answered it yet
    pickle.loads(sent)
    assert retry.has_answered("http://127.0.0.1:9")
    assert not retry.has_answered("http://127.0.0.1:10")


def test_what_answered_is_remembered_per_endpoint(monkeypatch):
    from shardlake.store.endpoint import endpoint_id

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    assert endpoint_id("s3", {"endpoint_url": "http://u:s@127.0.0.1:9000/x"}) == (
        "http://127.0.0.1:9000"
    )
    assert endpoint_id("s3", {}) == "s3:"  # the default endpoint
    a = endpoint_id("https", {}, "a.example:8443/root")
    b = endpoint_id("https", {}, "b.example/root")
    assert (a, b) == ("https://a.example:8443", "https://b.example")
