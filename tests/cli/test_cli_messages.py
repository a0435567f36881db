"""Messages that say what to do: flag typos, unknown tags, missing columns, no root, exit codes."""

import json
import os
import subprocess
import sys

import pytest

import shardlake
from shardlake.cli.main import main
from shardlake.errors import NotFoundError, SelectionError, VersionNotFoundError
from shardlake.testing import synth_corpus


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
    assert "unknown version 'v9'" in err and "v2, v1" in err
    assert f"(all of them: shardlake versions {root})" in err  # the CLI's hint, its ROOT
    # The API's error speaks API: no CLI command in it; the hint rides along for a CLI.
    with pytest.raises(VersionNotFoundError, match="tags there are: v2, v1$") as info:
        shardlake.open(root).dataset("v9")
    assert "shardlake versions" not in str(info.value)
    assert info.value.hint == "all of them: shardlake versions ROOT"


def test_json_failure_is_also_json_on_stdout(capsys, root):
    code, out, err = _run(capsys, ["show", root, "--version", "v9", "--json"])
    assert code == 1 and "unknown version 'v9'" in err
    doc = json.loads(out)
    assert doc["error"]["type"] == "VersionNotFoundError"
    assert doc["error"]["message"].startswith(f"{root}: unknown version 'v9'")
    code, out, _ = _run(capsys, ["query", root, "--where", "key LIKE", "--json"])
    assert code == 1 and json.loads(out)["error"]["type"] == "SelectionError"
    # A usage error that argparse finds (exit 2), and one found by the command.
    code, out, err = _run(capsys, ["versions", root, "--json", "--bogus"])
    assert code == 2 and "unrecognized arguments: --bogus" in err
    assert json.loads(out)["error"]["type"] == "UsageError"
    code, out, _ = _run(capsys, ["query", root, "--limit", "-1", "--json"])
    assert code == 2 and json.loads(out) == {
        "error": {"type": "UsageError", "message": "the row limit must be >= 0 (see --limit)"}
    }
    # Without --json, stdout stays empty.
    code, out, _ = _run(capsys, ["show", root, "--version", "v9"])
    assert code == 1 and out == ""


@pytest.mark.parametrize("unbuffered", ["", "1"])
@pytest.mark.parametrize("command", ["query", "inspect", "versions"])
def test_closed_pipe_ends_quietly(root, command, unbuffered):
    # `shardlake ... | head`: the reader is gone before (or while) output is written.
    target = {"inspect": os.path.join(os.path.dirname(root), "src")}.get(command, root)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env.update({"PYTHONUNBUFFERED": unbuffered} if unbuffered else {})
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "shardlake.cli.main", command, target],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=env,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert proc.stderr.decode() == ""  # no BrokenPipeError, no "Exception ignored"
    assert proc.returncode == 141  # 128 + SIGPIPE, as a shell shows for coreutils


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
    for argv in (
        ["versions", "driving"],
        ["show", "driving"],
        ["query", "driving"],
        ["gc", "driving"],
        ["gc", "driving", "--dry-run"],
        ["keyset", "driving", "list"],
        ["keyset", "driving", "show", "train"],
        ["catalog", "driving"],
        ["index", "driving"],
    ):
        code, _, err = _run(capsys, argv)
        assert code == 1 and want in err, (argv, err)
    assert not (tmp_path / "driving").exists()  # nothing written into the mistyped path
    root = shardlake.open("driving")
    assert root.url == os.path.join(str(tmp_path), "driving")
    # A missing root is NotFoundError, not a version that is not found.
    for call in (root.versions, root.dataset, lambda: root.dataset("v1"), lambda: root.latest):
        with pytest.raises(NotFoundError, match=want) as info:
            call()
        assert not isinstance(info.value, VersionNotFoundError)
    code, _, err = _run(capsys, ["show", "driving", "--version", "v1"])
    assert code == 1 and want in err


def test_relative_root_reads_like_the_cli(root, monkeypatch):
    monkeypatch.chdir(os.path.dirname(root))
    assert [v.tag for v in shardlake.open("root").versions()] == ["v1", "v2"]
    assert shardlake.open("root").dataset().version.tag == "v2"


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


