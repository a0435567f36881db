"""export: closure copies between backends (round trip byte-identical), resume, refusal, npz."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from support.lifecycle import pack_small, pack_synth

import shardlake
from shardlake import Store, open_store
from shardlake.cli.main import main
from shardlake.errors import ConflictError
from shardlake.testing.fixtures import StoreLocation

# Names of the on-disk layout (docs/format.md): the root marker and the root index.
ROOT_MARKER = "shardlake.json"
ROOT_INDEX = "index.json"


def _npz_arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def _commits(store: Store) -> list[str]:
    return store.list("commits/")


def _packed(location: StoreLocation, src: Path) -> Store:
    return pack_synth(location, src, 2, 3, seed=41, format="nuplan")


def _data_objects(store: Store) -> dict[str, bytes]:
    """Everything but the commit log and the root index (export writes fresh ones)."""
    return {
        k: store.read(k) for k in store.list("") if not k.startswith("commits/") and k != ROOT_INDEX
    }


@pytest.mark.parametrize("store_kind", ["seaweedfs", "azure"])
def test_round_trip_local_remote_local_is_byte_identical(
    store_factory: Callable[..., StoreLocation], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src_loc = store_factory("local", "src")
    src = _packed(src_loc, tmp_path / "src")
    keys = sorted(
        shardlake.open(src).dataset().manifests(columns=["key"]).column("key").to_pylist()
    )
    shardlake.open(src).remove(
        "v2", keys=[keys[0]]
    )  # the exported version has its own manifest revision
    shardlake.open(src).keysets.create("val", where="true")  # bound to v2 -> exported
    shardlake.open(src).keysets.create(
        "old", where="true", version="v1"
    )  # bound to v1 -> not exported
    s3 = store_factory(label="mid")
    back = store_factory("local", "back")
    assert main(["export", src_loc.url, s3.url, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["committed"] and report["version"] == "v2" and report["keysets"] == ["val"]
    s3_store = s3.open()
    assert shardlake.open(s3_store).export(back.url).committed
    back_store = back.open()
    # Byte-identical: the v2 closure (shards, manifests, version document), the keyset and the
    # root marker (same dataset_id) -- everything the source holds for v2.
    exported = _data_objects(back_store)
    source = _data_objects(src)
    assert set(exported) <= set(source)
    assert all(exported[k] == source[k] for k in exported)
    assert json.loads(back_store.read(ROOT_MARKER)) == json.loads(src.read(ROOT_MARKER))
    assert [(v.tag, v.is_latest) for v in shardlake.open(back_store).versions()] == [("v2", True)]
    assert len(_commits(back_store)) == 1
    ds = shardlake.open(back.url).dataset()
    assert ds.version.hash == shardlake.open(src).dataset("v2").version.hash
    src_v2 = shardlake.open(src).dataset("v2")
    for key in keys[1:3]:
        a, b = ds.get(key), src_v2.get(key)
        assert list(a) == list(b) and all(a[n].tobytes() == b[n].tobytes() for n in a)
    assert shardlake.open(back_store).keysets.get("val").keys == keys[1:]
    assert shardlake.open(back_store).scrub().ok


@pytest.mark.parametrize("store_kind", ["local", "seaweedfs", "gcs", "azure"])
def test_export_resumes_and_repairs(
    store_location: StoreLocation, store_factory: Callable[..., StoreLocation], tmp_path: Path
) -> None:
    src = _packed(store_location, tmp_path / "src")
    dest_loc = store_factory(label="dest")
    first = shardlake.open(src).export(dest_loc.url, dest_storage_options=dest_loc.storage_options)
    dest = dest_loc.open()
    ds = shardlake.open(dest).dataset()
    shards = [s.key for p in ds.entries for s in p.shards]
    catalog = len(ds.version.catalog_objects())  # partitions table + segments
    assert len(first.copied) == len(shards) + len(ds.entries) + catalog + 1
    # Damage the destination: one shard gone, one corrupted. Re-running repairs exactly those.
    dest.delete(shards[0])
    data = bytearray(dest.read(shards[1]))
    data[len(data) // 3] ^= 0xFF
    dest.write(shards[1], bytes(data))
    again = shardlake.open(src).export(dest_loc.url, dest_storage_options=dest_loc.storage_options)
    assert sorted(again.copied) == sorted(shards[:2])
    assert len(again.skipped) == len(first.copied) - 2
    assert not again.committed  # already committed by the first run
    assert shardlake.open(dest).scrub().ok and dest.read(shards[1]) == src.read(shards[1])


def test_export_refuses_another_dataset_and_non_roots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _packed(StoreLocation("local", str(tmp_path / "a")), tmp_path / "src")
    b_loc = StoreLocation("local", str(tmp_path / "b"))
    pack_small(b_loc, tmp_path / "src")  # same source, but a different dataset (own dataset_id)
    before = {k: b_loc.open().read(k) for k in b_loc.open().list("")}
    with pytest.raises(ConflictError, match="different dataset"):
        shardlake.open(a).export(b_loc.url)
    assert main(["export", str(tmp_path / "a"), b_loc.url]) == 1
    assert "different dataset" in capsys.readouterr().err
    assert {k: b_loc.open().read(k) for k in b_loc.open().list("")} == before  # untouched
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("hello")
    with pytest.raises(ConflictError, match="not empty"):
        shardlake.open(a).export(str(junk))
    assert not (junk / ROOT_MARKER).exists()
    assert main(["export", str(tmp_path / "a"), str(tmp_path / "c"), "--version", "v9"]) == 1
    assert "unknown version" in capsys.readouterr().err
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())
    assert main(["export", str(tmp_path / "a"), str(tmp_path / "c"), "--keyset", "nope"]) == 1
    assert "no keyset" in capsys.readouterr().err


@pytest.mark.parametrize("store_kind", ["local", "gcs"])
def test_export_npz_is_bit_exact(
    store_location: StoreLocation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src_dir = tmp_path / "src"
    store = _packed(store_location, src_dir)
    out = tmp_path / "out"
    assert main(["export", store_location.url, str(out), "--format", "npz", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    keys = sorted(
        shardlake.open(store).dataset().manifests(columns=["key"]).column("key").to_pylist()
    )
    assert report["samples"] == len(keys) == report["sidecars"]
    assert set(report) == {"dest", "version", "samples", "sidecars", "bytes_written"}
    assert report["bytes_written"] == sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    for key in keys:
        want = _npz_arrays(src_dir / f"{key}.npz")
        got = _npz_arrays(out / f"{key}.npz")
        assert list(got) == list(want)  # names and order, incl. 0-d strings map_name / token
        for name in want:
            assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
            assert got[name].tobytes() == want[name].tobytes()
        assert json.loads((out / f"{key}.json").read_text()) == json.loads(
            (src_dir / f"{key}.json").read_text()
        )
    shardlake.open(store).keysets.create("two", keys=keys[:2])
    sub = shardlake.open(store).export(str(tmp_path / "sub"), format="npz", keysets=["two"])
    assert sub.samples == 2 and sorted(p.name for p in (tmp_path / "sub").rglob("*.npz")) == sorted(
        k.split("/")[-1] + ".npz" for k in keys[:2]
    )


def test_failed_export_leaves_nothing_referenced_and_resumes(tmp_path: Path) -> None:
    from shardlake.errors import IntegrityError, VersionNotFoundError

    src = _packed(StoreLocation("local", str(tmp_path / "a")), tmp_path / "src")
    ds = shardlake.open(src).dataset()
    entry = ds.entries[-1]
    row = ds.manifest(entry.id).to_pylist()[0]
    shard = entry.shards[row["shard"]].key
    good = src.read(shard)
    bad = bytearray(good)
    bad[row["offset"] + row["size"] // 2] ^= 0x01  # bit rot inside a payload at the source
    src.write(shard, bytes(bad))
    dest = str(tmp_path / "dest")
    with pytest.raises(IntegrityError, match="source") as info:
        shardlake.open(src).export(dest)
    assert shard in str(info.value)
    dest_store = open_store(dest)
    assert not dest_store.exists(shard)  # the bad copy is not left for a resume to trust
    assert not _commits(dest_store)  # nothing committed, so nothing references a part
    with pytest.raises(VersionNotFoundError):
        shardlake.open(dest).dataset()
    src.write(shard, good)
    again = shardlake.open(src).export(dest)
    assert again.committed and shard in again.copied and again.skipped
    assert shardlake.open(dest).scrub().ok


@pytest.mark.parametrize("store_kind", ["s3"])
def test_export_s3_to_gcs_loads(
    store_factory: Callable[..., StoreLocation], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s3 = store_factory("s3", "from")
    src = _packed(s3, tmp_path / "src")
    gcs = store_factory("gcs", "to")
    # Both URLs are reachable through the loopback servers' environment, as for a user's CLI.
    assert main(["export", s3.url, gcs.url]) == 0
    assert "exported v1" in capsys.readouterr().out
    ds = shardlake.open(gcs.url, **gcs.storage_options).dataset()
    key = ds.manifests(columns=["key"]).column("key")[0].as_py()
    a, b = ds.get(key), shardlake.open(src).dataset().get(key)
    assert list(a) == list(b) and all(a[n].tobytes() == b[n].tobytes() for n in a)
    assert shardlake.open(gcs.open()).scrub().ok
