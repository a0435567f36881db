"""import-wds: WebDataset tars (made by webdataset's ShardWriter) -> a verified version."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import webdataset as wds
from support.writer import Sample, assert_loads_bit_exact, write_npz_tree

import shardlake
from shardlake.cli.main import main
from shardlake.errors import SourceError
from shardlake.testing import npz_bytes
from shardlake.testing.fixtures import StoreLocation


def _records(shards: int, per_shard: int, seed: int = 0) -> list[list[dict[str, Any]]]:
    rng = np.random.default_rng(seed)
    out = []
    for s in range(shards):
        records = []
        for i in range(per_shard):
            records.append(
                {
                    "__key__": f"{s:03d}{i:05d}",
                    "ego.npy": rng.normal(size=(3, 2)).astype(np.float32),
                    "extra.npz": npz_bytes(
                        {"lanes": rng.integers(0, 9, size=(2, 2)).astype(np.int16)}
                    ),
                    "json": {"weather": ["sun", "rain"][i % 2], "index": i},
                    "cls": int(rng.integers(0, 10)),
                }
            )
        out.append(records)
    return out


def _write_tars(directory: Path, shards: list[list[dict[str, Any]]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(
        str(directory / "train-%06d.tar"), maxcount=len(shards[0]), verbose=0
    ) as sink:
        for records in shards:
            for record in records:
                sink.write(record)


def _expected(
    shards: list[list[dict[str, Any]]], key_of: Callable[[int, str], str]
) -> list[Sample]:
    out: list[Sample] = []
    for s, records in enumerate(shards):
        for r in records:
            arrays = {
                "ego": r["ego.npy"],
                "lanes": np.load(io.BytesIO(r["extra.npz"]))["lanes"],
                "cls": np.array(r["cls"], dtype=np.int64),
            }
            out.append((key_of(s, r["__key__"]), arrays, r["json"]))
    return out


def _same(got: dict[str, Any], want: dict[str, np.ndarray[Any, Any]]) -> None:
    assert sorted(got) == sorted(want)
    for name, array in want.items():
        value = np.asarray(got[name])
        assert (value.dtype, value.shape, value.tobytes()) == (
            array.dtype,
            array.shape,
            array.tobytes(),
        )


def test_cli_imports_a_brace_pattern_verified_and_loadable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = _records(2, 5)
    _write_tars(tmp_path / "wds", shards)
    root_dir = tmp_path / "root"
    pattern = str(tmp_path / "wds" / "train-{000000..000001}.tar")
    assert main(["import-wds", pattern, str(root_dir), "--tag", "v1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["samples"] == 10 and sorted(doc["built"]) == ["train-000000", "train-000001"]
    samples = _expected(shards, lambda s, k: f"train-{s:06d}/{k}")
    root = shardlake.open(root_dir)
    ds = root.dataset("v1")
    for key, arrays, _ in samples:
        _same(ds.get(key), arrays)
    assert ds.query("weather = 'rain'", columns=["key"]).num_rows == 4
    assert root.scrub().ok
    assert_loads_bit_exact(str(root_dir), "v1", samples)
    # verify against the same samples as an npz tree (the array order of the tars kept)
    source = tmp_path / "src"
    ordered = [(k, dict(ds.get(k)), m) for k, _, m in samples]
    write_npz_tree(source, ordered)
    assert root.verify(source).ok
    # a second import on the first as base: one shard changed, one carried
    shards[1][0]["ego.npy"] = shards[1][0]["ego.npy"] + 1
    (tmp_path / "wds2").mkdir()
    _write_tars(tmp_path / "wds2", shards)
    single = str(tmp_path / "wds2" / "train-000001.tar")
    assert main(["import-wds", single, str(root_dir), "--tag", "v2", "--base", "v1"]) == 0
    out = capsys.readouterr().out
    assert "built 1" in out and "carried 1" in out
    diff = root.diff("v1", "v2", samples=True)
    assert diff.data_changed == ["train-000001"]
    assert diff.changed_keys == ["train-000001/00100000"]
    root.keysets.create("rain", version="v1", where="weather = 'rain'")
    rebased = root.keysets.rebase("rain", "v2", new_name="rain-v2")
    assert (rebased.kept, rebased.dropped, rebased.changed) == (4, 0, 0)


@pytest.mark.parametrize("store_kind", ["s3"])
def test_import_from_a_store_directory_by_key(
    store_factory: Callable[..., StoreLocation], tmp_path: Path
) -> None:
    shards = _records(2, 3, seed=5)
    local = tmp_path / "wds"
    _write_tars(local, shards)
    src = store_factory(label="wds-src")
    src_store = src.open()
    for tar in sorted(local.iterdir()):
        src_store.write(tar.name, tar.read_bytes())
    dest = store_factory(label="wds-root")
    root = shardlake.open(dest.url, **dest.storage_options)
    report = root.import_wds(
        src.url,
        "v1",
        key_prefix="scenes/",
        partition_by="key",
        source_storage_options=src.storage_options or None,
    )
    samples = _expected(shards, lambda s, k: f"scenes/{k}")
    assert report.built == ["scenes"] and report.version.samples == len(samples)
    ds = root.dataset("v1")
    for key, arrays, _ in samples:
        _same(ds.get(key), arrays)
    assert root.scrub().ok
    assert_loads_bit_exact(dest.url, "v1", samples, dest.storage_options or None)


def test_unconvertible_members_are_all_named_and_nothing_is_published(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tars = tmp_path / "wds"
    tars.mkdir()
    with wds.TarWriter(str(tars / "a.tar")) as sink:
        sink.write({"__key__": "s1", "x.npy": np.ones(2)})
        sink.write({"__key__": "s2", "x.npy": np.ones(2), "y.npy": b"not an npy file"})
        sink.write({"__key__": "s3", "x.npy": np.ones(2), "json": b"{not json"})
    root_dir = tmp_path / "root"
    assert main(["import-wds", str(tars), str(root_dir), "--tag", "v1"]) == 1
    err = capsys.readouterr().err
    assert (
        "2 unreadable tar file(s) or member(s) that cannot be converted" in err
        and "nothing was published" in err
    )
    assert "a.tar::s2.y.npy" in err and "a.tar::s3.json" in err
    assert shardlake.open(root_dir).versions() == []
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="no .tar files"):
        shardlake.open(root_dir).import_wds(tmp_path / "empty", "v1")


def test_every_unreadable_tar_is_named_in_one_run(tmp_path: Path) -> None:
    tars = tmp_path / "wds"
    tars.mkdir()
    _write_tars(tars, _records(1, 3))
    whole = next(tars.glob("*.tar")).read_bytes()
    (tars / "junk.tar").write_bytes(b"this is not a tar file" * 40)
    (tars / "trunc.tar").write_bytes(whole[: len(whole) // 2])
    root = shardlake.open(tmp_path / "root")
    with pytest.raises(SourceError, match="nothing was published") as info:
        root.import_wds(tars, "v1")
    assert "junk.tar: not a readable tar file" in str(info.value)
    assert "trunc.tar: not a readable tar file" in str(info.value)
    assert root.versions() == []


def test_shard_partitions_hold_keys_with_directories(tmp_path: Path) -> None:
    tars = tmp_path / "wds"
    tars.mkdir()
    with wds.TarWriter(str(tars / "part-a.tar")) as sink:
        for i in range(3):
            sink.write({"__key__": f"cam/{i:04d}", "x.npy": np.full(2, i), "id": str(i)})
    root = shardlake.open(tmp_path / "root")
    report = root.import_wds(tars / "part-a.tar", "v1", key_prefix="run1/")
    assert report.built == ["run1/part-a"]
    sample = root.dataset("v1").get("run1/part-a/cam/0002")
    _same(sample, {"x": np.full(2, 2), "id": np.array(2, dtype=np.int64)})
    # a directory: tars of the same name in two subdirectories are two partitions
    (tars / "b").mkdir()
    (tars / "b" / "part-a.tar").write_bytes((tars / "part-a.tar").read_bytes())
    report = root.import_wds(tars, "v2")
    assert sorted(report.built) == ["b/part-a", "part-a"]


@pytest.mark.parametrize("store_kind", ["s3"])
def test_cli_import_between_stores_with_storage_options(
    store_factory: Callable[..., StoreLocation],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    shards = _records(1, 4, seed=9)
    _write_tars(tmp_path / "wds", shards)
    src, dest = store_factory(label="cli-src"), store_factory(label="cli-root")
    tar = next((tmp_path / "wds").iterdir())
    src.open().write(tar.name, tar.read_bytes())

    def flags(flag: str, options: dict[str, Any]) -> list[str]:
        return [a for k, v in options.items() for a in (flag, f"{k}={json.dumps(v)}")]

    argv = ["import-wds", f"{src.url}/{tar.name}", dest.url, "--tag", "v1", "--json"]
    argv += flags("--storage-option", dest.storage_options)
    argv += flags("--source-storage-option", src.storage_options)
    capsys.readouterr()
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 4
    root = shardlake.open(dest.url, **dest.storage_options)
    samples = _expected(shards, lambda s, k: f"train-{s:06d}/{k}")
    for key, arrays, _ in samples:
        _same(root.dataset("v1").get(key), arrays)


def test_ctrl_c_during_an_import_publishes_nothing(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    tars = tmp_path / "wds"
    tars.mkdir()
    rng = np.random.default_rng(1)
    with wds.TarWriter(str(tars / "big.tar")) as sink:
        for i in range(400):
            sink.write({"__key__": f"{i:05d}", "x.npy": rng.random(32768)})
    # A shell starts the command with Ctrl-C delivered and handled; a test worker may pass on
    # an ignored or blocked SIGINT (inherited through fork and exec), so the child starts clean.
    code = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
        "from shardlake.cli.main import main; sys.exit(main(sys.argv[1:]))"
    )
    inherited = (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []))
    # Under load this process may wake too late, after the import ended (it then published a
    # whole version): try again on a fresh root; at least one Ctrl-C must land mid-import.
    for attempt in range(3):
        spill, root_dir = tmp_path / f"spill{attempt}", tmp_path / f"root{attempt}"
        spill.mkdir()
        argv = ["import-wds", str(tars), str(root_dir), "--tag", "v1", "--spill-dir", str(spill)]
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *argv], stderr=subprocess.PIPE, text=True, env=os.environ
        )
        deadline = time.monotonic() + 60
        while not any(spill.rglob("*.spill")) and time.monotonic() < deadline:
            time.sleep(0.01)  # interrupt once the writer has staged samples
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        if proc.returncode == 0 and "1/1 tars" in err:
            assert len(shardlake.open(root_dir).dataset("v1").keys()) == 400
            continue
        assert proc.returncode == 130, err
        assert "interrupted; nothing was published" in err
        assert shardlake.open(root_dir).versions() == [] and list(spill.iterdir()) == []
        break
    else:
        pytest.fail(f"the import ended before its Ctrl-C three times (SIGINT here: {inherited})")


# --- damaged, plain, image and caption tars (issue #44) ------------------------------------


def _tar_of(tmp_path: Path, name: str, samples: int = 6) -> Path:
    """A webdataset tar of ``samples`` samples (x.npy + json each), its bytes in ``name``."""
    tars = tmp_path / "wds"
    tars.mkdir(exist_ok=True)
    with wds.TarWriter(str(tars / name)) as sink:
        for i in range(samples):
            sink.write({"__key__": f"{i:04d}", "x.npy": np.full(300, i), "json": {"i": i}})
    return tars / name


def _header_offsets(data: bytes, *, of_data: bool = False) -> list[int]:
    """Byte offsets of the members of an uncompressed tar: where their headers start (a pax
    header first, as webdataset writes them), or with ``of_data``, where their bytes do."""
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [m.offset_data if of_data else m.offset for m in tar.getmembers()]


def _refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], tar: Path) -> str:
    root_dir = tmp_path / "root"
    code = main(["import-wds", str(tar), str(root_dir), "--tag", "v1", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    assert "nothing was published" in err and tar.name in err, err
    assert not (root_dir / "commits").exists() or shardlake.open(root_dir).versions() == []
    return err


@pytest.mark.parametrize("which", [1, 7, -1])
def test_a_bad_header_checksum_anywhere_is_refused_with_its_offset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], which: int
) -> None:
    tar = _tar_of(tmp_path, "a.tar")
    data = bytearray(tar.read_bytes())
    offset = _header_offsets(bytes(data))[which]
    data[offset + 10] ^= 0x20  # a byte of the header's name: its checksum no longer matches
    tar.write_bytes(bytes(data))
    err = _refused(tmp_path, capsys, tar)
    assert f"damaged member header (bad checksum) at byte offset {offset}" in err, err


def test_a_tar_cut_at_a_member_boundary_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tar = _tar_of(tmp_path, "cut.tar")
    data = tar.read_bytes()
    offset = _header_offsets(data)[6]  # half of the samples, then nothing: no end marker
    tar.write_bytes(data[:offset])
    err = _refused(tmp_path, capsys, tar)
    assert f"ends without the end-of-archive marker (cut short?) at byte offset {offset}" in err


def test_a_truncated_member_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tar = _tar_of(tmp_path, "trunc.tar")
    data = tar.read_bytes()
    offset = _header_offsets(data)[5]  # 0002.x.npy
    cut = _header_offsets(data, of_data=True)[5] + 100  # its headers and 100 of its bytes
    tar.write_bytes(data[:cut])
    err = _refused(tmp_path, capsys, tar)
    assert (
        "is cut short (fewer than its 2528 bytes)" in err and f"at byte offset {offset}" in err
    ), err


def test_a_truncated_gzip_tar_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import gzip

    plain = _tar_of(tmp_path, "z.tar")
    tgz = plain.with_suffix(".tar.gz")
    whole = gzip.compress(plain.read_bytes())
    plain.unlink()
    tgz.write_bytes(whole[: len(whole) // 2])
    err = _refused(tmp_path, capsys, tgz)
    assert "not a readable tar file" in err and "byte offset" in err, err


def test_an_empty_tar_is_named_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import tarfile

    tars = tmp_path / "wds"
    tars.mkdir()
    with tarfile.open(tars / "empty.tar", "w"):
        pass
    err = _refused(tmp_path, capsys, tars / "empty.tar")
    assert "empty.tar: an empty tar (no file members)" in err, err


def test_a_plain_tar_of_a_directory_imports(tmp_path: Path) -> None:
    # `tar cf x.tar -C dir .`: member paths start with ./, and a sample's members are in
    # whatever order the directory lists them (not adjacent).
    import shutil
    import subprocess

    if shutil.which("tar") is None:
        pytest.skip("no tar command")
    src = tmp_path / "dir"
    (src / "b").mkdir(parents=True)
    want: dict[str, dict[str, np.ndarray[Any, Any]]] = {}
    for i in range(5):
        x = np.arange(i + 3, dtype=np.int32)
        np.save(src / "b" / f"x{i}.ego.npy", x)
        (src / "b" / f"x{i}.cls").write_text(str(i))
        (src / "b" / f"x{i}.json").write_text(json.dumps({"i": i}))
        want[f"x/b/x{i}"] = {"ego": x, "cls": np.array(i, dtype=np.int64)}
    tar = tmp_path / "wds" / "x.tar"
    tar.parent.mkdir()
    subprocess.run(["tar", "cf", str(tar), "-C", str(src), "."], check=True)
    root_dir = tmp_path / "root"
    assert main(["import-wds", str(tar), str(root_dir), "--tag", "v1", "--quiet"]) == 0
    root = shardlake.open(root_dir)
    ds = root.dataset("v1")
    assert sorted(ds.keys()) == sorted(want)
    for key, arrays in want.items():
        _same(ds.get(key), arrays)
    assert root.scrub().ok


def test_members_of_one_key_apart_in_the_tar_are_one_sample(tmp_path: Path) -> None:
    import tarfile

    tars = tmp_path / "wds"
    tars.mkdir()

    def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(tars / "mixed.tar", "w") as tar:
        add(tar, "s1.cls", b"1")
        add(tar, "s2.cls", b"2")
        add(tar, "s1.id", b"10")
        add(tar, "s2.id", b"20")
    root = shardlake.open(tmp_path / "root")
    root.import_wds(tars, "v1", progress=False)
    ds = root.dataset("v1")
    for i in (1, 2):
        _same(
            ds.get(f"mixed/s{i}"),
            {"cls": np.array(i, dtype=np.int64), "id": np.array(10 * i, dtype=np.int64)},
        )


def test_images_and_captions_are_kept_bit_exact_or_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(4)
    tars = tmp_path / "wds"
    tars.mkdir()
    records = []
    for i in range(4):
        records.append(
            {
                "__key__": f"{i:04d}",
                "jpg": b"\xff\xd8\xff\xe0" + rng.bytes(200 + i),  # any bytes: kept as they are
                "left.png": b"\x89PNG\r\n\x1a\n" + rng.bytes(50),
                "txt": f"a photo of {i} cats, café".encode(),
                "cls": str(i),
            }
        )
    with wds.TarWriter(str(tars / "img.tar")) as sink:
        for record in records:
            sink.write(record)
    root_dir = tmp_path / "root"
    assert main(["import-wds", str(tars), str(root_dir), "--tag", "v1"]) == 0
    assert "shardlake import-wds:" in capsys.readouterr().err  # progress, on stderr
    root = shardlake.open(root_dir)
    ds = root.dataset("v1")
    for r in records:
        got = ds.get(f"img/{r['__key__']}")
        for name in ("jpg", "left.png", "txt"):
            value = np.asarray(got[name])
            assert value.dtype == np.uint8 and value.ndim == 1
            assert value.tobytes() == r[name], name
        assert int(got["cls"]) == int(r["cls"])
    assert root.scrub().ok
    # --skip-undecoded: only the numbers are imported
    assert main(["import-wds", str(tars), str(root_dir), "--tag", "v2", "--skip-undecoded"]) == 0
    assert sorted(shardlake.open(root_dir).dataset("v2").get("img/0001")) == ["cls"]
