from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from shardlake.cli.main import main
from shardlake.tools.synth import synth_corpus

V2_ARRAYS = {
    "version": ("<u4", (1,)),
    "ego_agent_past": ("<f4", (31, 3)),
    "ego_current_state": ("<f4", (10,)),
    "ego_agent_future": ("<f4", (80, 3)),
    "neighbor_agents_past": ("<f4", (4, 31, 11)),
    "neighbor_agents_future": ("<f4", (4, 80, 3)),
    "static_objects": ("<f4", (5, 10)),
    "lanes": ("<f4", (6, 20, 33)),
    "lanes_speed_limit": ("<f4", (6, 1)),
    "lanes_has_speed_limit": ("|b1", (6, 1)),
    "route_lanes": ("<f4", (6, 20, 33)),
    "route_lanes_speed_limit": ("<f4", (6, 1)),
    "route_lanes_has_speed_limit": ("|b1", (6, 1)),
    "polygons": ("<f4", (10, 40, 3)),
    "line_strings": ("<f4", (60, 20, 4)),
    "goal_pose": ("<f4", (3,)),
    "turn_indicators": ("<i4", (31,)),
    "ego_shape": ("<f4", (3,)),
}


def test_v2_frames_have_the_reference_arrays(tmp_path: Path) -> None:
    result = synth_corpus(tmp_path, 2, 3, seed=5, neighbors=4, lanes=6)
    assert result.samples == 6 and len(result.partitions) == 2
    for path in result.files:
        # Names look like <log_dir>/<log_dir>_<token>.npz
        assert re.fullmatch(re.escape(path.parent.name) + r"_[0-9a-f]{16}\.npz", path.name)
        with np.load(path, allow_pickle=False) as npz:
            assert list(npz.files) == list(V2_ARRAYS)
            got = {n: (npz[n].dtype.str, npz[n].shape) for n in npz.files}
            assert got == V2_ARRAYS
            assert npz["version"][0] == 2
            # Mostly zero padding, but not all zeros.
            lanes = npz["lanes"]
            assert 0 < np.count_nonzero(lanes) < lanes.size


def test_full_size_v2_frame_is_realistic(tmp_path: Path) -> None:
    result = synth_corpus(tmp_path, 1, 1, seed=1)
    with np.load(result.files[0]) as npz:
        raw = sum(npz[n].nbytes for n in npz.files)
        assert npz["neighbor_agents_past"].shape == (320, 31, 11)
    assert 1_100_000 < raw < 1_300_000  # reference: ~1.2 MB uncompressed
    size = result.files[0].stat().st_size
    assert raw / 10 < size < raw / 2  # compresses well (zero padding), not trivially


def test_nuplan_frames_hold_0d_strings(tmp_path: Path) -> None:
    result = synth_corpus(tmp_path, 1, 2, seed=3, format="nuplan", neighbors=2, lanes=4)
    with np.load(result.files[0], allow_pickle=False) as npz:
        assert len(npz.files) == 12
        assert npz["map_name"].shape == () and npz["map_name"].dtype.kind == "U"
        token = str(npz["token"])
    assert result.files[0].name.endswith(f"_{token}.npz")


def test_sidecars_and_skip_fraction(tmp_path: Path) -> None:
    result = synth_corpus(tmp_path, 2, 20, seed=2, neighbors=4, lanes=4, skip_fraction=0.5)
    docs = [json.loads(p.with_suffix(".json").read_text()) for p in result.files]
    assert sum(d["is_skipped"] for d in docs) == result.skipped
    assert 5 <= result.skipped <= 35
    doc = docs[0]
    for name in ("timestamp", "x", "y", "z", "qx", "qy", "qz", "qw", "neighbor_ids", "log_file_id"):
        assert name in doc
    assert set(doc["skipping_info"]) == {"label", "details", "incomplete_data_types"}
    skipped = [d for d in docs if d["is_skipped"]]
    assert all(d["skipping_info"]["label"] >= 1 for d in skipped)


def test_deterministic_from_seed(tmp_path: Path) -> None:
    a = synth_corpus(tmp_path / "a", 2, 2, seed=9, neighbors=4, lanes=4)
    b = synth_corpus(tmp_path / "b", 2, 2, seed=9, neighbors=4, lanes=4)
    c = synth_corpus(tmp_path / "c", 2, 2, seed=10, neighbors=4, lanes=4)
    rel = [p.relative_to(a.root) for p in a.files]
    assert rel == [p.relative_to(b.root) for p in b.files]
    for r in rel:
        assert (a.root / r).read_bytes() == (b.root / r).read_bytes()
        assert (a.root / r).with_suffix(".json").read_bytes() == (b.root / r).with_suffix(
            ".json"
        ).read_bytes()
    assert rel != [p.relative_to(c.root) for p in c.files]


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="format"):
        synth_corpus(tmp_path, 1, 1, format="v9")
    with pytest.raises(ValueError):
        synth_corpus(tmp_path, 1, 1, skip_fraction=2.0)


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "synth",
            str(tmp_path / "s"),
            "--partitions",
            "2",
            "--samples",
            "2",
            "--neighbors",
            "4",
            "--lanes",
            "4",
            "--format",
            "nuplan",
            "--seed",
            "1",
        ]
    )
    assert code == 0
    assert "wrote 4 frames" in capsys.readouterr().out
    assert len(list((tmp_path / "s").rglob("*.npz"))) == 4
    assert (
        main(
            [
                "synth",
                str(tmp_path / "t"),
                "--partitions",
                "1",
                "--samples",
                "1",
                "--skip-fraction",
                "3",
            ]
        )
        == 2
    )
