"""The CLI is a thin layer over the Python API: every report command speaks JSON, every command
that opens a root takes storage options, and library errors reach the user as flag advice."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from shardlake.cli.common import flag_advice, parse_storage_options
from shardlake.cli.main import build_parser, main
from shardlake.errors import UsageError

# Commands that are not reports: they print nothing a script would parse.
NOT_REPORTS = {"bench"}


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """``"keyset create"`` -> the option strings of that leaf command (parents' included)."""
    out: dict[str, list[str]] = {}
    own = [o for a in parser._actions for o in a.option_strings]
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {" ".join(path): own}
    for name, child in subs[0].choices.items():
        for leaf, options in _leaves(child, (*path, name)).items():
            out[leaf] = own + options
    return out


def test_every_report_command_has_json_and_root_commands_take_storage_options() -> None:
    leaves = _leaves(build_parser())
    assert "keyset create" in leaves and "gc" in leaves
    for leaf, options in leaves.items():
        if leaf.split()[0] not in NOT_REPORTS:
            assert "--json" in options, leaf
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, child in sub.choices.items():
        takes_root = any(a.dest == "root" and not a.option_strings for a in child._actions)
        if takes_root:
            for leaf, options in leaves.items():
                if leaf.split()[0] == name:
                    assert "--storage-option" in options, leaf


def test_storage_option_values_parse_as_json_when_they_can() -> None:
    parsed = parse_storage_options(["anon=true", "endpoint_url=http://127.0.0.1:9", "n=3", "s="])
    assert parsed == {"anon": True, "endpoint_url": "http://127.0.0.1:9", "n": 3, "s": ""}
    assert parse_storage_options(['client_kwargs={"region_name": "x"}']) == {
        "client_kwargs": {"region_name": "x"}
    }
    with pytest.raises(UsageError):
        parse_storage_options(["novalue"])


def test_flag_advice_spells_flags() -> None:
    assert flag_advice(["shard_size", "key_file", "partitions"]) == (
        "--shard-size, --keys, --partition"
    )


def test_library_options_become_flag_advice_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(tmp_path)
    assert main(["get", root]) == 2  # UsageError(options=("keys",)) before the root is read
    err = capsys.readouterr().err
    assert err == "shardlake get: error: give at least one KEY (see --keys)\n"
    assert main(["versions", root, "--storage-option", "=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardlake versions: error:") and "Traceback" not in err


def test_get_maps_a_training_list_of_absolute_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shardlake
    from shardlake.testing import synth_corpus

    src = tmp_path / "src"
    synth_corpus(src, 1, 3, seed=1, neighbors=2, lanes=4)
    root = shardlake.open(tmp_path / "root")
    root.pack(src, tag="v1", options=shardlake.PackOptions(executor="inline", workers=1))
    key = root.dataset().keys()[0]
    listing = tmp_path / "train.json"
    listing.write_text(json.dumps([str(src / f"{key}.npz")]))  # as training scripts list them
    assert main(["get", root.url, "--keys", str(listing), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["key"] == key
    listing.write_text(json.dumps(["/elsewhere/x.npz"]))
    assert main(["get", root.url, "--keys", str(listing)]) == 1
    assert "name no key" in capsys.readouterr().err


def test_prune_version_speaks_of_pruning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One word for the operation (issue #30): the command, Root.prune and its help say "prune".
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    texts = [helps["prune-version"]]
    texts += [a.help or "" for a in sub.choices["prune-version"]._actions]
    assert "prune version tags" in helps["prune-version"]
    assert not [text for text in texts if "retire" in text.lower()]
    assert main(["prune-version", str(tmp_path)]) == 2
    assert "name the version(s) to prune" in capsys.readouterr().err
