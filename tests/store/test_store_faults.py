"""Store layers (request counter, fault injector) and the loopback servers."""

import multiprocessing
import os
import subprocess
import sys
import urllib.request

import pytest

from shardlake.store import RequestCounter, RetryPolicy, open_store
from shardlake.store.layers import read_request_log, summarize_request_log
from shardlake.testing.faults import FaultInjector, FaultPlan
from shardlake.testing.servers import fake_gcs_server, moto_s3_server
from shardlake.testing.workers import read_key


def test_production_code_reads_no_fault_env_and_imports_no_test_machinery(tmp_path) -> None:
    code = (
        "import sys; from shardlake.store import open_store; "
        f"s = open_store({str(tmp_path / 'root')!r}); s.write('k', b'v'); assert s.read('k') == b'v'; "
        "assert type(s).__name__ == 'Store' and s.layers == (), s; "
        "bad = [m for m in sys.modules if m.startswith('shardlake.testing') or m == 'pytest']; "
        "assert not bad, bad"
    )
    env = dict(os.environ, SHARDLAKE_TEST_FAULTS='{"fail_rate": 1.0}')
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)


def test_counter_and_injector_layers(tmp_path) -> None:
    log = tmp_path / "requests.jsonl"
    counter = RequestCounter(str(log))
    injector = FaultInjector(FaultPlan(fail_rate=0.5, seed=3, max_consecutive=2))
    store = open_store(str(tmp_path / "root"), retry=RetryPolicy(attempts=4, base_delay=0))
    faulty = store.with_layers(counter, injector)
    assert store.layers == () and faulty.layers == (counter, injector)
    for i in range(10):
        faulty.write(f"k{i}", b"12345")
        assert faulty.read(f"k{i}") == b"12345"
    summary = summarize_request_log(str(log))
    assert summary["failures"] == injector.injected.total() == counter.failures.total() > 0
    assert summary["requests"] == counter.total_requests == 20 + summary["failures"]
    assert summary["bytes_read"] == 50 == counter.bytes_read and summary["processes"] == 1
    assert counter.bytes_written == 50


def test_fault_decisions_are_deterministic_per_seed() -> None:
    def run(seed: int) -> list[int]:
        counter, injector = RequestCounter(), FaultInjector(FaultPlan(fail_rate=0.4, seed=seed))
        store = open_store("memory://det", retry=RetryPolicy(8, 0, 0)).with_layers(
            counter, injector
        )
        store.write("k", b"v")
        for _ in range(20):
            store.read("k")
        return [counter.requests["read"], injector.injected["read"]]

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_request_log_spans_spawned_processes(tmp_path) -> None:
    log = tmp_path / "requests.jsonl"
    store = open_store(str(tmp_path / "root")).with_layers(RequestCounter(str(log)))
    store.write("shard", b"x" * 1000)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        assert pool.apply(read_key, (store, "shard")) == b"x" * 1000
    records = read_request_log(str(log))
    assert [(r["op"], r["bytes"]) for r in records] == [("write", 0), ("read", 1000)]
    assert records[1]["pid"] != os.getpid()
    assert summarize_request_log(str(log))["processes"] == 2


def test_plan_rejects_nonsense_rates() -> None:
    with pytest.raises(ValueError):
        FaultPlan(fail_rate=1.5)
    assert FaultPlan.from_json(FaultPlan(fail_rate=0.1, ops=("read",)).to_json()).ops == ("read",)


def test_servers_start_serve_and_stop_cleanly() -> None:
    saved = os.environ.get("STORAGE_EMULATOR_HOST"), os.environ.get("AWS_ENDPOINT_URL")
    with moto_s3_server(bucket="solo-s3") as s3, fake_gcs_server(bucket="solo-gcs") as gcs:
        assert os.environ["AWS_ENDPOINT_URL"] == s3.endpoint_url
        assert os.environ["STORAGE_EMULATOR_HOST"] == gcs.endpoint_url
        for server in (s3, gcs):
            assert server.endpoint_url.startswith("http://127.0.0.1:")
            store = open_store(server.url("p"), server.storage_options)
            store.create("k", b"v")
            assert store.read("k") == b"v"
            assert "secret" not in repr(server)
        endpoints = [s3.endpoint_url, gcs.endpoint_url]
    assert (os.environ.get("STORAGE_EMULATOR_HOST"), os.environ.get("AWS_ENDPOINT_URL")) == saved
    for endpoint in endpoints:
        with pytest.raises(OSError):
            urllib.request.urlopen(endpoint, timeout=2)


def test_demo_s3_without_moto_says_what_to_install(monkeypatch, tmp_path) -> None:
    from shardlake.errors import UsageError
    from shardlake.tools.demo import DemoConfig, _root

    monkeypatch.setitem(sys.modules, "moto.server", None)  # as if moto were not installed
    with pytest.raises(UsageError) as caught, _root(DemoConfig(store="s3"), tmp_path):
        pass
    assert "pip install 'shardlake[demo]'" in str(caught.value)
