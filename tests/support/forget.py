"""A root for forget tests: versions made by pack, pack --base, the writer and remove, two
keysets, and a snapshot of every sample to compare with after a forget."""

from __future__ import annotations

import tarfile
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

import shardlake
from shardlake.testing import synth_corpus

SMALL_SHARD = 40_000  # several shards per partition


@dataclass
class ForgetWorld:
    root: shardlake.Root
    forgotten: list[str]  # keys to forget: one in every version, one remove dropped, one written
    snapshot: dict[str, dict[str, dict[str, bytes]]]  # tag -> key -> array name -> bytes
    payloads: list[bytes]  # decompressed payloads of the forgotten samples, every version
    tags: list[str]
    compressed: list[bytes]  # the same payloads as stored (zstd frames)


def _arrays(sample: dict[str, Any]) -> dict[str, bytes]:
    out = {}
    for name, value in sample.items():
        array = np.asarray(value)
        out[name] = f"{array.dtype}{array.shape}".encode() + array.tobytes()
    return out


def build(root: shardlake.Root, src: Path, *, executor: str = "thread") -> ForgetWorld:
    """v1: pack of two partitions; v2: pack --base v1 with the third; v3: the writer adds
    partition ``extra``; v4: remove of one sample. Keysets ``ks-v2`` (all of v2) and ``ks-v4``
    (a where over v4)."""
    made = synth_corpus(src, 3, 6, seed=11, neighbors=2, lanes=4)
    parts = sorted(made.partitions)
    small = {"executor": executor, "workers": 2, "shard_size": SMALL_SHARD}
    root.pack(str(src), tag="v1", exclude=[f"{parts[2]}/*"], **small)
    root.pack(str(src), tag="v2", base="v1", **small)
    v2 = root.dataset("v2")
    keys = sorted(v2.manifests(columns=["key"]).column("key").to_pylist())
    rng = np.random.default_rng(5)
    with root.writer("v3", base="v2", options=shardlake.WriteOptions(shard_size=SMALL_SHARD)) as w:
        for i in range(5):
            w.write(
                f"extra/{i:06d}",
                {"x": rng.normal(size=(8, 3)).astype(np.float32), "i": np.int64(i).reshape(())},
                {"index": i},
            )
    in_p0 = [k for k in keys if k.startswith(parts[0] + "/")]
    in_p1 = [k for k in keys if k.startswith(parts[1] + "/")]
    removed_in_v4 = in_p1[2]
    root.remove("v4", base="v3", keys=[removed_in_v4, in_p0[4]])
    root.keysets.create("ks-v2", version="v2", where="true")
    root.keysets.create("ks-v4", version="v4", where=f"key <> '{in_p1[0]}'")
    forgotten = [in_p0[1], removed_in_v4, "extra/000002"]
    tags = ["v1", "v2", "v3", "v4"]
    snapshot: dict[str, dict[str, dict[str, bytes]]] = {}
    payloads, compressed = [], []
    decoder = zstandard.ZstdDecompressor()
    for tag in tags:
        ds = root.dataset(tag)
        rows = ds.manifests()
        snapshot[tag] = {}
        for row in rows.to_pylist():
            key = row["key"]
            snapshot[tag][key] = _arrays(ds.get(key))
            if key in forgotten:
                shard = ds.shard_key(row["partition"], row["shard"])
                data = root.store.read_range(shard, row["offset"], row["offset"] + row["size"])
                payloads.append(decoder.decompress(data))
                compressed.append(data)
    return ForgetWorld(root, forgotten, snapshot, payloads, tags, compressed)


def raw_scan(root: shardlake.Root, payloads: list[bytes], keys: list[str]) -> list[str]:
    """Every object under the root that holds a forgotten payload (a tar member decompressed,
    or the raw bytes anywhere) or names a forgotten key in a tar member."""
    wanted = set(payloads)
    compressed_hits = []
    decoder = zstandard.ZstdDecompressor()
    found = []
    for key in root.store.list(""):
        data = root.store.read(key)
        if key.endswith(".tar"):
            with tarfile.open(fileobj=BytesIO(data), mode="r:") as tar:
                for info in tar:
                    member = tar.extractfile(info)
                    assert member is not None
                    raw = decoder.decompress(member.read())
                    if raw in wanted:
                        found.append(f"{key}: {info.name}")
                    if any(info.name.startswith(k.replace(".", "%2E") + ".") for k in keys):
                        found.append(f"{key}: member name {info.name}")
        for payload in payloads:
            if payload in data:
                compressed_hits.append(key)
    return found + compressed_hits
