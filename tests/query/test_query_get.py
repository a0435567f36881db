"""Random access without a DataLoader: query, get (bit-exact npz) and key-list iteration."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from support.lifecycle import pack_synth

import shardlake
from shardlake.cli.main import main
from shardlake.errors import (
    FormatError,
    NotFoundError,
    SelectionError,
    UsageError,
    VersionNotFoundError,
)
from shardlake.testing.fixtures import StoreLocation


def _packed(location: StoreLocation, src: Path, **synth: object) -> None:
    pack_synth(location, src, 2, 3, seed=5, **synth)


def _npz_arrays(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` as numpy reads them."""
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def _source_arrays(src: Path, key: str) -> dict[str, np.ndarray]:
    return _npz_arrays((src / f"{key}.npz").read_bytes())


def _assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name


@pytest.mark.parametrize("store_kind", ["local", "seaweedfs", "gcs"])
def test_query_get_iterate_on_every_backend(store_location: StoreLocation, tmp_path: Path) -> None:
    src = tmp_path / "src"
    _packed(store_location, src)
    ds = shardlake.open(store_location.url, **store_location.storage_options).dataset()
    table = ds.query('"skipping_info.label" >= 0 AND NOT is_skipped', columns=["key", "size"])
    assert table.column_names == ["key", "size"]
    assert 0 < table.num_rows <= 6
    keys = sorted(ds.query(None, ["key"]).column("key").to_pylist())
    assert len(keys) == 6
    for key in keys[:2]:
        _assert_same(ds.get(key), _source_arrays(src, key))
    got = dict(ds.iter_samples(keys, batch_bytes=1))  # one batch per sample
    assert list(got) == keys
    for key in keys:
        _assert_same(got[key], _source_arrays(src, key))


def test_get_reads_one_range_and_rebuilds_sidecar(tmp_path: Path) -> None:
    src = tmp_path / "src"
    location = StoreLocation("local", str(tmp_path / "root"))
    _packed(location, src)
    ds = shardlake.open(location.url).dataset()
    key = ds.manifests(columns=["key"]).column("key")[0].as_py()
    calls: list[tuple[str, int, int]] = []
    original = ds.store.read_range

    def spy(k: str, start: int, end: int) -> bytes:
        calls.append((k, start, end))
        return original(k, start, end)

    ds.store.read_range = spy  # type: ignore[method-assign]
    _assert_same(ds.get(key), _source_arrays(src, key))
    assert len(calls) == 1 and calls[0][0].endswith(".tar")
    (sample,) = ds.iter_files([key])
    assert sample.sidecar is not None
    assert json.loads(sample.sidecar) == json.loads((src / f"{key}.json").read_text())


