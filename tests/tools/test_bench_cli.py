"""``shardlake bench pack|load`` JSON output, and the pack cost model's arithmetic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import shardlake
from shardlake.errors import UsageError
from shardlake.tools.bench.costmodel import (
    Calibration,
    extrapolate,
    fit,
    load_partition_sizes,
    makespan,
)

CLI = [sys.executable, "-m", "shardlake.cli.main"]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: int = 240) -> dict:
    proc = subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


# --- cost model ------------------------------------------------------------------------------


def test_fit_recovers_overhead_and_rate_exactly():
    # seconds = 0.5 + bytes / 10 MB/s
    points = [Calibration(f"p{i}", 10 * i, b, 0.5 + b / 10e6) for i, b in
              enumerate([1_000_000, 5_000_000, 20_000_000])]  # fmt: skip
    model = fit(points)
    assert model.overhead_s == pytest.approx(0.5)
    assert model.bytes_per_s == pytest.approx(10e6)
    assert model.to_json()["max_relative_fit_error"] == pytest.approx(0.0, abs=1e-9)


def test_fit_with_one_size_is_proportional():
    model = fit([Calibration("a", 10, 2_000_000, 1.0), Calibration("b", 10, 2_000_000, 1.0)])
    assert model.overhead_s == 0 and model.bytes_per_s == pytest.approx(2e6)
    with pytest.raises(UsageError):
        fit([])


def test_makespan_is_longest_first_and_bounded_by_the_largest():
    assert makespan([5, 4, 3, 3, 3], 2) == 10  # LPT: {5, 3} = 8 and {4, 3, 3} = 10
    assert makespan([10, 1, 1, 1], 8) == 10  # more workers cannot split a partition
    assert makespan([1] * 10, 1) == 10
    assert makespan([], 4) == 0


def test_extrapolate_sums_partitions_and_flags_the_long_tail():
    model = fit([Calibration("a", 1, 1_000_000, 1.0), Calibration("b", 2, 3_000_000, 2.0)])
    # overhead 0.5 s, 2 MB/s
    corpus = [{"npz_bytes": 1_000_000, "samples": 10}] * 10 + [
        {"npz_bytes": 99_000_000, "samples": 9}
    ]
    one = extrapolate(model, corpus, 1)
    assert one["serial_seconds"] == pytest.approx(10 * 1.0 + 50.0)
    assert one["predicted_wall_seconds"] == one["serial_seconds"]
    assert one["samples"] == 109 and one["partitions"] == 11
    many = extrapolate(model, corpus, 16)
    assert many["predicted_wall_seconds"] == pytest.approx(50.0)
    assert many["bound_by_largest_partition"] is True


def test_partition_tables_from_tsv_and_json(tmp_path: Path):
    tsv = tmp_path / "p.tsv"
    tsv.write_text("id\tpath\tsamples\tnpz_bytes\nab\tlog1\t3\t300\ncd\tlog2\t5\t500\n")
    assert [r["npz_bytes"] for r in load_partition_sizes(tsv)] == [300, 500]
    js = tmp_path / "p.json"
    js.write_text(json.dumps({"partitions": [{"samples": 2, "npz_bytes": 7}]}))
    assert load_partition_sizes(js) == [{"samples": 2, "npz_bytes": 7}]
    bad = tmp_path / "bad.tsv"
    bad.write_text("id\tsamples\nab\t3\n")
    with pytest.raises(UsageError, match="no 'npz_bytes' column"):
        load_partition_sizes(bad)


# --- bench pack --------------------------------------------------------------------------------


def test_bench_pack_calibrates_and_predicts(tmp_path: Path):
    corpus = tmp_path / "big.tsv"
    rows = "".join(f"p{i}\tlog{i}\t240\t{240 * 270_000}\n" for i in range(1000))
    corpus.write_text("id\tpath\tsamples\tnpz_bytes\n" + rows)
    doc = run_cli(
        "bench", "pack", "--synth-partitions", "3", "--synth-samples", "6", "--neighbors", "4",
        "--workers", "2", "--corpus", str(corpus), "--predict-workers", "1",
        "--predict-workers", "8", "--root", str(tmp_path / "roots"),
    )  # fmt: skip
    cal = doc["calibration"]
    assert cal["partitions"] == 3 and cal["samples"] == 2 + 4 + 6
    assert cal["samples_per_s_1_worker"] > 0 and cal["mb_per_s_1_worker"] > 0
    model = doc["cost_model"]
    assert model["bytes_per_s"] > 0 and model["overhead_s"] >= 0
    assert len(model["calibration"]) == 3
    assert doc["parallel"]["workers"] == 2 and doc["parallel"]["samples_per_s"] > 0
    assert set(doc["stage_ms_per_frame"]) == {
        "read+sha256", "npz_inflate", "safetensors_encode", "zstd", "verify", "np.load",
    }  # fmt: skip
    goals, stage = doc["goals"], doc["stage_ms_per_frame"]
    floor = stage["npz_inflate"] + stage["safetensors_encode"] + stage["zstd"]
    assert goals["floor_ms"] == pytest.approx(floor, abs=2e-3)
    assert goals["shardlake_ms"] > goals["floor_ms"]  # + hashing and verification
    assert 0 < goals["ceiling_vs_floor"] < 1 and goals["ceiling_vs_webdataset"] > 0
    assert goals["pack_vs_floor"] > 0 and goals["pack_vs_floor_goal"] == 0.8
    one, eight = doc["prediction"]["by_workers"]
    assert (one["workers"], eight["workers"]) == (1, 8)
    assert one["partitions"] == 1000 and one["samples"] == 240_000
    expected = 1000 * (model["overhead_s"] + 240 * 270_000 / model["bytes_per_s"])
    assert one["serial_seconds"] == pytest.approx(expected, rel=1e-3)
    assert eight["predicted_wall_seconds"] < one["predicted_wall_seconds"]
    assert doc["peak_rss_mb"] >= doc["peak_pss_mb"] > 0
    # The scratch packs under --root were removed.
    assert not any(p.is_file() for p in (tmp_path / "roots").rglob("*"))


def test_bench_pack_refuses_a_bad_corpus_table_before_calibrating(tmp_path: Path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("")
    proc = subprocess.run(
        [*CLI, "bench", "pack", "--corpus", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "empty" in proc.stderr


# --- bench load ----------------------------------------------------------------------------------


@pytest.mark.parametrize("store_kind", ["local", "s3"])
def test_bench_load_reports_throughput_bytes_and_mixing(
    store_location, store_kind: str, tmp_path: Path
):
    from shardlake.testing import synth_corpus

    src = synth_corpus(tmp_path / "src", 3, 12, seed=5, neighbors=4, lanes=4)
    shardlake.open(store_location.url, **store_location.storage_options).pack(src.root, tag="v1", workers=1)  # fmt: skip
    doc = run_cli(
        "bench", "load", store_location.url, "--version", "v1", "--batch-size", "6",
        "--num-workers", "2", "--where", f"log_file_id <> '{src.partitions[0]}'",
        env=store_location.env,
    )  # fmt: skip
    assert doc["version"] == "v1" and doc["selected_samples"] == 24
    assert doc["samples"] == 24 and doc["batches"] == 4  # one epoch, whole batches, no replays
    assert doc["samples_per_s"] > 0 and doc["decoded_mb_per_s"] > 0
    assert 0 < doc["time_to_first_batch_s"] < 60
    # Summed RSS counts pages shared with the workers once per process; PSS splits them.
    assert doc["peak_rss_mb"] >= doc["peak_pss_mb"] > 0
    # Every store request of every process is counted: the members plus a little framing.
    assert doc["bytes_fetched"] >= doc["selected_payload_mb"] * 1e6
    assert 1.0 <= doc["fetched_per_payload"] < 1.6
    assert doc["requests_by_op"].get("read_ranges", 0) >= 1
    # The endpoint reaches the CLI only as AWS_ENDPOINT_URL(_S3): obstore still serves (#31).
    assert doc["read_client"] == ("obstore" if store_kind == "s3" else "local")
    goals = doc["goals"]
    assert goals["decode_limit_samples_per_s"] > 0 and goals["loader_vs_decode_limit"] > 0
    assert goals["decode_cpu_ms_per_sample"] > 0 and goals["decode_share_of_loader_cpu"] > 0
    assert goals["mean_mb_per_request"] > 0 and goals["loader_vs_decode_limit_goal"] == 0.75
    # The client's CPU per sample (main process + DataLoader workers) beside the rates.
    assert goals["store"] == ("s3" if store_kind == "s3" else "local")
    assert goals["samples_per_s"] == doc["samples_per_s"] > 0
    assert goals["client_cpu_ms_per_sample"] > 0
    assert len(goals["epoch_client_cpu_ms_per_sample"]) == len(goals["epoch_samples_per_s"]) == 1
    assert all(ms > 0 for ms in goals["epoch_client_cpu_ms_per_sample"])
    assert doc["epoch_client_cpu_ms_per_sample"] == goals["epoch_client_cpu_ms_per_sample"]
    # Both engines side by side (issue #31), the default one's figures at the top level.
    engines = doc["engines"]
    assert doc["engine"] == "threads" and "threads / processes samples/s" in engines
    for engine in ("threads", "processes"):
        assert (
            engines[engine]["samples_per_s"] > 0 and engines[engine]["client_cpu_ms_per_sample"] > 0
        )
        assert engines[engine]["peak_pss_b_per_sample"] > 0
    assert engines["threads"]["samples_per_s"] == doc["samples_per_s"]
    mixing = doc["mixing"]
    assert mixing["partitions"] == 2 and mixing["batches"] == 4
    assert 0 <= mixing["js_mean"] <= mixing["js_max"] <= 1


# --- mixing ------------------------------------------------------------------------------------


def test_mixing_command_shuffled_beats_unshuffled(tmp_path: Path):
    from shardlake.testing import synth_corpus

    src = synth_corpus(tmp_path / "src", 4, 16, seed=2, neighbors=4, lanes=4)
    shardlake.open(str(tmp_path / "root")).pack(src.root, tag="v1", workers=1)
    common = ["mixing", str(tmp_path / "root"), "--batch-size", "8", "--world-size", "2", "--json"]
    shuffled = run_cli(*common)
    ordered = run_cli(*common, "--no-shuffle")
    assert shuffled["batches"] == ordered["batches"] == 64 // 8
    assert shuffled["partitions"] == 4 and shuffled["version"] == "v1"
    # A partition-ordered stream is far from the selection; the planned shuffle much closer,
    # and the global-shuffle floor is reported next to it.
    assert shuffled["js_mean"] < ordered["js_mean"]
    floor = shuffled["global_shuffle_baseline"]["js_mean"]
    assert 0 < floor <= shuffled["js_mean"] + 0.15
    proc = subprocess.run([*CLI, *common[:-1]], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "a perfect global shuffle" in proc.stdout
