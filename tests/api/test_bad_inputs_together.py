"""Bad source files are reported together: ``inspect`` lists every frame pack would refuse,
``pack`` names every bad file of the partitions it builds in one error and publishes nothing."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from shardlake import open_store
from shardlake.cli.main import main
from shardlake.testing import synth_corpus


def _source(base: Path) -> tuple[Path, list[str], list[str]]:
    """A corpus with bad frames in both partitions: ``(src, bad npz, bad sidecars)``."""
    src = base / "src"
    result = synth_corpus(src, 2, 4, seed=3, neighbors=2, lanes=4)
    one, two = result.partitions
    good = result.files[0].read_bytes()
    (src / one / "broken.npz").write_text("not a zip at all")
    (src / one / "trunc.npz").write_bytes(good[: len(good) // 2])
    # A member whose deflate stream is damaged: the zip parses, the member does not inflate.
    with zipfile.ZipFile(result.files[1]) as zf:
        info = zf.infolist()[1]
    damaged = bytearray(result.files[1].read_bytes())
    extra = int.from_bytes(damaged[info.header_offset + 28 : info.header_offset + 30], "little")
    data_at = info.header_offset + 30 + len(info.filename) + extra
    damaged[data_at + info.compress_size // 2] ^= 0xFF
    (src / two / "member.npz").write_bytes(bytes(damaged))
    (src / two / "text.npz").write_bytes(b"PK\x03\x04 and then nothing")
    result.files[2].with_suffix(".json").write_text("{not json")
    bad_npz = [f"{one}/broken.npz", f"{one}/trunc.npz", f"{two}/member.npz", f"{two}/text.npz"]
    bad_json = [result.files[2].with_suffix(".json").relative_to(src).as_posix()]
    return src, bad_npz, bad_json


def test_inspect_lists_every_unreadable_frame_and_sidecar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, bad_npz, bad_json = _source(tmp_path)
    assert main(["inspect", str(src), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert sorted(line.split(":")[0] for line in report["unreadable"]) == sorted(bad_npz)
    assert len(report["bad_sidecars"]) == 1 and bad_json[0] in report["bad_sidecars"][0]
    assert main(["inspect", str(src)]) == 1
    out = capsys.readouterr().out
    for name in bad_npz:
        assert f"# unreadable: {name}:" in out
    # --no-frame-check only lists and stats: the npz problems are not looked for.
    assert main(["inspect", str(src), "--no-frame-check", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["unreadable"] == []


def test_pack_names_every_bad_file_in_one_error_and_publishes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, bad_npz, bad_json = _source(tmp_path)
    root = tmp_path / "root"
    assert (
        main(["pack", str(src), str(root), "--tag", "v1", "--executor", "inline", "--quiet"]) == 1
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "2 of 2 partition builds failed (5 bad source files); nothing was published" in err
    for name in [*bad_npz, *bad_json]:
        assert name in err, name
    assert not [k for k in open_store(str(root)).list() if k.startswith("versions/")]


def test_pack_names_twenty_bad_files_then_the_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    synth_corpus(src, 1, 2, seed=1, neighbors=2, lanes=4)
    log = next(p for p in src.iterdir() if p.is_dir())
    for i in range(25):
        (log / f"bad{i:02d}.npz").write_text("nope")
    root = tmp_path / "root"
    assert (
        main(["pack", str(src), str(root), "--tag", "v1", "--executor", "inline", "--quiet"]) == 1
    )
    err = capsys.readouterr().err
    assert "(25 bad source files)" in err and "... and 5 more" in err
    assert sum(f"bad{i:02d}.npz" in err for i in range(25)) == 20
    assert not [k for k in open_store(str(root)).list() if k.startswith("versions/")]
