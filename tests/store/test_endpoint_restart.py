"""A server that restarts under a running job is an outage, not a wrong endpoint (#29 item 5).

A real SeaweedFS is killed (SIGKILL) and started again on the same ports with the same data
under a running 2-worker loader epoch and under a running 2-worker pack: both ride through on
the retry policy (the workers received the store from a process the endpoint had answered),
the epoch yields the very batches of an undisturbed one and the packed version verifies.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

import shardlake
from shardlake.store import Request, RequestCounter, Store, open_store
from shardlake.store.layers import read_request_log
from shardlake.testing import synth_corpus
from shardlake.testing.seaweedfs import SeaweedFSServer, seaweedfs_server
from shardlake.torch import ShardDataset

pytestmark = pytest.mark.timeout(300)
T = TypeVar("T")
# Seconds nothing listens on the server's ports: longer than a wrong endpoint URL is given
# (retry.FIRST_CONTACT_S) before it fails.
DOWN_S = 6.0


@pytest.fixture(scope="module")
def weed() -> Iterator[SeaweedFSServer]:
    # Its own server: the restart must not disturb the session's shared one.
    with seaweedfs_server(set_env=False) as server:
        yield server


def _store(weed: SeaweedFSServer, url: str, log: Path | None = None) -> Store:
    store = open_store(url, weed.storage_options)
    return store if log is None else store.with_layers(RequestCounter(str(log)))


def _restart_in_background(weed: SeaweedFSServer) -> tuple[threading.Thread, list[float]]:
    took: list[float] = []

    def restart() -> None:
        started = time.monotonic()
        weed.restart(down_s=DOWN_S)
        took.append(time.monotonic() - started)

    thread = threading.Thread(target=restart, daemon=True)
    thread.start()
    return thread, took


def _epoch(store: Store, **loader_options: object) -> Iterator[tuple[str, ...]]:
    """The loader's batches as keys and a digest of every field (the epoch is opened on
    the call, iterated on demand)."""
    ds = ShardDataset(store, "v1", batch_size=4, include_key=True, seed=3, exact=True)
    loader = ds.loader(num_workers=2, **loader_options)

    def batches() -> Iterator[tuple[str, ...]]:
        for batch in loader:
            h = hashlib.sha256()
            for name in sorted(k for k in batch if k != "__key__"):
                h.update(name.encode() + batch[name].numpy().tobytes())
            yield (*batch["__key__"], h.hexdigest())

    return batches()


@pytest.mark.parametrize("engine", ["processes", "threads"])
def test_a_loader_epoch_rides_through_a_server_restart(
    engine: str, weed: SeaweedFSServer, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    synth_corpus(src, 3, 24, seed=5, neighbors=2, lanes=4)
    url = weed.fresh_url("restart-loader")
    shardlake.open(_store(weed, url)).pack(str(src), tag="v1", executor="inline", shard_size=12_000)
    want = list(_epoch(_store(weed, url), engine=engine))

    log = tmp_path / "requests.jsonl"
    # The epoch is open (the endpoint answered this process); the server dies as it starts, so
    # the first request of each worker (processes: started by forkserver, no memory of the
    # parent's) meets a dead server, which must not be taken for a wrong endpoint URL.
    epoch = _epoch(_store(weed, url, log), engine=engine, multiprocessing_context="forkserver")
    restarter, took = _restart_in_background(weed)
    got = list(epoch)
    restarter.join()
    assert got == want
    # The workers did meet the dead server (failed reads), and retried through it.
    failed = [r for r in read_request_log(str(log)) if not r["ok"]]
    assert failed, "the restart happened after the epoch had read everything"
    if engine == "processes":
        assert {r["pid"] for r in failed} - {os.getpid()}, "no worker met the dead server"
    print(f"restart took {took[0]:.1f}s; {len(failed)} failed attempt(s) retried")


class KillOnFirstWorkerRequest:
    """A store layer: the first request any other process (a pack worker) sends kills the
    server first (SIGKILL), so the workers' first requests meet a dead server."""

    def __init__(self, server_pid: int, marker: Path) -> None:
        self.parent = os.getpid()
        self.server_pid = server_pid
        self.marker = str(marker)

    def __call__(self, request: Request, send: Callable[[], T]) -> T:
        if os.getpid() != self.parent:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                os.kill(self.server_pid, signal.SIGKILL)
        return send()


def test_a_pack_rides_through_a_server_restart(weed: SeaweedFSServer, tmp_path: Path) -> None:
    src = tmp_path / "src"
    synth_corpus(src, 4, 30, seed=6, neighbors=2, lanes=4)
    url = weed.fresh_url("restart-pack")
    log = tmp_path / "requests.jsonl"
    killed = tmp_path / "killed"
    assert weed._weed is not None and weed._weed.proc is not None
    killer = KillOnFirstWorkerRequest(weed._weed.proc.pid, killed)
    store = _store(weed, url, log).with_layers(killer)
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(
                shardlake.open(store).pack(str(src), tag="v1", workers=2, shard_size=8_000).version
            )
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            outcome.append(exc)

    packer = threading.Thread(target=run, daemon=True)
    packer.start()
    # The pack's process has read the root; its workers (forkserver: no memory of the
    # parent's) kill the server with their first request and meet a dead one.
    deadline = time.monotonic() + 120
    while not killed.exists():
        assert packer.is_alive() and time.monotonic() < deadline, outcome
        time.sleep(0.02)
    restarter, took = _restart_in_background(weed)
    packer.join(timeout=240)
    restarter.join()
    assert outcome and not isinstance(outcome[0], BaseException), outcome
    failed = [r for r in read_request_log(str(log)) if not r["ok"]]
    assert {r["pid"] for r in failed} - {os.getpid()}, "no worker met the dead server"
    report = shardlake.open(_store(weed, url)).verify(str(src), version="v1", workers=2)
    assert report.ok, report.failures()
    print(f"restart took {took[0]:.1f}s; {len(failed)} failed attempt(s) retried")