@pytest.mark.parametrize("store_kind", ["local", "seaweedfs", "gcs"])
def test_cli_query_and_get(
    store_location: StoreLocation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    _packed(store_location, src)
    root = store_location.url
    assert main(["query", root, "--where", "size > 0", "--columns", "key", "size", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 6 and set(rows[0]) == {"key", "size"}
    assert main(["query", root, "--where", "size > 0", "--count"]) == 0
    assert capsys.readouterr().out.strip() == "6"
    assert main(["query", root, "--columns", "key", "partition", "--csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == '"key","partition"' and len(lines) == 7
    key = rows[0]["key"]
    out = tmp_path / "one.npz"
    assert main(["get", root, key, "--out", str(out)]) == 0
    assert "version: <u4 (1,)" in capsys.readouterr().out
    _assert_same(_npz_arrays(out.read_bytes()), _source_arrays(src, key))
    keyfile = tmp_path / "keys.txt"
    keyfile.write_text("\n".join(r["key"] for r in rows[:3]) + "\n")
    outdir = tmp_path / "many"
    assert main(["get", root, "--keys", str(keyfile), "--out-dir", str(outdir), "--json"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert [d["key"] for d in described] == [r["key"] for r in rows[:3]]
    for r in rows[:3]:
        _assert_same(
            _npz_arrays((outdir / f"{r['key']}.npz").read_bytes()), _source_arrays(src, r["key"])
        )
        assert json.loads((outdir / f"{r['key']}.json").read_text()) == json.loads(
            (src / f"{r['key']}.json").read_text()
        )


def test_query_csv_holds_nested_columns_and_columns_repeat(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    _packed(location, tmp_path / "src")
    root = location.url
    want = (
        shardlake.open(root).dataset().query(None, ["key", "neighbor_ids", "timestamp"]).to_pylist()
    )
    assert isinstance(want[0]["neighbor_ids"], list) and want[0]["neighbor_ids"]
    # List (and struct) columns become JSON text in their cell; every other column as pyarrow
    # writes it.
    assert main(["query", root, "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 6
    assert [json.loads(r["neighbor_ids"]) for r in rows] == [w["neighbor_ids"] for w in want]
    assert json.loads(rows[0]["skipping_info.incomplete_data_types"]) == []
    # Repeats and comma lists, in the order given, once each.
    for argv in (
        ["--columns", "key", "--columns", "timestamp"],
        ["--columns", "key,timestamp"],
        ["--columns", "key", "timestamp,key"],
    ):
        assert main(["query", root, *argv, "--csv"]) == 0, argv
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == '"key","timestamp"', argv
        assert lines[1] == f'"{want[0]["key"]}",{want[0]["timestamp"]}', argv
    # The tab output shows a list as JSON too, not as a Python repr.
    assert main(["query", root, "--columns", "neighbor_ids", "--limit", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == json.dumps(want[0]["neighbor_ids"])
    # A name it cannot find: named, with the nearest and every valid column; one line, exit 1.
    assert main(["query", root, "--columns", "key,timestmp"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "unknown column(s) 'timestmp' (did you mean 'timestamp'?)" in captured.err
    assert "columns: key, partition, shard" in captured.err and "neighbor_ids" in captured.err


def test_get_out_refuses_to_overwrite_unless_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    src = tmp_path / "src"
    _packed(location, src)
    root = location.url
    key = shardlake.open(root).dataset().keys()[0]
    out = tmp_path / "mine.npz"
    out.write_bytes(b"the user's own file")
    assert main(["get", root, key, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{out} already exists; not overwritten (see --force)" in err
    assert out.read_bytes() == b"the user's own file"
    assert main(["get", root, key, "--out", str(out), "--force"]) == 0
    _assert_same(_npz_arrays(out.read_bytes()), _source_arrays(src, key))
    # --out-dir: one file already there refuses the whole fetch; nothing is written.
    outdir = tmp_path / "many"
    keys = shardlake.open(root).dataset().keys()[:2]
    mine = outdir / f"{keys[1]}.json"
    mine.parent.mkdir(parents=True)
    mine.write_text("{}")
    assert main(["get", root, *keys, "--out-dir", str(outdir)]) == 1
    assert f"{mine} already exists; not overwritten (see --force)" in capsys.readouterr().err
    assert not (outdir / f"{keys[0]}.npz").exists() and mine.read_text() == "{}"
    assert main(["get", root, *keys, "--out-dir", str(outdir), "--force"]) == 0
    assert json.loads(mine.read_text()) == json.loads((src / f"{keys[1]}.json").read_text())
    # --out-dir naming a file: said so in one line (was a raw NotADirectoryError)
    capsys.readouterr()
    assert main(["get", root, *keys, "--out-dir", str(out), "--force"]) == 2
    assert f"error: {out} is a file, not a folder (see --out-dir)" in capsys.readouterr().err


def test_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    _packed(location, tmp_path / "src")
    root = location.url
    ds = shardlake.open(root).dataset()
    with pytest.raises(NotFoundError, match="no sample"):
        ds.get("nope/nothing")
    with pytest.raises(VersionNotFoundError):
        shardlake.open(root).dataset("v9")
    with pytest.raises(SelectionError):
        ds.query("(SELECT 1 FROM read_csv('/etc/passwd')) = 1")
    cases = [
        (["get", root, "nope/nothing"], "no sample"),
        (["get", root, "x", "--version", "v9"], "unknown version"),
        (["query", root, "--where", "size > 1; SELECT 1"], "';' is not allowed"),
        (["query", root, "--where", "read_text('/etc/passwd') IS NULL"], "selection"),
        (["query", root, "--where", "size >"], "invalid selection"),
    ]
    for argv, message in cases:
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (argv, err)
    out = tmp_path / "never.npz"
    assert main(["get", root, "nope/nothing", "--out", str(out)]) == 1
    assert not out.exists()
    # A corrupted manifest: a clear FormatError naming it, exit 1.
    entry = ds.entries[0]
    ds.store.write(entry.manifest, b"not parquet at all")
    fresh = shardlake.open(root).dataset()
    with pytest.raises(FormatError, match="manifest"):
        fresh.manifest(entry.id)
    # Queries read the catalog, not manifests: a corrupted segment is refused by its digest.
    segment = fresh.version.catalog_objects()[1]
    ds.store.write(segment.key, b"not parquet at all")
    assert main(["query", root, "--count"]) == 1
    assert "catalog object does not match" in capsys.readouterr().err


@pytest.mark.parametrize("store_kind", ["s3"])
def test_console_script_against_s3(store_location: StoreLocation, tmp_path: Path) -> None:
    """The installed ``shardlake`` command reaches the loopback S3 through the environment."""
    import os
    import subprocess
    import sys

    _packed(store_location, tmp_path / "src")
    env = {**os.environ, **store_location.env}
    cmd = [sys.executable, "-m", "shardlake.cli.main"]
    done = subprocess.run(
        [*cmd, "query", store_location.url, "--count"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "6"
    done = subprocess.run(
        [*cmd, "query", store_location.url, "--where", "x; y"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        done.returncode == 1
        and done.stderr.count("\n") == 1
        and "SelectionError" not in done.stderr
    )


def test_a_column_named_twice_is_returned_once(tmp_path: Path) -> None:
    root = shardlake.open(tmp_path / "root")
    with root.writer("v1") as w:
        w.write("a/1", {"x": np.ones(2)})
    with root.writer("v2", base="v1") as w:  # two catalog segments
        w.write("b/1", {"x": np.ones(2)})
    ds = root.dataset("v2")
    pids = [e.id for e in ds.entries]
    for table in (
        ds.manifests(["key", "key"]),
        ds.manifests(["key", "partition", "key"], pids=pids),
        ds.query(columns=["key", "key"]),
    ):
        assert table.column_names[0] == "key" and table.column_names.count("key") == 1
        assert sorted(table.column("key").to_pylist()) == ["a/1", "b/1"]
    with pytest.raises(UsageError, match="columns must be a list of names, not the string 'key'"):
        ds.manifests("key")
