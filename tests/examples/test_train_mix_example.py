"""examples/train_mix.py (the migration guide's script): 2 gloo ranks train on a mix of two
versions, validate exactly, and a preempted run resumed from its checkpoint ends bit-identical."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import shardlake
from shardlake.testing import synth_corpus

pytestmark = pytest.mark.timeout(600)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mix.py"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("mixex")
    root = tmp / "root"
    v1 = synth_corpus(tmp / "v1", 2, 24, seed=5, neighbors=4, lanes=4)
    v2 = synth_corpus(tmp / "v2", 2, [16, 21], seed=6, neighbors=4, lanes=4)
    shardlake.open(str(root)).pack(v1.root, tag="v1", executor="inline")
    shardlake.open(str(root)).pack(v2.root, tag="v2", executor="inline")
    return root, f"log_file_id = '{v2.partitions[-1]}'"  # the 21-frame log of v2


def run(root: tuple[Path, str], out: Path, *extra: str) -> None:
    valid = root[1]
    args = [
        "--root", str(root[0]), "--mix", "v1=0.6", "--mix", "v2=0.4",
        "--train-where", f"NOT ({valid})", "--valid-version", "v2", "--valid-where", valid,
        "--out", str(out), "--nproc", "2", "--epochs", "2", "--batch-size", "4",
        "--num-workers", "0", "--lr", "0.01",
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *args, *extra], capture_output=True, text=True, timeout=500
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_mix_train_exact_validation_and_resume(root: tuple[Path, str], tmp_path: Path) -> None:
    run(root, tmp_path / "full")
    log = [json.loads(x) for x in (tmp_path / "full" / "log.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in log] == [0, 1]
    assert all(e["valid_samples"] == 21 for e in log)  # 21 samples: each once, no padding counted
    counts = [s["samples_per_epoch"] for s in log[0]["run"]["sources"]]
    assert counts == [round(0.6 * sum(counts)), round(0.4 * sum(counts))]
    # Preempted after 5 steps (mid-epoch), then resumed from the checkpoint of step 4.
    run(root, tmp_path / "cut", "--checkpoint-every", "4", "--stop-after-steps", "5")
    run(root, tmp_path / "cut", "--checkpoint-every", "4", "--resume")
    full = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=False)
    cut = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=False)
    assert full["step"] == cut["step"]
    for name, value in full["model"].items():
        assert torch.equal(value, cut["model"][name]), name
    resumed = [json.loads(x) for x in (tmp_path / "cut" / "log.jsonl").read_text().splitlines()]
    assert resumed[-1]["valid_loss"] == log[-1]["valid_loss"]