def test_a_broken_connection_is_still_an_error(capsys, monkeypatch, tmp_path):
    # EPIPE from a socket (not from our output) must not pass for `| head`: exit 1, named.
    from shardlake.cli import store_cmds

    def broken(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(store_cmds, "check_store", broken)
    code, out, err = _run(capsys, ["check-store", str(tmp_path), "--json"])
    assert code == 1 and "error: BrokenPipeError: [Errno 32] Broken pipe" in err
    assert json.loads(out)["error"]["type"] == "BrokenPipeError"


def test_a_local_root_that_is_a_file_is_named(capsys, root, tmp_path):
    """A root or export destination given as an existing file: the file is named, not 'a parent
    of this key is an object' about an internal probe key."""
    afile = tmp_path / "afile"
    afile.write_text("hi")
    source = os.path.join(os.path.dirname(root), "src")
    for argv in (
        ["pack", source, str(afile), "--tag", "v1", "--executor", "thread", "--quiet"],
        ["export", root, str(afile / "x"), "--quiet"],
    ):
        code, _, err = _run(capsys, argv)
        assert code == 1, err
        assert f"{afile} is a file, not a folder" in err, err
        assert len(err.strip().splitlines()) == 1, err
    assert afile.read_text() == "hi"


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["mixing", "ROOT", "--batch-size", "0"], "--batch-size"),
        (["mixing", "ROOT", "--world-size", "0"], "--world-size"),
        (["mixing", "ROOT", "--num-workers", "-1"], "--num-workers"),
        (["bench", "load", "ROOT", "--batch-size", "0"], "--batch-size"),
    ],
)
def test_an_out_of_range_count_is_a_usage_error_naming_the_flag(capsys, root, argv, flag):
    code, _, err = _run(capsys, [root if a == "ROOT" else a for a in argv])
    assert code == 2, err
    assert f"argument {flag}: must be at least" in err
    assert "batch_size" not in err and "Traceback" not in err


def test_a_writer_made_one_partition_version_reads_right(capsys, tmp_path):
    import numpy as np

    url = str(tmp_path / "root")
    with shardlake.open(url).writer("w1") as w:
        w.write("log0/0", {"x": np.arange(3)})
    code, out, _ = _run(capsys, ["show", url])
    assert code == 0
    assert "source          - (none: written by Root.writer, write_bag or import-wds)" in out
    assert "base            - (none: made from scratch)" in out
    assert "samples         1 in 1 partition, 1 shard, " in out and "None" not in out
    code, out, _ = _run(capsys, ["versions", url])
    assert code == 0 and "\t1 partition\t1 sample\t" in out
    assert "published w1" in w.report.summary() and "1 partition, 1 sample;" in w.report.summary()


def test_verify_without_source_checks_a_version_against_its_own_checksums(capsys, tmp_path):
    import numpy as np

    url = str(tmp_path / "root")
    lake = shardlake.open(url)
    with lake.writer("w1") as w:  # no source tree: written from Python
        w.write("log0/0", {"x": np.arange(300)})
        w.write("log0/1", {"x": np.arange(300) * 2})
    code, out, err = _run(capsys, ["verify", url, "--quiet"])
    assert code == 0, err
    assert "scrubbed 2 samples" in out and "of w1: ok" in out
    assert "no --source" in err and "shardlake scrub" in err
    code, _, err = _run(capsys, ["verify", url, "--allow-missing", "1"])
    assert code == 2 and "--allow-missing describes the source tree: give --source" in err
    with pytest.raises(shardlake.UsageError, match=r"use scrub\(version\)"):
        lake.verify()
    # A byte flipped at rest fails it, as scrub fails it.
    (shard,) = [s.key for e in lake.dataset("w1").entries for s in e.shards]
    path = tmp_path / "root" / shard
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    code, _, err = _run(capsys, ["verify", url, "--quiet"])
    assert code == 1 and "corrupt" in err
