"""The fault-injecting store wrapper (shardlake.testing.faults) and the loopback servers."""

import multiprocessing
import os
import urllib.request

import pytest

from shardlake.store import RetryPolicy, open_store
from shardlake.testing.faults import FaultPlan, FaultyStore, read_request_log, summarize_log
from shardlake.testing.servers import fake_gcs_server, moto_s3_server
from shardlake.testing.workers import read_key


def test_faults_from_environment_reach_open_store(monkeypatch, tmp_path) -> None:
    log = tmp_path / "requests.jsonl"
    plan = FaultPlan(fail_rate=0.5, seed=3, max_consecutive=2, log_path=str(log))
    monkeypatch.setenv(*next(iter(plan.env().items())))
    store = open_store(str(tmp_path / "root"), retry=RetryPolicy(attempts=4, base_delay=0))
    assert isinstance(store, FaultyStore)
    for i in range(10):
        store.write(f"k{i}", b"12345")
        assert store.read(f"k{i}") == b"12345"
    summary = summarize_log(str(log))
    assert summary["faults"] == store.stats.injected.total() > 0
    assert summary["requests"] == store.stats.total_requests == 20 + summary["faults"]
    assert summary["bytes_read"] == 50 and summary["processes"] == 1


def test_fault_decisions_are_deterministic_per_seed() -> None:
    def run(seed: int) -> list[int]:
        store = FaultyStore(
            "memory://det", plan=FaultPlan(fail_rate=0.4, seed=seed), retry=RetryPolicy(8, 0, 0)
        )
        store.write("k", b"v")
        for _ in range(20):
            store.read("k")
        return [store.stats.requests["read"], store.stats.injected["read"]]

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_request_log_spans_spawned_processes(tmp_path) -> None:
    log = tmp_path / "requests.jsonl"
    store = FaultyStore(str(tmp_path / "root"), plan=FaultPlan(log_path=str(log)))
    store.write("shard", b"x" * 1000)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        assert pool.apply(read_key, (store, "shard")) == b"x" * 1000
    records = read_request_log(str(log))
    assert [(r["op"], r["bytes"]) for r in records] == [("write", 0), ("read", 1000)]
    assert records[1]["pid"] != os.getpid()
    assert summarize_log(str(log))["processes"] == 2


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
