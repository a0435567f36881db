"""Bit-exact round trips, deterministic shards, shard rolling, readable by tar/webdataset/DuckDB."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest
from support.pack import assert_consistent, make_source, read_all, small_frame

import shardlake
from shardlake import open_store
from shardlake.format.codec import arrays_equal_exact
from shardlake.format.layout import unescape_member_key
from shardlake.pack import verify_sample
from shardlake.pack.build import Recipe, load_npz
from shardlake.pack.revisions import data_revision, shuffle_order
from shardlake.read.manifests import read_manifest
from shardlake.testing import synth_corpus


def every_dtype() -> dict[str, Any]:
    nan_payload = np.array([np.nan, -np.nan, np.inf], dtype=np.float32)
    nan_payload.view(np.uint32)[0] = 0x7FC00123  # a NaN with a payload must survive
    return {
        "bool": np.array([[True, False], [False, True]]),
        "f16": np.array([1.5, -0.0, 65504], dtype=np.float16),
        "f32_nan": nan_payload,
        "f64": np.linspace(0, 1, 7).reshape(7, 1),
        "i8": np.array([-128, 127], dtype=np.int8),
        "u8": np.arange(10, dtype=np.uint8),
        "i16": np.array([-3], dtype=np.int16),
        "u16": np.array([65535], dtype=np.uint16),
        "i32": np.array([[-(2**31)]], dtype=np.int32),
        "u32": np.array([2**32 - 1], dtype=np.uint32),
        "i64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
        "u64": np.array([2**64 - 1], dtype=np.uint64),
        "str0d": np.array("us-nv-las-vegas-strip"),
        "str_unicode": np.array(["äöü", "日本"]),
        "bytes": np.array([b"ab", b"c"]),
        "complex": np.array([1 + 2j], dtype=np.complex64),
        "big_endian": np.array([1.0, 2.0], dtype=">f8"),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "empty_str": np.array([], dtype="<U3"),
        "scalar": np.array(7, dtype=np.int64),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)),
    }


def test_every_dtype_round_trips_bit_exactly(tmp_path: Path) -> None:
    arrays = every_dtype()
    src = make_source(
        tmp_path / "src", {"log/a": arrays, "log/b": {"only": np.ones(2, np.float16)}}
    )
    store = open_store(str(tmp_path / "root"))
    version = shardlake.open(store).pack(src, tag="v1", executor="inline").record
    got = read_all(store, version)
    with np.load(src / "log/a.npz", allow_pickle=False) as npz:
        expected = {name: npz[name] for name in npz.files}
    assert list(got["log/a"]) == list(expected)  # original array order too
    for name, want in expected.items():
        assert arrays_equal_exact(got["log/a"][name], want), name
    assert got["log/a"]["f32_nan"].view(np.uint32)[0] == 0x7FC00123
    assert got["log/b"]["only"].dtype == np.float16


def test_verify_sample_catches_any_difference() -> None:
    from shardlake.errors import IntegrityError
    from shardlake.format.codec import Decoder, Encoder

    arrays = {"x": np.arange(4, dtype=np.float32), "s": np.array("tok")}
    st, payload = Encoder().encode(arrays)
    verify_sample(st, payload, arrays, Decoder(), "w")  # the real thing passes
    bad = dict(arrays, x=np.array([0, 1, 2, 4], dtype=np.float32))
    with pytest.raises(IntegrityError, match="'x' bytes differ"):
        verify_sample(st, payload, bad, Decoder(), "w")
    with pytest.raises(IntegrityError, match="decodes as"):
        verify_sample(st, payload, dict(arrays, x=arrays["x"].astype(np.int32)), Decoder(), "w")
    with pytest.raises(IntegrityError, match="names/order"):
        verify_sample(st, payload, {"s": arrays["s"], "x": arrays["x"]}, Decoder(), "w")
    _, other_payload = Encoder().encode({"x": np.zeros(4, np.float32), "s": np.array("tok")})
    with pytest.raises(IntegrityError, match="decompress"):
        verify_sample(st, other_payload, arrays, Decoder(), "w")


def test_shards_are_byte_identical_on_rebuild(tmp_path: Path) -> None:
    synth_corpus(tmp_path / "src", 2, 6, seed=4, neighbors=4, lanes=4, format="nuplan")
    versions = []
    for name in ("r1", "r2"):
        store = open_store(str(tmp_path / name))
        versions.append(
            (
                store,
                shardlake.open(store)
                .pack(tmp_path / "src", tag="v1", executor="inline", shard_size=30_000)
                .record,
            )
        )
    (s1, v1), (s2, v2) = versions
    assert [p.data_rev for p in v1.entries] == [p.data_rev for p in v2.entries]
    for p1, p2 in zip(v1.entries, v2.entries, strict=True):
        assert len(p1.shards) > 1  # rolled
        for a, b in zip(p1.shards, p2.shards, strict=True):
            assert a.key == b.key
            assert s1.read(a.key) == s2.read(b.key)
    # A different seed shuffles differently: same content, other bytes and revision.
    s3 = open_store(str(tmp_path / "r3"))
    v3 = (
        shardlake.open(s3)
        .pack(tmp_path / "src", tag="v1", executor="inline", shard_size=30_000, seed=1)
        .record
    )
    assert v3.entries[0].data_rev != v1.entries[0].data_rev
    assert read_all(s3, v3).keys() == read_all(s1, v1).keys()


def test_recipe_json_round_trips_and_its_data_rev_is_fixed() -> None:
    recipe = Recipe(level=5, shard_size=4096, seed=7)
    doc = recipe.to_json()
    assert doc == {
        "level": 5,
        "shard_size": 4096,
        "seed": 7,
        "codec": "safetensors+zstd",
        "format_version": 1,
    }
    assert Recipe.from_json(doc) == recipe
    # data_rev hashes the recipe's canonical (sorted) JSON: no field order can move it.
    assert data_revision(recipe, "drive/a", [("k1", "ab" * 32)]) == "fee712e9c938b4410789dce5"


def test_shard_rolling_respects_target_size(tmp_path: Path) -> None:
    src = make_source(tmp_path / "src", {f"p/s{i:02d}": small_frame(i) for i in range(12)})
    store = open_store(str(tmp_path / "root"))
    version = shardlake.open(store).pack(src, tag="v1", executor="inline", shard_size=2048).record
    part = version.entries[0]
    assert sum(s.members for s in part.shards) == 12
    assert len(part.shards) >= 3
    for shard in part.shards:
        # Only a shard with a single (oversized) member may exceed the target.
        assert shard.size <= 2048 or shard.members == 1
    table, meta = read_manifest(store, part.manifest)
    rows = table.to_pylist()
    assert [(r["shard"], r["member"]) for r in rows] == sorted(
        (r["shard"], r["member"]) for r in rows
    )
    order = shuffle_order(sorted(r["key"] for r in rows), 0)
    assert [r["key"] for r in rows] == order  # rows follow the seeded shuffle
    assert meta.recipe["shard_size"] == 2048 and meta.partition_path == "p"


def test_shards_read_by_tarfile_and_webdataset(tmp_path: Path) -> None:
    import webdataset as wds

    keys = ["log.v1/frame.001", "log.v1/frame%2E", "log.v1/plain"]
    src = make_source(tmp_path / "src", {k: small_frame(i) for i, k in enumerate(keys)})
    store = open_store(str(tmp_path / "root"))
    version = shardlake.open(store).pack(src, tag="v1", executor="inline").record
    part = version.entries[0]
    assert part.path == "log.v1"
    shard_path = tmp_path / "root" / part.shards[0].key
    with tarfile.open(shard_path) as tf:
        members = tf.getmembers()
        assert all(m.mtime == 0 and m.uid == 0 and m.uname == "" for m in members)
        names = [m.name for m in members]
    assert sorted(unescape_member_key(n.removesuffix(".safetensors.zst")) for n in names) == sorted(
        keys
    )
    samples = list(wds.WebDataset(str(shard_path), shardshuffle=False))
    assert len(samples) == 3  # one sample per key: dots in keys are escaped
    from shardlake.format.codec import Decoder

    for sample in samples:
        key = unescape_member_key(sample["__key__"])
        arrays = Decoder().decode(sample["safetensors.zst"])
        assert arrays_equal_exact(arrays["b"], small_frame(keys.index(key))["b"])


def test_manifest_queryable_by_duckdb_and_pyarrow(tmp_path: Path) -> None:
    synth_corpus(tmp_path / "src", 1, 5, seed=2, neighbors=4, lanes=4, skip_fraction=0.0)
    store = open_store(str(tmp_path / "root"))
    version = shardlake.open(store).pack(tmp_path / "src", tag="v1", executor="inline").record
    path = tmp_path / "root" / version.entries[0].manifest
    table = pq.read_table(path)
    for column in (
        "key",
        "shard",
        "member",
        "offset",
        "size",
        "crc32",
        "source_sha256",
        "skipping_info.label",
        "neighbor_ids",
        "timestamp",
        "qw",
    ):
        assert column in table.column_names
    n, labels = duckdb.sql(
        f"SELECT count(*), count(DISTINCT \"skipping_info.label\") FROM read_parquet('{path}')"
    ).fetchall()[0]
    assert n == 5 and labels >= 1
    meta = pq.read_metadata(path).metadata
    assert meta[b"shardlake.format_version"] == b"1"
    assert meta[b"shardlake.data_rev"].decode() == version.entries[0].data_rev


def test_skipped_frames_dropped_unless_kept(tmp_path: Path) -> None:
    result = synth_corpus(tmp_path / "src", 2, 10, seed=8, neighbors=2, lanes=2, skip_fraction=0.3)
    assert result.skipped > 0
    store = open_store(str(tmp_path / "root"))
    report = shardlake.open(store).pack(tmp_path / "src", tag="v1", executor="inline")
    assert report.version.samples == 20 - result.skipped
    assert report.skipped_samples == result.skipped
    kept = (
        shardlake.open(store)
        .pack(tmp_path / "src", tag="v2", executor="inline", keep_skipped=True)
        .record
    )
    assert kept.samples == 20
    assert_consistent(store)


def test_source_npz_never_unpickled(tmp_path: Path) -> None:
    buf = io.BytesIO()
    np.savez(buf, x=np.arange(3))
    assert arrays_equal_exact(load_npz(buf.getvalue(), "w")["x"], np.arange(3))


def test_inspect_cli_tsv_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from shardlake.cli.main import main

    result = synth_corpus(tmp_path / "src", 2, 4, seed=3, neighbors=2, lanes=2, skip_fraction=0.5)
    (result.files[0].with_suffix(".json")).unlink()
    out = tmp_path / "parts.tsv"
    assert main(["inspect", str(tmp_path / "src"), "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["samples"] == 8 and report["missing_sidecars"] == 1
    assert report["skipped"] == sum(
        json.loads(p.with_suffix(".json").read_text())["is_skipped"] for p in result.files[1:]
    )
    lines = out.read_text().splitlines()
    assert lines[0].split("\t")[:3] == ["id", "path", "samples"]
    assert sorted(line.split("\t")[1] for line in lines[1:]) == sorted(result.partitions)
    listing = tmp_path / "one.txt"
    listing.write_text(str(result.files[0].relative_to(tmp_path / "src")) + "\n")
    assert main(["inspect", str(tmp_path / "src"), "--path-list", str(listing), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 1


def test_make_source_and_read_back(tmp_path: Path) -> None:
    from shardlake import open_store

    src = make_source(tmp_path / "src", {f"p/s{i}": small_frame(i) for i in range(3)})
    store = open_store(str(tmp_path / "root"))
    version = shardlake.open(store).pack(src, tag="v1", executor="inline").record
    got = read_all(store, version)
    assert sorted(got) == ["p/s0", "p/s1", "p/s2"]
    assert np.array_equal(got["p/s2"]["b"], np.arange(2, 7))
    assert_consistent(store)
