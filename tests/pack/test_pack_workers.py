"""Executors: process pool, dead workers, Dask, progress heartbeat, Ctrl-C."""

from __future__ import annotations

import io
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from support.pack import assert_consistent, make_source, read_all, small_frame

import shardlake
from shardlake import open_store
from shardlake.errors import PackWorkerError
from shardlake.progress.bar import Progress


def corpus(root: Path) -> Path:
    return make_source(
        root, {f"log{p}/s{i}": small_frame(10 * p + i) for p in range(3) for i in range(3)}
    )


def test_process_pool_matches_inline(tmp_path: Path) -> None:
    src = corpus(tmp_path / "src")
    inline = open_store(str(tmp_path / "a"))
    procs = open_store(str(tmp_path / "b"))
    v_inline = shardlake.open(inline).pack(src, tag="v1", executor="inline").record
    v_procs = shardlake.open(procs).pack(src, tag="v1", executor="process", workers=2).record
    assert [p.data_rev for p in v_procs.entries] == [p.data_rev for p in v_inline.entries]
    for part in v_procs.entries:
        for shard in part.shards:
            assert procs.read(shard.key) == inline.read(shard.key)
    assert_consistent(procs)


def _kill_on_log1() -> None:
    """Pool initializer: the worker SIGKILLs itself when it reaches partition log1 (an OOM kill)."""
    import shardlake.pack.build as build

    real = build.load_npz

    def load(data: bytes, where: str) -> Any:
        if "/log1/" in where:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(data, where)

    build.load_npz = load  # type: ignore[assignment]


def test_dead_worker_fails_the_pack_naming_partitions(tmp_path: Path) -> None:
    src = corpus(tmp_path / "src")
    store = open_store(str(tmp_path / "root"))
    pool = ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("fork"), initializer=_kill_on_log1
    )
    try:
        with pytest.raises(PackWorkerError) as info:
            shardlake.open(store).pack(src, tag="v1", executor=pool)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    message = str(info.value)
    assert "log1 (" in message and "worker process died" in message
    assert "nothing was published" in message
    assert store.list("commits/") == [] and store.list("versions/") == []


def test_dask_local_cluster(tmp_path: Path) -> None:
    from distributed import LocalCluster

    src = corpus(tmp_path / "src")
    store = open_store(str(tmp_path / "root"))
    with LocalCluster(
        n_workers=1,
        threads_per_worker=2,
        processes=False,
        protocol="tcp://",
        host="127.0.0.1",
        dashboard_address=None,
    ) as cluster:
        address = cluster.scheduler_address.replace("tcp://", "dask://")
        report = shardlake.open(store).pack(src, tag="v1", executor=address)
    assert sorted(report.built) == ["log0", "log1", "log2"]
    assert len(read_all(store, report.record)) == 9
    reference = (
        shardlake.open(open_store(str(tmp_path / "ref")))
        .pack(src, tag="v1", executor="inline")
        .record
    )
    assert [p.data_rev for p in report.record.entries] == [p.data_rev for p in reference.entries]


def test_progress_weighted_with_eta_and_heartbeat() -> None:
    now = [0.0]
    out = io.StringIO()
    progress = Progress(
        100,
        "shardlake pack",
        groups=2,
        enabled=True,
        stream=out,
        heartbeat_s=60,
        interval_s=0,
        clock=lambda: now[0],
    )
    now[0] = 10.0
    progress.update(90, groups=1)
    assert "1/2 partitions, 90/100 samples (90.0%)" in out.getvalue()
    assert "9.0 samples/s" in out.getvalue() and "ETA 0:00:01" in out.getvalue()
    now[0] = 69.0
    progress.poll(lambda: ["big (abc)"])
    assert "still working" not in out.getvalue()
    now[0] = 71.0
    progress.poll(lambda: ["big (abc)"])
    assert "still working: nothing finished for 0:01:01; in flight: big (abc)" in out.getvalue()
    progress.poll(lambda: ["big (abc)"])
    assert progress.heartbeats == 1  # not again until another heartbeat interval passes
    quiet = io.StringIO()
    q = Progress(1, "shardlake pack", groups=1, stream=quiet, enabled=False)
    q.update(1, groups=1)
    assert quiet.getvalue() == ""


def test_heartbeat_names_slow_partition(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shardlake.pack.packer as packer

    real = packer.build_partition

    def slow(task: Any) -> Any:
        if task.partition.path == "log2":
            time.sleep(0.6)
        return real(task)

    monkeypatch.setattr(packer, "build_partition", slow)
    src = corpus(tmp_path / "src")
    out = io.StringIO()
    shardlake.open(open_store(str(tmp_path / "root"))).pack(
        src,
        tag="v1",
        executor="thread",
        workers=3,
        progress=True,
        progress_stream=out,
        heartbeat_s=0.2,
        poll_s=0.05,
    )
    text = out.getvalue()
    assert "still working" in text and "in flight: log2 (" in text
    assert "3/3 partitions, 9/9 samples (100.0%)" in text


_SLOW_PACK = """
import sys, time
import shardlake.pack.packer as packer
real = packer.build_partition
def slow(task):
    print("BUILD-STARTED", file=sys.stderr, flush=True)
    time.sleep(1.0)
    return real(task)
packer.build_partition = slow
from shardlake.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_publishes_nothing(tmp_path: Path) -> None:
    src = corpus(tmp_path / "src")
    root = tmp_path / "root"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _SLOW_PACK,
            "pack",
            str(src),
            str(root),
            "--tag",
            "v1",
            "--executor",
            "thread",
            "--workers",
            "1",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if "BUILD-STARTED" in line:
            break
    proc.send_signal(signal.SIGINT)
    watchdog = threading.Timer(60, proc.kill)  # a pack that ignores Ctrl-C fails, not hangs
    watchdog.start()
    try:
        rest = proc.stderr.read()
    finally:
        watchdog.cancel()
    assert proc.wait(timeout=60) == 130, rest
    assert "interrupted; nothing was published" in rest
    store = open_store(str(root))
    assert store.list("commits/") == [] and store.list("versions/") == []


def test_pack_on_every_backend(tmp_path: Path, store_location: Any) -> None:
    """Default executor (processes; threads for memory://) writing straight to each store."""
    src = corpus(tmp_path / "src")
    store = store_location.open()
    version = shardlake.open(store).pack(src, tag="v1", workers=2, shard_size=1500).record
    assert version.samples == 9
    got = read_all(store, version)
    assert got["log2/s1"]["b"].tolist() == small_frame(21)["b"].tolist()
    assert_consistent(store)
    # The same content packed locally gives the same revisions and shard bytes.
    local = open_store(str(tmp_path / "ref"))
    reference = shardlake.open(local).pack(src, tag="v1", executor="inline", shard_size=1500).record
    assert [p.data_rev for p in version.entries] == [p.data_rev for p in reference.entries]
    shard = reference.entries[0].shards[0].key
    assert store.read(shard) == local.read(shard)
