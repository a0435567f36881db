"""compare-runs: the band is the baseline's plateau mean ± k·sd; refusals say why."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from shardlake.cli.main import main
from shardlake.tools.compare_runs import ComparisonRefusedError, compare_runs

ARGS = {
    "epochs": 8,
    "batch_size": 16,
    "valid_batch_size": 32,
    "num_workers": 2,
    "valid_num_workers": None,
    "world_size": 2,
    "lr": 0.01,
    "hidden": 64,
}

# Baseline plateau over epochs 3..7 of valid_loss: mean 0.5, sample sd 0.0158...
BASE_VALID = [0.9, 0.7, 0.6, 0.52, 0.48, 0.50, 0.51, 0.49]
BASE_TRAIN = [1.0, 0.8, 0.65, 0.55, 0.50, 0.49, 0.50, 0.48]


def write_run(
    path: Path,
    valid: list[str | float],
    train: list[str | float] | None = None,
    epochs: list[int] | None = None,
    args: dict | None = None,
) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "args.json").write_text(json.dumps(ARGS if args is None else args))
    train = BASE_TRAIN[: len(valid)] if train is None else train
    epochs = list(range(len(valid))) if epochs is None else epochs
    lines = ["epoch\ttrain_loss\tvalid_loss\tseconds"]
    for e, t, v in zip(epochs, train, valid, strict=True):
        lines.append(f"{e}\t{t}\t{v}\t1.5")
    (path / "train_log.tsv").write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def baseline(tmp_path: Path) -> Path:
    return write_run(tmp_path / "base", BASE_VALID)


def test_matching_candidate_passes_and_reports_band(baseline: Path, tmp_path: Path, capsys):
    cand = write_run(
        tmp_path / "cand",
        [0.91, 0.69, 0.61, 0.51, 0.49, 0.505, 0.50, 0.495],
        train=[1.01, 0.79, 0.66, 0.54, 0.51, 0.49, 0.49, 0.49],
    )
    result = compare_runs(baseline, cand, plateau=5, k=2)
    assert result.passed
    assert (result.epoch_first, result.epoch_last) == (3, 7)
    assert result.baseline_rows == [4, 5, 6, 7, 8]
    # Default metrics are the loss columns, never the timing column.
    assert [m.metric for m in result.metrics] == ["train_loss", "valid_loss"]
    valid = result.metrics[1]
    assert valid.baseline_mean == pytest.approx(0.5)
    assert valid.baseline_sd == pytest.approx(math.sqrt(0.001 / 4))
    assert valid.band_low == pytest.approx(0.5 - 2 * valid.baseline_sd)

    assert main(["compare-runs", str(baseline), str(cand), "--plateau", "5"]) == 0
    out = capsys.readouterr().out
    assert "epochs 3..7" in out and "rows used" in out and "PASS" in out
    assert "base sd" in out and "cand sd" in out


def test_diverged_mean_fails_naming_metric(baseline: Path, tmp_path: Path, capsys):
    # Valid loss plateaus 0.1 higher: far outside mean ± 2·0.016.
    cand = write_run(tmp_path / "cand", [v + 0.1 for v in BASE_VALID])
    result = compare_runs(baseline, cand, plateau=5, k=2)
    assert not result.passed
    verdicts = {m.metric: m.passed for m in result.metrics}
    assert verdicts == {"train_loss": True, "valid_loss": False}
    assert main(["compare-runs", str(baseline), str(cand), "--plateau", "5"]) == 1
    out = capsys.readouterr().out
    assert "FAIL: candidate plateau mean outside the baseline band for valid_loss" in out


def test_wider_k_turns_a_borderline_fail_into_a_pass(baseline: Path, tmp_path: Path):
    cand = write_run(tmp_path / "cand", BASE_VALID[:3] + [v + 0.04 for v in BASE_VALID[3:]])
    assert not compare_runs(baseline, cand, plateau=5, k=2, metrics=["valid_loss"]).passed
    assert compare_runs(baseline, cand, plateau=5, k=3, metrics=["valid_loss"]).passed


def test_missing_plateau_epoch_is_refused(baseline: Path, tmp_path: Path):
    epochs = [0, 1, 2, 3, 4, 6, 7]
    vals = [BASE_VALID[e] for e in epochs]
    cand = write_run(tmp_path / "cand", vals, train=[BASE_TRAIN[e] for e in epochs], epochs=epochs)
    with pytest.raises(
        ComparisonRefusedError, match=r"epoch coverage differs: candidate lacks epoch\(s\) \[5\]"
    ):
        compare_runs(baseline, cand, plateau=5)


def test_candidate_that_ran_longer_is_refused(baseline: Path, tmp_path: Path):
    cand = write_run(tmp_path / "cand", BASE_VALID + [0.5], train=BASE_TRAIN + [0.5])
    with pytest.raises(ComparisonRefusedError, match=r"candidate has extra epoch\(s\) \[8\]"):
        compare_runs(baseline, cand, plateau=5)


def test_empty_cell_in_range_is_refused(baseline: Path, tmp_path: Path):
    vals: list[str | float] = list(BASE_VALID)
    vals[6] = ""
    cand = write_run(tmp_path / "cand", vals)
    with pytest.raises(ComparisonRefusedError, match=r"epoch 6, column 'valid_loss': empty cell"):
        compare_runs(baseline, cand, plateau=5)


def test_truncated_row_counts_as_empty_cell(baseline: Path, tmp_path: Path):
    cand = write_run(tmp_path / "cand", BASE_VALID)
    log = cand / "train_log.tsv"
    lines = log.read_text().splitlines()
    lines[5] = "4\t0.5"  # epoch 4 lost its valid_loss cell entirely
    log.write_text("\n".join(lines) + "\n")
    with pytest.raises(ComparisonRefusedError, match=r"epoch 4, column 'valid_loss': empty cell"):
        compare_runs(baseline, cand, plateau=5)


@pytest.mark.parametrize("bad", ["nan", "inf", "n/a"])
def test_nan_or_non_numeric_cell_is_refused(baseline: Path, tmp_path: Path, bad: str):
    vals: list[str | float] = list(BASE_VALID)
    vals[7] = bad
    cand = write_run(tmp_path / "cand", vals)
    with pytest.raises(ComparisonRefusedError, match=r"epoch 7, column 'valid_loss'"):
        compare_runs(baseline, cand, plateau=5)


def test_bad_cell_outside_the_plateau_is_ignored(baseline: Path, tmp_path: Path):
    vals: list[str | float] = list(BASE_VALID)
    vals[0] = "nan"  # a diverged first epoch is irrelevant to the plateau
    cand = write_run(tmp_path / "cand", vals)
    assert compare_runs(baseline, cand, plateau=5).passed


def test_mismatched_validation_workers_refused(baseline: Path, tmp_path: Path, capsys):
    cand = write_run(tmp_path / "cand", BASE_VALID, args={**ARGS, "valid_num_workers": 4})
    with pytest.raises(
        ComparisonRefusedError, match=r"valid_num_workers: baseline 2 != candidate 4"
    ):
        compare_runs(baseline, cand, plateau=5)
    assert main(["compare-runs", str(baseline), str(cand), "--plateau", "5"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("shardlake compare-runs: error: the runs disagree")
    assert "valid_num_workers: baseline 2 != candidate 4" in err


def test_inherited_validation_workers_resolve_before_comparing(baseline: Path, tmp_path: Path):
    # Baseline inherits 2 train workers; the candidate trains with 4 but validates with 2 → equal.
    cand_args = {**ARGS, "num_workers": 4, "valid_num_workers": 2}
    cand = write_run(tmp_path / "cand", BASE_VALID, args=cand_args)
    result = compare_runs(baseline, cand, plateau=5)
    assert result.passed and "valid_num_workers" in result.checked_args


def test_setting_recorded_by_one_run_only_is_refused(baseline: Path, tmp_path: Path):
    args = dict(ARGS)
    del args["world_size"]
    cand = write_run(tmp_path / "cand", BASE_VALID, args=args)
    with pytest.raises(
        ComparisonRefusedError, match="world_size: baseline has 2, candidate does not"
    ):
        compare_runs(baseline, cand, plateau=5)


def test_data_path_settings_may_differ(baseline: Path, tmp_path: Path):
    cand = write_run(
        tmp_path / "cand", BASE_VALID, args={**ARGS, "dataset_root": "s3://b/x", "npz_list": None}
    )
    assert compare_runs(baseline, cand, plateau=5).passed


@pytest.mark.parametrize("k", ["0", "-1", "nan"])
def test_nonpositive_k_is_refused_exit_1(baseline: Path, k: str):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardlake.cli.main",
            "compare-runs",
            str(baseline),
            str(baseline),
            "--k",
            k,
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert "--k must be a positive number" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_plateau_longer_than_the_run_is_refused(baseline: Path):
    with pytest.raises(
        ComparisonRefusedError, match="--plateau 9 needs 9 epochs but the baseline has 8"
    ):
        compare_runs(baseline, baseline, plateau=9)


def test_duplicate_epoch_rows_are_refused(baseline: Path, tmp_path: Path):
    epochs = [0, 1, 2, 3, 4, 5, 6, 6]
    cand = write_run(tmp_path / "cand", BASE_VALID, epochs=epochs)
    with pytest.raises(ComparisonRefusedError, match=r"epoch\(s\) \[6\] appear more than once"):
        compare_runs(baseline, cand, plateau=5)


def test_missing_args_json_is_refused(baseline: Path, tmp_path: Path):
    cand = write_run(tmp_path / "cand", BASE_VALID)
    (cand / "args.json").unlink()
    with pytest.raises(ComparisonRefusedError, match="args.json: missing"):
        compare_runs(baseline, cand)


def test_unknown_metric_is_refused(baseline: Path):
    with pytest.raises(ComparisonRefusedError, match="no column 'ade'"):
        compare_runs(baseline, baseline, metrics=["ade"])


def test_json_output(baseline: Path, capsys):
    assert (
        main(["compare-runs", str(baseline), str(baseline), "--json", "--metric", "valid_loss"])
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["passed"] is True
    assert doc["epoch_first"] == 3 and doc["epoch_last"] == 7
    assert doc["metrics"][0]["metric"] == "valid_loss"
    assert doc["metrics"][0]["baseline_sd"] == pytest.approx(doc["metrics"][0]["candidate_sd"])


# --- runs shaped like Diffusion-Planner's (args.json = its TrainConfig fields) ---------------

DP_ARGS = {
    "exp_name": "dp-npz",
    "save_dir": "/runs/dp-npz",
    "train_set_list": "/data/lists/train.json",
    "valid_set_list": "/data/lists/valid.json",
    "train_subsample_step": 1,
    "future_len": 80,
    "time_len": 31,
    "ego_prediction_horizon": 80,
    "agent_state_dim": 11,
    "agent_num": 320,
    "static_objects_state_dim": 10,
    "static_objects_num": 5,
    "lane_num": 140,
    "lane_len": 20,
    "route_num": 25,
    "route_len": 20,
    "polygon_num": 10,
    "polygon_len": 40,
    "line_string_num": 60,
    "line_string_len": 20,
    "use_data_augment": True,
    "augment_prob": 0.5,
    "augment_type": "quintic",
    "num_refine": 20,
    "ego_past_noise_std": 0.1,
    "use_smoothing_future_trajectory": True,
    "normalization_file_path": "normalization.json",
    "num_workers": 8,
    "pin_mem": True,
    "seed": 3407,
    "train_epochs": 8,
    "batch_size": 512,
    "save_utd": 10,
    "learning_rate": 1e-4,
    "warm_up_epoch": 5,
    "encoder_drop_path_rate": 0.1,
    "decoder_drop_path_rate": 0.1,
    "use_ego_history": True,
    "ego_history_dropout_rate": 0.6,
    "use_turn_indicators": True,
    "coeff_position_lat_loss": 1.0,
    "coeff_position_lon_loss": 1.0,
    "coeff_heading_l2_loss": 1.0,
    "coeff_velocity": 1.0,
    "coeff_timestep": [1.0, 1.0, 1.0, 1.0],
    "coeff_road_border_loss": 1.0,
    "road_border_margin": 0.25,
    "road_border_n_interp": 2,
    "coeff_neighbor_collision_loss": 0.0,
    "alpha_planning_loss": 1.0,
    "alpha_neighbor_loss": 0.1,
    "use_velocity_representation": False,
    "guidance_scale": 0.5,
    "device": "cuda",
    "use_ema": True,
    "encoder_mixer_depth": 6,
    "encoder_fusion_depth": 6,
    "decoder_depth": 3,
    "num_heads": 8,
    "hidden_dim": 256,
    "diffusion_model_type": "x_start",
    "predicted_neighbor_num": 320,
    "resume_model_path": None,
    "use_wandb": False,
    "wandb_run_id": None,
    "wandb_project_name": "Diffusion-Planner",
    "notes": "",
    "ddp": True,
    "port": "22323",
    "closed_loop_npz_root": "",
    "state_normalizer": None,
    "observation_normalizer": None,
}
DP_VALID = [0.9, 0.7, 0.6, 0.52, 0.48, 0.50, 0.51, 0.49]


def write_dp_run(path: Path, args: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "args.json").write_text(json.dumps(args, indent=2))
    lines = ["epoch\ttrain_loss\tvalid_loss_ego\tvalid_loss_neighbor\tvalid_loss_total"]
    for e, v in enumerate(DP_VALID):
        lines.append(f"{e}\t{v + 0.1}\t{v}\t{v / 2}\t{v * 1.5}")
    (path / "train_log.tsv").write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    "name, value", [("learning_rate", 2e-4), ("hidden_dim", 192), ("use_data_augment", False)]
)
def test_diffusion_planner_loss_shifting_args_are_flagged(tmp_path: Path, name, value, capsys):
    base = write_dp_run(tmp_path / "base", DP_ARGS)
    cand = write_dp_run(tmp_path / "cand", {**DP_ARGS, name: value, "exp_name": "dp-other"})
    with pytest.raises(ComparisonRefusedError, match=rf"{name}: baseline .* != candidate"):
        compare_runs(base, cand, plateau=5)
    assert main(["compare-runs", str(base), str(cand)]) == 1
    err = capsys.readouterr().err
    assert name in err and "1 other difference ignored" in err and "--ignore-arg" in err
    # --ignore-arg lets it pass and the report says it was ignored on request.
    result = compare_runs(base, cand, plateau=5, ignore_args=[name])
    assert result.passed
    assert {(d.name, d.ignored, d.reason) for d in result.arg_differences} >= {
        (name, True, "--ignore-arg")
    }


def test_diffusion_planner_npz_vs_shard_runs_pass(tmp_path: Path, capsys):
    base = write_dp_run(tmp_path / "base", DP_ARGS)
    shard_args = {k: v for k, v in DP_ARGS.items() if k not in ("train_set_list", "valid_set_list")}
    shard_args.update(
        exp_name="dp-shards",
        save_dir="/runs/dp-shards",
        dataset_root="s3://bucket/corpus",
        train_keyset="train",
        valid_keyset="valid",
    )
    cand = write_dp_run(tmp_path / "cand", shard_args)
    result = compare_runs(base, cand, plateau=5)
    assert result.passed
    differing = {d.name: d for d in result.arg_differences}
    assert set(differing) == {
        "exp_name",
        "save_dir",
        "train_set_list",
        "valid_set_list",
        "dataset_root",
        "train_keyset",
        "valid_keyset",
    }
    assert all(d.ignored for d in differing.values())
    assert "data-path" in differing["train_keyset"].reason
    assert "learning_rate" in result.checked_args and "hidden_dim" in result.checked_args
    assert main(["compare-runs", str(base), str(cand)]) == 0
    out = capsys.readouterr().out
    assert "settings differ: exp_name" in out and "ignored: experiment name" in out
    # --check-arg takes a name off the allowlist.
    with pytest.raises(ComparisonRefusedError, match="exp_name"):
        compare_runs(base, cand, plateau=5, check_args=["exp_name"])


def test_unknown_argument_counts_by_default(tmp_path: Path):
    base = write_dp_run(tmp_path / "base", DP_ARGS)
    cand = write_dp_run(tmp_path / "cand", {**DP_ARGS, "brand_new_knob": 3})
    with pytest.raises(ComparisonRefusedError, match="brand_new_knob: candidate has 3"):
        compare_runs(base, cand, plateau=5)


def test_example_script_npz_and_shard_records_are_comparable(tmp_path: Path):
    # The args.json examples/train_ddp.py writes for its two data paths (flags + resolved values).
    common = {
        "nproc": 2, "epochs": 8, "batch_size": 16, "valid_batch_size": None, "num_workers": 0,
        "valid_num_workers": None, "lr": 1e-3, "hidden": 64, "seed": 0, "max_steps": None,
        "train_samples": 48, "valid_samples": 16, "world_size": 2, "model": "mlp",
        "optimizer": "adam", "loss": "mse", "inputs": ["ego_agent_past"],
        "targets": ["ego_agent_future"], "torch": "2.13",
    }  # fmt: skip
    npz = {
        **common, "out": "runs/npz", "data_path": "npz", "npz_list": "train.json",
        "valid_npz_list": "valid.json", "dataset_root": None, "dataset_version": None,
        "train_keyset": None, "valid_keyset": None, "train_where": None, "valid_where": None,
        "run_record": None,
    }  # fmt: skip
    shards = {
        **common, "out": "runs/shards", "data_path": "shards", "npz_list": None,
        "valid_npz_list": None, "dataset_root": "/r", "dataset_version": "v1",
        "train_keyset": "train", "valid_keyset": "valid", "train_where": None,
        "valid_where": None, "run_record": {"train": {"samples": 48}},
    }  # fmt: skip
    base = write_run(tmp_path / "npz", BASE_VALID, args=npz)
    cand = write_run(tmp_path / "shards", BASE_VALID, args=shards)
    result = compare_runs(base, cand, plateau=5)
    assert result.passed and all(d.ignored for d in result.arg_differences)
    assert {"valid_num_workers", "valid_batch_size", "lr", "hidden"} <= set(result.checked_args)


def test_strict_says_identical_only_when_every_cell_is(baseline: Path, tmp_path: Path, capsys):
    """--strict: for a switch that must change nothing (order='torch', issue 50)."""
    same = write_run(tmp_path / "same", BASE_VALID)
    assert main(["compare-runs", str(baseline), str(same), "--strict"]) == 0
    out = capsys.readouterr().out
    assert "identical: every cell" in out and "8 epoch rows x 3 columns" in out
    # One last-digit difference in one cell is a failure naming the cell (the band would pass).
    valid = [*BASE_VALID[:-1], 0.4900001]
    near = write_run(tmp_path / "near", valid)
    assert main(["compare-runs", str(baseline), str(near), "--strict"]) == 1
    out = capsys.readouterr().out
    assert "differs: epoch 7, valid_loss: baseline 0.49 != candidate 0.4900001" in out
    assert "DIFFERENT: 1 cell(s)" in out
    assert main(["compare-runs", str(baseline), str(near)]) == 0  # the band: inside
    capsys.readouterr()
    # --metric narrows the cells compared; --json carries the verdict.
    assert (
        main(["compare-runs", str(baseline), str(near), "--strict", "--metric", "train_loss"]) == 0
    )
    capsys.readouterr()
    assert main(["compare-runs", str(baseline), str(near), "--strict", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["identical"] is False and doc["differences"][0]["column"] == "valid_loss"
    # Settings that may shift a loss are refused, as without --strict.
    other = write_run(tmp_path / "other", BASE_VALID, args={**ARGS, "lr": 0.02})
    assert main(["compare-runs", str(baseline), str(other), "--strict"]) == 1
    assert "lr: baseline 0.01 != candidate 0.02" in capsys.readouterr().err
