"""Messages that say what to do: flag typos, unknown tags, missing columns, no root, exit codes."""

import os

import pytest

import shardlake
from shardlake.cli.main import main
from shardlake.errors import SelectionError, VersionNotFoundError
from shardlake.tools.synth import synth_corpus


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    base = tmp_path_factory.mktemp("msgs")
    synth_corpus(base / "src", 2, 3, seed=3, neighbors=2, lanes=4)
    url = str(base / "root")
    for tag in ("v1", "v2"):
        assert (
            main(["pack", str(base / "src"), url, "--tag", tag, "--executor", "thread", "--quiet"])
            == 0
        )
    return url


def _run(capsys, argv):
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_flag_typo_suggests_the_flag(capsys, root):
    code, _, err = _run(capsys, ["pack", "src", root, "--tag", "v9", "--partiton-depth", "1"])
    assert code == 2
    assert "did you mean `--partition-depth`?" in err
    assert "usage: shardlake pack" in err  # the command's usage, not the top level's


def test_flag_prefixes_are_not_accepted(capsys, root):
    code, _, err = _run(capsys, ["query", root, "--wher", "x > 1"])
    assert code == 2 and "did you mean `--where`?" in err


def test_unknown_tag_lists_tags_and_the_command(capsys, root):
    code, _, err = _run(capsys, ["show", root, "--version", "v9"])
    assert code == 1
    assert "unknown version 'v9'" in err and "v2, v1" in err and "shardlake versions" in err


def test_missing_column_names_it_and_the_columns(capsys, root):
    code, _, err = _run(capsys, ["query", root, "--where", "timestmp > 1"])
    assert code == 1
    assert "no column 'timestmp' (did you mean 'timestamp'?)" in err
    assert "columns: key, partition" in err and '"skipping_info.label"' in err
    assert "Binder" not in err and "FROM clause" not in err
    code, _, err = _run(capsys, ["query", root, "--where", "skipping_info.label = 1"])
    assert code == 1 and 'e.g. "skipping_info.label"' in err and "Referenced" not in err


def test_sql_syntax_errors_quote_the_users_clause(capsys, root):
    code, _, err = _run(capsys, ["query", root, "--where", "key LIKE"])
    assert code == 1 and err.count("\n") == 1
    assert "invalid selection 'key LIKE': syntax error at 'LIKE' (character 5)" in err
    assert '")"' not in err and "AS" not in err  # nothing of the query wrapped around it
    with pytest.raises(SelectionError, match=r"syntax error at '=' \(character 13\)"):
        shardlake.open(root).dataset().query("timestamp = = 3")
    code, _, err = _run(capsys, ["keyset", root, "create", "k", "--where", "x > 1 AND"])
    assert code == 1 and "syntax error at 'AND' (character 7)" in err


def test_no_root_at_the_resolved_path(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    want = f"no shardlake root at {os.path.join(str(tmp_path), 'driving')}"
    for argv in (["versions", "driving"], ["show", "driving"], ["query", "driving"]):
        code, _, err = _run(capsys, argv)
        assert code == 1 and want in err, (argv, err)
    root = shardlake.open("driving")
    assert root.url == os.path.join(str(tmp_path), "driving")
    with pytest.raises(VersionNotFoundError, match=want):
        root.versions()
    with pytest.raises(VersionNotFoundError, match=want):
        root.dataset()


def test_relative_root_reads_like_the_cli(root, monkeypatch):
    monkeypatch.chdir(os.path.dirname(root))
    assert [v.tag for v in shardlake.open("root").versions()] == ["v1", "v2"]
    assert shardlake.query.dataset.open_dataset("root").version.tag == "v2"


def test_prune_latest_without_force_is_a_failed_op(capsys, root):
    code, _, err = _run(capsys, ["prune-version", root, "v2"])
    assert code == 1 and "(see --force)" in err


def test_show_prints_no_python_reprs(capsys, root):
    code, out, _ = _run(capsys, ["show", root, "--version", "v1"])
    assert code == 0
    assert "{" not in out and "None" not in out
    assert "codec=safetensors+zstd" in out and "depth=1" in out


def test_cli_output_names_no_python_parameter(capsys, tmp_path):
    bad = tmp_path / "deep"
    for log in range(3):
        synth_corpus(bad / "a" / f"log{log}", 1, 2, seed=log, neighbors=2, lanes=4)
    code, _, err = _run(
        capsys, ["pack", str(bad), str(tmp_path / "r"), "--tag", "v1", "--partition-regex", "(x"]
    )
    assert code == 2 and "partition regex '(x'" in err and "(see --partition-regex)" in err
    assert "partition_regex" not in err
