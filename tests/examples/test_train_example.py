"""examples/train_ddp.py: 2 gloo ranks × 2 epochs from the shard path and from the npz path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import shardlake
from shardlake.testing import synth_corpus

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_ddp.py"
# 3 training logs (72 frames) and 1 validation log (24): multiples of 2 ranks × batch 12, so
# neither path pads and both average exactly the same samples.
PARTITIONS, SAMPLES = 4, 24


def run_example(*args: str, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=timeout
    )


def read_log(run: Path) -> list[dict[str, float]]:
    lines = (run / "train_log.tsv").read_text().splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, map(float, ln.split("\t")), strict=True)) for ln in lines[1:]]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A tiny corpus, packed; the last log is validation, the others training, on both paths."""

    tmp = tmp_path_factory.mktemp("train")
    src = synth_corpus(tmp / "src", PARTITIONS, SAMPLES, seed=3, neighbors=4, lanes=4)
    root = tmp / "root"
    shardlake.open(str(root)).pack(src.root, tag="v1", workers=1)
    valid_log = src.partitions[-1]
    shardlake.open(str(root)).keysets.create("train", where=f"log_file_id <> '{valid_log}'")
    shardlake.open(str(root)).keysets.create("valid", where=f"log_file_id = '{valid_log}'")
    files = sorted(str(f) for f in src.files)
    valid = [f for f in files if f"/{valid_log}/" in f]
    train = [f for f in files if f not in valid]
    (tmp / "train.txt").write_text("\n".join(train) + "\n")
    (tmp / "valid.json").write_text(json.dumps(valid))  # the JSON-list form users have today
    return {"tmp": tmp, "root": root, "train": len(train), "valid": len(valid)}


COMMON = ["--nproc", "2", "--epochs", "2", "--batch-size", "12", "--lr", "0.003", "--seed", "1"]


def test_shard_and_npz_paths_train_and_agree(
    corpus: dict[str, object], capsys: pytest.CaptureFixture[str]
):
    tmp = Path(str(corpus["tmp"]))
    npz_run, shard_run = tmp / "run-npz", tmp / "run-shards"
    proc = run_example(
        "--out", str(npz_run), *COMMON, "--num-workers", "1",
        "--npz-list", str(tmp / "train.txt"), "--valid-npz-list", str(tmp / "valid.json"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_example(
        "--out", str(shard_run), *COMMON, "--num-workers", "1",
        "--dataset-root", str(corpus["root"]), "--dataset-version", "v1",
        "--train-keyset", "train", "--valid-keyset", "valid",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]

    args = {p: json.loads((run / "args.json").read_text()) for p, run in
            (("npz", npz_run), ("shards", shard_run))}  # fmt: skip
    for a in args.values():
        assert a["world_size"] == 2
        assert a["valid_num_workers"] == 1 and a["valid_num_workers_inherited"] is True
        assert (a["train_samples"], a["valid_samples"]) == (corpus["train"], corpus["valid"])
    assert args["shards"]["data_path"] == "shards" and args["npz"]["data_path"] == "npz"

    logs = {"npz": read_log(npz_run), "shards": read_log(shard_run)}
    for log in logs.values():
        assert [row["epoch"] for row in log] == [0, 1]
        assert all(row["train_loss"] > 0 and row["valid_loss"] > 0 for row in log)
    # Same samples, same init, same steps: only the order differs, so the losses agree closely.
    # (Wrong arrays, a wrong split or a decoding bug moves them by far more than 5%.)
    for a, b in zip(logs["npz"], logs["shards"], strict=True):
        for col in ("train_loss", "valid_loss", "valid_ade"):
            assert abs(a[col] - b[col]) <= 0.05 * a[col], (col, a, b)

    # compare-runs accepts the pair as comparable (settings equal, coverage equal).
    from shardlake.cli.main import main

    capsys.readouterr()
    main(["compare-runs", str(npz_run), str(shard_run), "--plateau", "2", "--k", "2", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["checked_args"] and "valid_num_workers" in result["checked_args"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--npz-list", "a.txt", "--valid-npz-list", "b.txt", "--dataset-root", "/r"],
         "exactly one data path per run"),
        (["--dataset-root", "/r", "--train-keyset", "t", "--train-where", "x = 1",
          "--valid-keyset", "v"], "exactly one of --train-keyset and --train-where"),
        (["--dataset-root", "/r", "--train-keyset", "t"],
         "exactly one of --valid-keyset and --valid-where"),
        (["--npz-list", "a.txt"], "needs both --npz-list and --valid-npz-list"),
        (["--dataset-version", "v1", "--train-keyset", "t"], "need --dataset-root"),
        ([], "no data"),
    ],
)  # fmt: skip
def test_conflicting_or_missing_data_flags_are_refused(tmp_path: Path, flags, message):
    proc = run_example("--out", str(tmp_path / "run"), *flags, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not (tmp_path / "run").exists()
