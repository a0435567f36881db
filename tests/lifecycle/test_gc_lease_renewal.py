"""gc's short lease: renewed while gc works; a SIGKILLed holder on this host is taken over."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import shardlake
import shardlake.lifecycle.gc as gc
from shardlake import open_store
from shardlake.cli.main import main
from shardlake.testing import synth_corpus

pytestmark = pytest.mark.timeout(180)

SLOW_GC = """
import sys, time
import shardlake
from shardlake import open_store

def slow(request, send):
    if request.op == "delete":
        time.sleep(0.5)
    return send()

shardlake.open(open_store(sys.argv[1]).with_layers(slow)).gc(grace_s=0)
"""


def _root_with_junk(tmp_path: Path, junk: int) -> tuple[Path, str]:
    src = tmp_path / "src"
    synth_corpus(src, 1, 4, seed=3, neighbors=2, lanes=4)
    root = str(tmp_path / "root")
    assert main(["pack", str(src), root, "--tag", "v1"]) == 0
    store = open_store(root)
    for i in range(junk):
        store.write(f"data/junk/x/shard-{i:06d}.tar", b"x")
    return src, root


def _kill_gc_holding_the_lock(root: str) -> int:
    """Start a slow gc, SIGKILL it once it holds the root's lock; its pid."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_GC, root], env=env)
    lake = shardlake.open(root)
    deadline = time.monotonic() + 60
    while lake.gc_lock() is None:
        assert proc.poll() is None and time.monotonic() < deadline, "gc never took its lock"
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    held = lake.gc_lock()
    assert held is not None and held.expires_at > time.time() + 10  # the lease is still valid
    return proc.pid


def test_sigkilled_gc_is_taken_over_at_once_by_pack_and_gc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    src, root = _root_with_junk(tmp_path, 40)
    caplog.set_level(logging.WARNING, logger="shardlake.gc")
    pid = _kill_gc_holding_the_lock(root)
    assert main(["pack", str(src), root, "--tag", "v2"]) == 0  # not refused for the lease
    assert any(f"pid {pid}:" in r.getMessage() for r in caplog.records), caplog.records
    pid = _kill_gc_holding_the_lock(root)
    capsys.readouterr()
    started = time.monotonic()
    assert main(["gc", root, "--grace", "0s", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert any(f"pid {pid}:" in note and "gone" in note for note in report["notes"]), report
    assert report["count"] > 0 and time.monotonic() - started < 30
    assert shardlake.open(root).gc_lock() is None


def test_the_lease_is_renewed_while_gc_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, root = _root_with_junk(tmp_path, 8)
    monkeypatch.setattr(gc, "LOCK_TTL_S", 1.0)
    monkeypatch.setattr(gc, "LOCK_RENEW_S", 0.2)
    monkeypatch.setattr(gc, "LOCK_MARGIN_S", 0.3)
    renewals: list[str] = []

    def slow(request, send):  # type: ignore[no-untyped-def]
        if request.op == "delete":
            time.sleep(0.25)  # 8 deletes: 2 s, twice the lease's life
        if request.op == "create" and b'"gc-renew"' in (request.data or b""):
            renewals.append(request.key)
        return send()

    report = shardlake.open(open_store(root).with_layers(slow)).gc(grace_s=0)
    assert not report.incomplete and report.to_json()["count"] == 8
    assert len(renewals) >= 3
    assert shardlake.open(root).gc_lock() is None
