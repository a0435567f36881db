from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from shardlake.cli.main import main
from shardlake.testing import synth_corpus

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


SMALL = ["--neighbors", "2", "--lanes", "4", "--quiet"]


def _synth(dest: Path, *extra: str) -> list[str]:
    return ["synth", str(dest), "--partitions", "2", "--samples", "3", *SMALL, *extra]


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_synth_never_overwrites_a_converter_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: synth --layout converter into a converter tree whose file names it
    would draw again replaced a real frame and its sidecar; now it is refused, --add or not."""
    tree = tmp_path / "frames"
    assert main(_synth(tree, "--layout", "converter")) == 0
    frame = sorted(tree.rglob("*.npz"))[0]
    frame.write_bytes(b"a real 200 KB frame")  # the user's data under a colliding name
    frame.with_suffix(".json").write_text('{"real": true}')
    before = _tree(tree)
    capsys.readouterr()
    for extra in ([], ["--add"]):
        assert main(_synth(tree, "--layout", "converter", *extra)) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "error" in err and str(tree) in err
        assert _tree(tree) == before
    assert "already exist" in err and "nothing was written" in err and "seed" in err


def test_synth_refuses_a_folder_that_holds_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "mine"
    (target / "log").mkdir(parents=True)
    for name in ("a.npz", "b.json", "c.txt", "log/d.npz", "log/e.npz"):
        (target / name).write_bytes(name.encode())
    before = _tree(target)
    assert main(_synth(target)) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "holds 5 files" in err and "a.npz, b.json, c.txt and 2 more" in err
    assert "--add" in err
    assert _tree(target) == before
    (tmp_path / "empty" / "sub").mkdir(parents=True)  # empty folders hold no files
    assert main(_synth(tmp_path / "empty")) == 0


def test_synth_refuses_a_file_as_target_or_parent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file where the folder should be is named as such (not 'holds 1 file(s) - see --add',
    not a raw NotADirectoryError)."""
    afile = tmp_path / "afile"
    afile.write_text("hi")
    for target, extra in ((afile, []), (afile, ["--add"]), (afile / "sub", [])):
        assert main(_synth(target, *extra)) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("shardlake synth: error: "), err
        assert f"{afile}" in err and "exists and is not a folder" in err, err
        assert "--add" not in err and "NotADirectoryError" not in err, err
    assert afile.read_text() == "hi"


def test_synth_add_writes_beside_and_never_overwrites(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "frames"
    assert main(_synth(target)) == 0
    before = _tree(target)
    assert main(_synth(target, "--add", "--seed", "7")) == 0
    after = _tree(target)
    assert {k: after[k] for k in before} == before  # every old file as it was
    assert len([k for k in after if k.endswith(".npz")]) == 12
    capsys.readouterr()
    # The same seed again would draw the same names: refused as a whole, nothing written.
    assert main(_synth(target, "--add", "--seed", "7")) == 1
    assert "12 of the 12 files" in capsys.readouterr().err
    assert _tree(target) == after


def test_synth_shows_progress(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _synth(tmp_path / "s")
    argv.remove("--quiet")
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "synth: 2/2 partitions, 6/6 frames (100.0%)" in err
