"""A tree shaped like Diffusion-Planner's converter output goes inspect -> pack -> verify ->
keysets through the CLI with no workaround: nested partitions, a sidecar per frame,
``routes/*.json`` summaries (not frames), skipped frames, JSON lists of absolute paths, and
relative local paths on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import shardlake
from shardlake.cli.main import main
from shardlake.testing import SynthResult, synth_corpus

PARTITIONS = 12  # 3 locations x (train, valid) x dates/times: frames sit 4 directories deep
FRAMES = 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> SynthResult:
    base = tmp_path_factory.mktemp("converter")
    return synth_corpus(
        base / "corpus",
        PARTITIONS,
        FRAMES,
        seed=3,
        neighbors=4,
        lanes=4,
        skip_fraction=0.2,
        layout="converter",
    )


def _key(corpus: SynthResult, path: Path) -> str:
    return path.relative_to(corpus.root).as_posix()[: -len(".npz")]


def _training_list(corpus: SynthResult, split: str, *, with_skipped: bool = False) -> list[str]:
    """Absolute npz paths of one split, as the project's training lists hold them."""
    skipped = set(corpus.skipped_files)
    return [
        str(p)
        for p in corpus.files
        if f"/{split}/" in p.as_posix() and (with_skipped or p not in skipped)
    ]


def test_tree_has_the_converter_shape(corpus: SynthResult) -> None:
    assert corpus.skipped > 0 and len(corpus.others) == PARTITIONS
    first = corpus.files[0].relative_to(corpus.root).parts
    assert len(first) == 5 and first[1] in ("train", "valid")  # location/split/date/time/file
    assert first[4].startswith(first[3] + "_")
    side = json.loads(corpus.files[0].with_suffix(".json").read_text())
    assert "log_file_id" not in side and "is_skipped" in side
    assert corpus.others[0].parent.name == "routes"


