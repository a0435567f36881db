"""``shardlake demo`` end to end, on a local root and on a loopback S3 root (what CI runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Small but complete: 3 logs + 1 incremental log of 16 frames; train = 2 logs (32 frames),
# valid = 2 logs (32 frames); 2 ranks × batch 4 → 4 steps per epoch, 10 steps cross two.
# Each run's version hash seeds its order: with 6 steps (means of 2 losses) about one run in
# ten did not learn by 20%; with 10 (means of 3), 8 runs
# ended at 0.20-0.53 of the first loss.
FLAGS = [
    "--small-frames", "--partitions", "3", "--samples", "16", "--extra-partitions", "1",
    "--steps", "10", "--batch-size", "4", "--nproc", "2", "--num-workers", "1", "--json",
]  # fmt: skip


@pytest.mark.parametrize("store", ["local", "s3"])
def test_demo_runs_end_to_end(store: str, tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, "-m", "shardlake.cli.main", "demo", "--store", store,
         "--workdir", str(tmp_path / "demo"), *FLAGS],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    progress = proc.stderr

    assert summary["store"] == store
    assert summary["root"].startswith("s3://" if store == "s3" else "/")
    v1, v2 = summary["versions"]
    assert (v1["tag"], v1["samples"], v1["partitions"], v1["built"]) == ("v1", 48, 3, 3)
    # The incremental batch: the 3 old logs reused (not rebuilt), 1 new one built.
    assert (v2["tag"], v2["samples"], v2["partitions"]) == ("v2", 64, 4)
    assert (v2["reused"], v2["built"]) == (3, 1)
    assert v2["latest"] and not v1["latest"] and v1["hash"] != v2["hash"]

    ks = summary["keysets_v2"]
    assert ks["train"]["samples"] + ks["valid"]["samples"] == 64
    assert ks["train"]["version_hash"] == v2["hash"] == summary["train"]["version_hash"]

    train = summary["train"]
    assert train["ranks"] == 2 and train["steps_per_rank"] == 10
    assert train["samples"] == 2 * 10 * 4
    assert train["epochs_started"] == 3  # 4 steps per epoch: the loader rolled over twice
    assert train["samples_per_s"] > 0 and train["time_to_first_batch_s"] > 0
    assert train["valid_samples"] == ks["valid"]["samples"]
    for loss in (train["first_loss"], train["last_loss"], train["valid_loss"]):
        assert 0 < loss < 100
    # It learns: the target (the ego's last past step) follows from the input.
    assert train["last_loss"] < 0.8 * train["first_loss"], train
    # Where the step's time went, phase by phase, adding up to the step.
    phases = train["phases_s"]
    assert set(phases) == {"start", "setup", "first_batch", "train", "validate", "finish"}
    assert all(seconds >= 0 for seconds in phases.values()) and phases["start"] > 0
    assert "where the" in progress and "importing torch, joining the DDP group" in progress
    # Quiet: no warning of torch's or anyone's ("NumPy array is not writable" was one).
    assert "warning" not in progress.lower(), progress

    for line in ("1. synthesised", "2. pack: published v1", "3. keysets on v1", "disjoint: yes",
                 "reused 3", "5. training: 2 DDP ranks (gloo)", "samples/s", "done in"):  # fmt: skip
        assert line in progress, line
    # The workdir was given, so the corpus stays for the user to look at.
    assert any((tmp_path / "demo" / "source").iterdir())


def test_demo_refuses_a_used_workdir(tmp_path: Path):
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "old.npz").write_bytes(b"")
    proc = subprocess.run(
        [sys.executable, "-m", "shardlake.cli.main", "demo", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "is not empty: give the demo a fresh --workdir" in proc.stderr
