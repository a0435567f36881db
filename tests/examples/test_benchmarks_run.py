"""The S3 benchmarks the docs quote still run (tiny sizes): a rename in the store layer broke
``benchmarks/load.py --s3`` once without any test noticing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_load_s3_path_prints_the_issue_21_figures(tmp_path: Path) -> None:
    out = _run(
        str(BENCHMARKS / "load.py"),
        "--work", str(tmp_path), "--samples", "96", "--partitions", "2", "--neighbors", "8",
        "--s3", "--s3-path-only", "--s3-rounds", "1",
    )  # fmt: skip
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    names = [row["name"] for row in rows]
    assert any("warm-up" in name and name.startswith("s3") for name in names)
    assert "s3 epoch 1" in names and "local epoch 1" in names
    assert all(row["samples"] == 96 for row in rows if row["name"].startswith(("s3", "local")))
    for figure in ("goal >= 0.7", "goal <= 1.3", "goal >= 4", "CPU-bound ceiling"):
        assert figure in out
    assert out.startswith("# issue 21: ")  # the command that produced the figures


def test_load_engines_prints_the_issue_31_figures(tmp_path: Path) -> None:
    out = _run(
        str(BENCHMARKS / "load.py"),
        "--work", str(tmp_path), "--samples", "96", "--partitions", "2", "--neighbors", "8",
        "--s3", "--engines-only", "--engine-rounds", "1",
    )  # fmt: skip
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    epochs = {(r["engine"], r["path"]) for r in rows if "engine" in r}
    assert epochs == {(e, p) for e in ("threads", "processes") for p in ("local", "s3")}
    assert all(
        r["samples"] == 96 and r["client_cpu_ms_per_sample"] > 0 for r in rows if "engine" in r
    )
    assert any(r["name"].startswith("round 1: decode limit") for r in rows)
    for figure in (
        "threads: local epoch / decode limit",
        "threads: client CPU per sample s3 / local (goal <= 1.15)",
        "threads / processes: s3 epoch samples/s",
        "processes: first batch s",
    ):
        assert figure in out
    assert out.startswith("# issue 31 (engines): ")  # the command that produced the figures


def test_obstore_eval_compares_both_clients() -> None:
    out = _run(
        str(BENCHMARKS / "obstore_eval.py"),
        "--objects", "1", "--mb", "8", "--rounds", "1", "--stores", "gcs",
    )  # fmt: skip
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [row["store"] for row in rows] == ["gcs"]
    assert set(rows[0]["results"]) == {"gcsfs", "obstore"}
    assert rows[0]["ratios"]["cpu per GB fsspec / obstore"] > 0


def test_http_load_compares_disk_and_both_servers(tmp_path: Path) -> None:
    out = _run(
        str(BENCHMARKS / "http_load.py"),
        "--partitions", "2", "--samples", "16", "--batch-size", "4", "--work", str(tmp_path),
    )  # fmt: skip
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [row["name"] for row in rows] == [
        "disk",
        "http (Range)",
        "http (Range ignored)",
        "ratios (samples/s)",
    ]
    assert all(row["samples"] == 16 for row in rows[:3])
    assert out.startswith("# issue 33: ")


def test_forget_benchmark_runs(tmp_path: Path) -> None:
    out = _run(
        str(BENCHMARKS / "forget.py"),
        "--samples", "300", "--partitions", "6", "--versions", "3", "--fraction", "0.05",
        "--shard-size", "16KiB", "--root", str(tmp_path / "root"),
    )  # fmt: skip
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    one, many = (r for r in rows if "forget" in r)
    # one key: one shard per distinct content of it (a replaced partition holds another)
    assert one["keys"] == 1 and 1 <= one["shards_rewritten"] <= 3 and one["versions_redacted"] == 3
    assert many["keys"] == 15 and many["shards_rewritten"] >= 1
    assert rows[-1]["check_ok"] is True