def test_inspect_pack_verify_keysets_with_no_workaround(
    corpus: SynthResult,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    work = corpus.root.parent
    monkeypatch.chdir(work)
    (work / "train.json").write_text(json.dumps(_training_list(corpus, "train"), indent=1))
    (work / "valid.json").write_text(json.dumps(_training_list(corpus, "valid")))

    # inspect: route summaries are "not frames"; depth 1 is too coarse and says so.
    assert main(["inspect", "corpus"]) == 0
    out = capsys.readouterr().out
    assert f"not frames: {PARTITIONS} files" in out and "/routes/" in out
    # on the command line the suggestion names the flag (as getting-started shows it)
    assert "# suggestion: --partition-depth 1 gives 3 partitions" in out
    assert f"--partition-depth 4 gives {PARTITIONS} partitions" in out
    assert main(["inspect", "corpus", "--partition-depth", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["partitions"]) == PARTITIONS and report["suggestion"] is None
    assert report["skipped"] == corpus.skipped

    # pack (relative source and root), verify (relative source), keysets from absolute JSON lists.
    assert main(["pack", "corpus", "root", "--tag", "v1", "--partition-depth", "4"]) == 0
    assert f"{corpus.samples - corpus.skipped} samples" in capsys.readouterr().out
    assert main(["verify", "root", "--source", "corpus", "--workers", "2"]) == 0
    assert "verify OK" in capsys.readouterr().out
    for split in ("train", "valid"):
        assert main(["keyset", "root", "create", split, "--keys", f"{split}.json"]) == 0
        keyset = shardlake.open(str(work / "root")).keysets.get(split)
        wanted = sorted(_key(corpus, Path(p)) for p in _training_list(corpus, split))
        assert sorted(keyset.keys) == wanted
    assert main(["keyset", "root", "check", "train", "valid"]) == 0
    where = "key LIKE 'odaiba/valid/%'"
    assert main(["keyset", "root", "create", "odaiba-valid", "--where", where]) == 0
    odaiba = shardlake.open(str(work / "root")).keysets.get("odaiba-valid")
    assert odaiba.keys and all(k.startswith("odaiba/valid/") for k in odaiba.keys)
    capsys.readouterr()


def test_path_lists_scope_pack_inspect_and_verify(
    corpus: SynthResult,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    listing = tmp_path / "train.json"
    listing.write_text(json.dumps(_training_list(corpus, "train", with_skipped=True)))
    src = str(corpus.root)
    assert main(["inspect", src, "--partition-depth", "4", "--path-list", "train.json"]) == 0
    args = ["--partition-depth", "4", "--path-list", "train.json", "--quiet"]
    assert main(["pack", src, "scoped", "--tag", "v1", *args]) == 0
    capsys.readouterr()
    assert main(["verify", "scoped", "--source", src, "--path-list", "train.json"]) == 0
    assert "verify OK" in capsys.readouterr().out
    # Without the list, verify sees the valid frames as missing.
    assert main(["verify", "scoped", "--source", src]) == 1
    assert "missing: " in capsys.readouterr().err

    # A list written on another machine maps with --strip-prefix; an entry outside is named.
    moved = [p.replace(src, "/mnt/old/corpus") for p in _training_list(corpus, "train")]
    listing.write_text(json.dumps(moved))
    assert main(["inspect", src, "--path-list", "train.json"]) == 1
    err = capsys.readouterr().err
    assert "train.json[0]" in err and "--strip-prefix" in err
    args = ["--path-list", "train.json", "--strip-prefix", "/mnt/old/corpus", "--json"]
    assert main(["inspect", src, "--partition-depth", "4", *args]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == len(moved)


def test_keyset_from_a_list_with_skipped_frames_names_them(
    corpus: SynthResult,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    src = str(corpus.root)
    assert main(["pack", src, "root", "--tag", "v1", "--partition-depth", "4", "--quiet"]) == 0
    listing = _training_list(corpus, "train", with_skipped=True)
    skipped = [p for p in listing if Path(p) in set(corpus.skipped_files)]
    assert skipped
    (tmp_path / "all.json").write_text(json.dumps(listing))
    capsys.readouterr()
    assert main(["keyset", "root", "create", "t", "--keys", "all.json"]) == 1
    err = capsys.readouterr().err
    assert f"{len(skipped)} entries match no key" in err or f"{len(skipped)} entry" in err
    assert f"{len(skipped)} of them are is_skipped frames" in err
    assert "(skipped frame)" in err and "--allow-unmatched" in err
    n = str(len(skipped))
    assert (
        main(["keyset", "root", "create", "t", "--keys", "all.json", "--allow-unmatched", n]) == 0
    )


def test_strict_refuses_files_that_are_not_frames(
    corpus: SynthResult, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, root = str(corpus.root), str(tmp_path / "root")
    args = ["--partition-depth", "4", "--quiet"]
    assert main(["pack", src, root, "--tag", "v1", "--strict", *args]) == 1
    err = capsys.readouterr().err
    assert "/routes/" in err and "strict discovery refuses" in err and "--exclude" in err
    assert (
        main(["pack", src, root, "--tag", "v1", "--strict", "--exclude", "*/routes/*", *args]) == 0
    )
    # --include narrows discovery to one location.
    capsys.readouterr()
    assert main(["inspect", src, "--include", "odaiba/*", "--partition-depth", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["partitions"] and all(
        p["path"].startswith("odaiba/") for p in report["partitions"]
    )
    assert report["excluded"] > 0


def test_verify_scopes_the_source_like_pack_did(
    corpus: SynthResult, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, root = str(corpus.root), str(tmp_path / "root")
    scope = ["--exclude", "shinjuku/*"]
    assert (
        main(["pack", src, root, "--tag", "v1", "--partition-depth", "4", "--quiet", *scope]) == 0
    )
    capsys.readouterr()
    assert main(["verify", root, "--source", src]) == 1
    assert "missing: shinjuku/" in capsys.readouterr().err
    assert main(["verify", root, "--source", src, *scope]) == 0
    assert "verify OK" in capsys.readouterr().out


def test_remove_by_absolute_list_and_skipped_frames_named(
    corpus: SynthResult, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, root = str(corpus.root), str(tmp_path / "root")
    assert main(["pack", src, root, "--tag", "v1", "--partition-depth", "4", "--quiet"]) == 0
    kept = [p for p in corpus.files if p not in set(corpus.skipped_files)]
    listing = tmp_path / "drop.json"
    listing.write_text(json.dumps([str(kept[0])]))
    assert main(["remove", root, "--tag", "v2", "--base", "v1", "--keys", str(listing)]) == 0
    listing.write_text(json.dumps([str(corpus.skipped_files[0])]))
    capsys.readouterr()
    assert main(["remove", root, "--tag", "v3", "--base", "v2", "--keys", str(listing)]) == 1
    err = capsys.readouterr().err
    assert _key(corpus, corpus.skipped_files[0]) in err and "is_skipped frame(s)" in err


def test_relative_local_paths_resolve_at_the_cli_boundary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from shardlake.cli.common import resolve_local_paths

    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(
        root="memory://x", source="corpus", dest="s3://b/p", keys_file="-", path_list="l.json"
    )
    resolve_local_paths(args)
    assert (args.root, args.dest, args.keys_file) == ("memory://x", "s3://b/p", "-")
    assert (args.source, args.path_list) == (str(tmp_path / "corpus"), str(tmp_path / "l.json"))
    # Messages show the resolved path.
    (tmp_path / "empty").mkdir()
    assert main(["pack", "empty", "root", "--tag", "v1", "--quiet"]) == 1
    assert f"{tmp_path / 'empty'}: no .npz files found" in capsys.readouterr().err
