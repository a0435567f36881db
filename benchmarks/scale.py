"""Scale benchmark (issue #10): what start-up and selections cost as a version grows to N partitions.

Builds a root of N partitions x S tiny samples directly (a fast path: one template payload per
sample key, shards and manifests written with the format modules, then one real publish), and
prints per N: loader start-up -> first sample, store requests before it, `keyset create --where`,
publishing one more partition on top of the version, and the version record's size::

    .venv/bin/python benchmarks/scale.py --partitions 100 1000 10000 --samples-per-partition 3

Local store only so far; the S3 column, PSS with 2 workers and ``pack --base`` from a real source
are not measured yet (see issue #10).
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from shardlake.format.codec import Encoder, payload_checksum
from shardlake.format.layout import manifest_key, partition_id, shard_key, short_hash
from shardlake.format.manifest import ManifestMeta, build_manifest_table, write_manifest
from shardlake.format.tar import ShardWriter
from shardlake.keysets import create_keyset
from shardlake.store import RequestCounter, Store, open_store
from shardlake.torch import ShardDataset
from shardlake.versions import load_version, publish_version, read_state

RECIPE = {"codec": "safetensors+zstd", "format_version": 1, "level": 3, "seed": 0, "shard_size": 1}


def _partition(store: Store, path: str, samples: int, encoder: Encoder) -> dict[str, Any]:
    """Write one tiny partition revision (one shard + manifest); return its version entry."""
    pid = partition_id(path)
    data_rev = short_hash("scale-data", path, str(samples), length=24)
    meta_rev = short_hash("scale-meta", path, length=24)
    manifest_rev = short_hash("manifest-rev", data_rev, meta_rev, length=24)
    raw, payload = encoder.encode({"x": np.arange(4, dtype=np.float32)})
    buf = io.BytesIO()
    writer = ShardWriter(buf)
    rows, sidecars = [], []
    for i in range(samples):
        key = f"{path}/{path}_{i:06d}"
        member, offset = writer.add(key, payload)
        rows.append(
            {
                "key": key,
                "partition": pid,
                "shard": 0,
                "member": member,
                "offset": offset,
                "size": len(payload),
                "raw_size": len(raw),
                "crc32": payload_checksum(payload),
                "source_sha256": "0" * 64,
            }
        )
        sidecars.append({"scenario": ["stop", "turn", "follow"][i % 3], "speed": float(i)})
    writer.close()
    skey = shard_key(pid, data_rev, 0)
    store.write(skey, buf.getvalue())
    meta = ManifestMeta(pid, path, data_rev, meta_rev, manifest_rev, RECIPE)
    mkey = manifest_key(pid, data_rev, manifest_rev)
    store.write(mkey, write_manifest(build_manifest_table(rows, sidecars), meta))
    return {
        "id": pid,
        "path": path,
        "data_rev": data_rev,
        "meta_rev": meta_rev,
        "manifest_rev": manifest_rev,
        "manifest": mkey,
        "samples": samples,
        "skipped": 0,
        "payload_bytes": samples * len(payload),
        "shards": [{"key": skey, "size": len(buf.getvalue()), "members": samples}],
    }


def build_root(url: str, partitions: int, per_partition: int) -> Store:
    store = open_store(url)
    encoder = Encoder()
    entries = [_partition(store, f"log{i:06d}", per_partition, encoder) for i in range(partitions)]
    body = {
        "base": None,
        "recipe": RECIPE,
        "partition_rule": {"depth": 1},
        "source_namespace": "scale",
        "keep_skipped": False,
        "partitions": entries,
    }
    publish_version(store, "v1", body, read_state(store))
    return store


def measure(url: str, partitions: int, per_partition: int) -> dict[str, Any]:
    started = time.perf_counter()
    store = build_root(url, partitions, per_partition)
    out: dict[str, Any] = {"N": partitions, "samples": partitions * per_partition}
    out["build_s"] = time.perf_counter() - started
    counter = RequestCounter()  # every store request below, by operation
    calls = counter.requests
    counted = store.with_layers(counter)
    started = time.perf_counter()
    ds = ShardDataset(counted, "v1", batch_size=1, num_workers=0)
    next(iter(ds))
    out["startup_s"] = time.perf_counter() - started
    out["startup_requests"] = sum(calls.values())
    calls.clear()
    started = time.perf_counter()
    create_keyset(counted, "turns", version="v1", where="scenario = 'turn'")
    out["keyset_where_s"] = time.perf_counter() - started
    out["keyset_requests"] = sum(calls.values())
    version = load_version(store, "v1")
    out["version_record_bytes"] = len(store.read(f"versions/v1/{version.hash}.json"))
    entry = _partition(store, "added", per_partition, Encoder())
    body = dict(version.doc)
    body["base"] = "v1"
    body["partitions"] = [*version.partitions, entry]
    calls.clear()
    started = time.perf_counter()
    publish_version(counted, "v2", body, read_state(counted))
    out["publish_plus_one_s"] = time.perf_counter() - started
    out["publish_plus_one_requests"] = sum(calls.values())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--samples-per-partition", type=int, default=3)
    args = parser.parse_args(argv)
    print("command: python benchmarks/scale.py " + " ".join(argv or sys.argv[1:]))
    cols = [
        "N",
        "samples",
        "build_s",
        "startup_s",
        "startup_requests",
        "keyset_where_s",
        "keyset_requests",
        "publish_plus_one_s",
        "publish_plus_one_requests",
        "version_record_bytes",
    ]
    print(" | ".join(cols))
    for n in args.partitions:
        with tempfile.TemporaryDirectory() as tmp:
            row = measure(str(Path(tmp) / "root"), n, args.samples_per_partition)
        print(
            " | ".join(f"{row[c]:.2f}" if isinstance(row[c], float) else str(row[c]) for c in cols)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
