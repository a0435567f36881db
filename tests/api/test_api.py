"""The public Python API: shardlake.open() -> Root -> Dataset -> Selection, on local and S3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import shardlake
from shardlake.cli.main import main
from shardlake.errors import (
    ConflictError,
    NotFoundError,
    SelectionError,
    UsageError,
    VersionNotFoundError,
)
from shardlake.testing import synth_corpus
from shardlake.testing.fixtures import StoreLocation

SMALL = shardlake.PackOptions(executor="inline", workers=1, shard_size=40_000)


def _corpus(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    synth_corpus(src, 3, 4, seed=3, neighbors=2, lanes=4)
    return src


def _open(location: StoreLocation) -> shardlake.Root:
    return shardlake.open(location.url, **location.storage_options)


@pytest.mark.parametrize("store_kind", ["local", "s3"])
def test_root_versions_dataset_selection(store_location: StoreLocation, tmp_path: Path) -> None:
    src = _corpus(tmp_path)
    root = _open(store_location)
    with pytest.raises(NotFoundError, match="no shardlake root at") as info:
        root.versions()
    assert not isinstance(info.value, VersionNotFoundError)  # no root, not an unknown version
    with pytest.raises(NotFoundError, match="no shardlake root at"):
        root.latest  # noqa: B018 - nothing there: no root, so no latest
    report = root.pack(src, tag="v1", options=SMALL)
    assert isinstance(report, shardlake.PackReport) and report.to_json()["samples"] == 12

    [info] = root.versions()
    assert isinstance(info, shardlake.Version)
    assert (info.tag, info.samples, info.partitions, info.is_latest) == ("v1", 12, 3, True)
    assert isinstance(info.created, datetime) and info.hash == report.version.hash
    assert root.latest == info
    with pytest.raises(AttributeError):
        info.tag = "x"  # type: ignore[misc]  # frozen

    ds = root.dataset("v1")
    keys = ds.keys()
    assert len(keys) == len(ds) == 12 and keys == sorted(keys, key=keys.index)
    arrays = ds.get(keys[0])
    with np.load(src / f"{keys[0]}.npz") as npz:  # the source file, read by numpy itself
        source = {name: npz[name] for name in npz.files}
    assert list(arrays) == list(source)
    assert all(np.array_equal(arrays[n], source[n]) for n in source)
    assert [k for k, _ in ds.iter_samples()] == keys

    table = ds.query("NOT is_skipped", columns=["key", "partition"])
    assert isinstance(table, pa.Table) and table.column_names == ["key", "partition"]
    first_partition = table.column("partition")[0].as_py()
    where = f"partition = '{first_partition}'"
    selection = ds.select(where=where)
    assert isinstance(selection, shardlake.Selection)
    assert selection.describe() == {"where": where} and len(selection) == 4
    assert set(selection.complement().key_list()) == set(keys) - set(selection.key_list())
    assert ds.select(keys=keys[:2]).key_list() == keys[:2]
    with pytest.raises(SelectionError, match="2 selected key"):
        ds.select(keys=[keys[0], "no/such", "gone/too"]).rows()
    with pytest.raises(SelectionError, match="at most one"):
        ds.select(where="true", keys=keys)

    keyset = root.keysets.create("first", where=where)
    assert len(keyset) == 4 and [k.name for k in root.keysets.list()] == ["first"]
    assert root.keysets.get("first").keys == sorted(selection.key_list())
    assert ds.select(keyset="first").key_list() == selection.key_list()
    with pytest.raises(ConflictError):
        root.keysets.create("first", keys=keys[:1])
    with pytest.raises(NotFoundError):
        root.keysets.get("nope")


def test_root_writers_and_checks(tmp_path: Path) -> None:
    src = _corpus(tmp_path)
    root = shardlake.open(tmp_path / "root")  # a PathLike works
    root.pack(src, tag="v1", options=SMALL)
    keys = root.dataset().keys()
    removed = root.remove("v2", keys=keys[:1])
    assert removed.to_json()["samples_removed"] == 1 and root.latest.tag == "v2"
    assert [v.tag for v in root.versions()] == ["v1", "v2"]
    assert root.verify(src, version="v1").ok
    assert root.verify_offsets("v2").ok
    assert root.scrub(all_versions=True).ok
    with pytest.raises(ConflictError) as refused:
        root.prune(["v2"])
    assert refused.value.options == ("force",) and "--" not in str(refused.value)
    pruned = root.prune(["v1"])
    assert pruned.live == ["v2"] and pruned.latest == "v2"
    gc = root.gc(grace_s=0)
    assert gc.garbage and root.scrub().ok  # v1's own manifest revision went
    exported = root.export(str(tmp_path / "copy"))
    assert shardlake.open(exported.dest).latest.tag == "v2"
    npz = root.export(str(tmp_path / "npz"), format="npz")
    assert npz.to_json()["samples"] == 11
    with pytest.raises(UsageError, match="export format"):
        root.export(str(tmp_path / "x"), format="zip")


def test_to_torch_is_lazy_and_selects(tmp_path: Path) -> None:
    src = _corpus(tmp_path)
    code = "import sys, shardlake; print('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "False", out.stderr
    root = shardlake.open(str(tmp_path / "root"))
    root.pack(src, tag="v1", options=SMALL)
    ds = root.dataset("v1")
    torch_ds = ds.to_torch(batch_size=2, keys=ds.keys()[:4], num_workers=0, shuffle=False)
    assert sorted(torch_ds.table.keys) == sorted(ds.keys()[:4])
    selection = ds.select(where="NOT is_skipped")
    chosen = selection.to_torch(batch_size=2, num_workers=0)
    assert sorted(chosen.table.keys) == sorted(selection.key_list())
    assert chosen.selection_desc == selection.describe()


def test_errors_carry_options_and_the_cli_shows_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _corpus(tmp_path)
    root = shardlake.open(str(tmp_path / "root"))
    with pytest.raises(UsageError) as refused:
        root.pack(src, tag="v1", options=shardlake.PackOptions(shard_size=0))
    assert "shard_size" in refused.value.options and "--" not in str(refused.value)
    code = main(["pack", str(src), str(tmp_path / "root"), "--tag", "v1", "--level", "99"])
    err = capsys.readouterr().err
    assert code == 2 and "(see --level)" in err and err.count("\n") == 1


def test_cli_json_and_storage_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], store_servers: object
) -> None:
    src = _corpus(tmp_path)
    from shardlake.testing.fixtures import new_location

    location = new_location("s3", "cli")
    endpoint = location.storage_options["endpoint_url"]
    argv = [f"--storage-option=endpoint_url={endpoint}", "--storage-option=anon=false"]
    pack = ["pack", str(src), location.url, "--tag", "v1", "--executor", "inline", "--json"]
    assert main([*pack, *argv]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 12
    for command in (["versions"], ["show"], ["scrub"], ["verify-offsets"], ["keyset"]):
        extra = ["list"] if command == ["keyset"] else []
        assert main([command[0], location.url, *extra, "--json", *argv]) == 0, command
        json.loads(capsys.readouterr().out)  # every report command speaks JSON
    assert main(["versions", location.url, "--storage-option", "nonsense"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_cli_reads_fsspec_environment_config(tmp_path: Path, store_servers: object) -> None:
    """FSSPEC_S3_* variables reach the filesystem (fsspec applies them; we must not bypass it)."""
    from shardlake.testing.fixtures import new_location

    src = _corpus(tmp_path)
    location = new_location("s3", "env")
    shardlake.open(location.url, **location.storage_options).pack(src, tag="v1", options=SMALL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    cli = [sys.executable, "-m", "shardlake.cli.main", "versions", location.url, "--json"]
    env["FSSPEC_S3_ENDPOINT_URL"] = location.storage_options["endpoint_url"]
    done = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [v["tag"] for v in json.loads(done.stdout)] == ["v1"]


def test_one_error_hierarchy_without_twins() -> None:
    import pickle

    from shardlake import errors

    assert issubclass(errors.KeyNotFoundError, errors.NotFoundError)
    assert issubclass(errors.KeyNotFoundError, FileNotFoundError)
    assert issubclass(errors.AlreadyExistsError, errors.ConflictError)
    assert issubclass(errors.AlreadyExistsError, FileExistsError)
    assert issubclass(errors.IntegrityError, shardlake.ShardlakeError)
    assert not hasattr(errors, "VerificationError")  # never raised: gone
    exc = errors.KeyNotFoundError("s3://b/k: no such key", options=("version",))
    again = pickle.loads(pickle.dumps(exc))  # crosses worker processes intact
    assert type(again) is errors.KeyNotFoundError and again.options == ("version",)
    assert str(again) == "s3://b/k: no such key"


def test_errors_pickle_with_their_options_even_under_tblib() -> None:
    """Errors cross process and Dask boundaries; distributed installs tblib's exception pickling,
    which could not rebuild a class with two built-in bases (KeyNotFoundError)."""
    import pickle

    import tblib.pickling_support

    from shardlake.errors import IntegrityError, KeyNotFoundError

    tblib.pickling_support.install()
    for cls in (KeyNotFoundError, IntegrityError):
        try:
            try:
                raise cls("s3://b/k: gone", options=("version",))
            except cls as inner:
                raise RuntimeError("task failed") from inner
        except RuntimeError as outer:
            back = pickle.loads(pickle.dumps(outer))
        assert type(back.__cause__) is cls
        assert str(back.__cause__) == "s3://b/k: gone" and back.__cause__.options == ("version",)


def test_one_public_version_from_versions_version_and_pack(tmp_path: Path) -> None:
    src = _corpus(tmp_path)
    root = shardlake.open(tmp_path / "root")
    report = root.pack(src, tag="v1", options=SMALL)
    assert isinstance(report.version, shardlake.Version)
    assert report.version == root.version("v1") == root.versions()[0]
    assert (report.version.samples, report.version.partitions) == (12, 3)
    with pytest.warns(DeprecationWarning, match="use shardlake.Version"):
        assert shardlake.VersionInfo is shardlake.Version
