"""Scale benchmark (issue #10): what start-up, selections and incremental publishes cost as a
version grows to N partitions and 1M samples, on a local store and a loopback moto S3.

Builds a root of N partitions x S tiny samples directly (a fast path: one template payload,
hand-written ustar headers, manifests written with the format modules, then one real publish,
which writes the catalog), and prints per store and N:

* ``startup_s``: ``ShardDataset(...)`` then the first batch of a 2-worker ``ShardLoader``
  (a fresh interpreter each time); ``warm_resume_s``: then ``load_state_dict`` of a state two
  steps in and the first batch after it;
* ``startup_requests``: store requests before the first shard read (the table set-up), with
  an empty catalog cache; ``warm_*``: the same for a second rank of the node;
* ``pss_mb`` / ``pss_b_per_sample``: PSS of trainer + 2 workers after the first batch, and its
  growth per sample above the same loader over a 1-partition root;
* ``keyset_where_s`` / ``keyset_requests``: ``keyset create --where``;
* ``add_one_s`` / ``add_one_requests``: one more partition built and published on top
  (``pack --base`` of one partition without the source scan);
* ``record_bytes``: the version record's size.

    .venv/bin/python benchmarks/scale.py --partitions 100 1000 10000 --samples-per-partition 3
    .venv/bin/python benchmarks/scale.py --partitions 10000 --samples-per-partition 100 --s3
    .venv/bin/python benchmarks/scale.py --partitions 10000 --samples-per-partition 100 500

``startup_s`` / ``startup_requests`` are a node's first rank (empty node-local catalog cache),
``warm_startup_s`` / ``warm_requests`` its other ranks (the cache filled); ``--samples-per-partition
500`` is the 5M-sample row (issue #22), and 2000 / 5000 / 10000 the 20M / 50M / 100M rows (issue
#47). A local root takes about 1.1 KB of disk a sample (100M: ~110 GB); ``--lean`` roots (what
the start-up reads: manifests and catalog) ~18 B. A row whose root would not fit in 90% of the
free disk is refused before anything is written. Build the rows once (``--build-only`` prints
each build's time, disk and peak memory), then measure them::

    .venv/bin/python benchmarks/scale.py --partitions 10000 --samples-per-partition 2000 5000 \
        10000 --lean --work /tmp/scale47 --build-only
    SCALE_STARTUP_ONLY=1 .venv/bin/python benchmarks/scale.py --partitions 10000 \
        --samples-per-partition 2000 5000 10000 --ranks 1 2 4 --lean --keyset-share 0.1 \
        --work /tmp/scale47
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import shardlake
from shardlake.format.codec import Encoder, payload_checksum
from shardlake.format.layout import manifest_key, member_name, partition_id, shard_key, short_hash
from shardlake.format.manifest import CORE_SCHEMA, ManifestMeta, write_manifest
from shardlake.format.tar import BLOCK, END_OF_ARCHIVE
from shardlake.store import Store, open_store
from shardlake.store.layers import RequestCounter

RECIPE = {"codec": "safetensors+zstd", "format_version": 1, "level": 3, "seed": 0, "shard_size": 1}
SCENARIOS = ["stop", "turn", "follow"]
CACHE_ENV = "SHARDLAKE_CATALOG_CACHE"
GOALS = {"startup_s": (2.0, 5.0), "startup_requests": 10, "keyset_where_s": 3.0}


def counted_store(url: str, options: dict[str, Any] | None) -> tuple[Store, RequestCounter]:
    """The store at ``url`` with a request counter layered on."""
    counter = RequestCounter()
    return open_store(url, options).with_layers(counter), counter


def _ustar_header(name: str, size: int) -> bytes:
    """A plain ustar member header (what tarfile writes for short names, ~50x faster)."""
    h = bytearray(BLOCK)
    raw = name.encode()
    h[: len(raw)] = raw
    h[100:108] = b"0000644\0"
    h[108:116] = h[116:124] = b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[148:156] = b" " * 8
    h[156:157] = b"0"
    h[257:265] = b"ustar\x0000"
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def _shard(keys: list[str], payload: bytes) -> tuple[bytes, list[int]]:
    pad = b"\0" * (-len(payload) % BLOCK)
    parts, offsets, pos = [], [], 0
    for key in keys:
        header = _ustar_header(member_name(key), len(payload))
        parts += [header, payload, pad]
        offsets.append(pos + BLOCK)
        pos += BLOCK + len(payload) + len(pad)
    parts.append(END_OF_ARCHIVE)
    return b"".join(parts), offsets


def partition(
    store: Store, path: str, samples: int, encoded: tuple[bytes, bytes], lean: bool = False
) -> dict[str, Any]:
    """Write one tiny partition revision (one shard + manifest); return its version entry.

    ``lean``: the shard holds one member and every sample's manifest row points at it (same
    offset, size and CRC), so a root costs its manifests and catalog only (~60 B a sample
    instead of ~1.1 KB): what the loader's start-up reads is the same (the catalog, then the
    first batch's ranged reads), but ``verify`` would refuse such a root."""
    raw, payload = encoded
    pid = partition_id(path)
    data_rev = short_hash("scale-data", path, str(samples), "lean" if lean else "", length=24)
    meta_rev = short_hash("scale-meta", path, length=24)
    manifest_rev = short_hash("manifest-rev", data_rev, meta_rev, length=24)
    keys = [f"{path}/{path}_{i:06d}" for i in range(samples)]
    if lean:
        data, first = _shard(keys[:1], payload)
        offsets = first * samples
    else:
        data, offsets = _shard(keys, payload)
    crc = payload_checksum(payload)
    # Columnar: what build_manifest_table makes of these rows and sidecars, ~5x faster (5M rows).
    table = pa.table(
        {
            "key": keys,
            "partition": [pid] * samples,
            "shard": np.zeros(samples, np.int32),
            "member": np.arange(samples, dtype=np.int32),
            "offset": np.asarray(offsets, np.int64),
            "size": np.full(samples, len(payload), np.int64),
            "raw_size": np.full(samples, len(raw), np.int64),
            "crc32": np.full(samples, crc, np.int64),
            "source_sha256": ["0" * 64] * samples,
            "has_sidecar": np.ones(samples, bool),
        },
        schema=CORE_SCHEMA,
    )
    table = table.append_column("scenario", pa.array([SCENARIOS[i % 3] for i in range(samples)]))
    table = table.append_column("speed", pa.array(np.arange(samples, dtype=np.float64)))
    skey = shard_key(pid, data_rev, 0)
    store.write(skey, data)
    meta = ManifestMeta(pid, path, data_rev, meta_rev, manifest_rev, RECIPE)
    mkey = manifest_key(pid, data_rev, manifest_rev)
    store.write(mkey, write_manifest(table, meta))
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
        "shards": [{"key": skey, "size": len(data), "members": samples}],
    }


def encoded_sample() -> tuple[bytes, bytes]:
    return Encoder().encode({"x": np.arange(4, dtype=np.float32)})


def build_root(
    url: str,
    partitions: int,
    per_partition: int,
    options: dict[str, Any] | None = None,
    lean: bool = False,
) -> Store:
    """A root with version ``v1`` of ``partitions`` x ``per_partition`` tiny samples
    (``lean``: see :func:`partition`)."""
    from shardlake.format.documents import PartitionEntry
    from shardlake.meta.publish import VersionBody, prepare_publish, publish_version

    store = open_store(url, options)
    sample = encoded_sample()
    with ThreadPoolExecutor(max_workers=8) as pool:
        entries = list(
            pool.map(
                lambda i: partition(store, f"log{i:06d}", per_partition, sample, lean),
                range(partitions),
            )
        )
    body = VersionBody(
        "v1",
        None,
        tuple(PartitionEntry.from_json(e, url) for e in entries),
        recipe=RECIPE,
        partition_rule={"depth": 1},
        source_namespace="scale",
    )
    publish_version(store, body, prepare_publish(store, "v1"))
    return store


# Disk per sample of a built root: a 512 B tar header, the tiny payload padded to 512 B, and
# about 60 B of manifest and catalog (measured: 20M samples took 21 GB).
ROOT_BYTES_PER_SAMPLE = 2 * BLOCK + 60
LEAN_BYTES_PER_SAMPLE = 70  # --lean: manifests and catalog only


def root_bytes(partitions: int, per_partition: int, lean: bool = False) -> int:
    """About how much disk ``build_root`` needs for this many samples."""
    per = LEAN_BYTES_PER_SAMPLE if lean else ROOT_BYTES_PER_SAMPLE
    return partitions * per_partition * per


def check_disk(url: str, partitions: int, per_partition: int, lean: bool = False) -> None:
    """Refuse, before writing anything, a local root the disk cannot hold (100M samples need
    ~105 GB); a full disk half-way through a build would hit every other user of it."""
    import shutil

    need = root_bytes(partitions, per_partition, lean)
    where = Path(url).parent
    where.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(where).free
    print(
        f"building {partitions} x {per_partition} = {partitions * per_partition:,} samples: "
        f"~{need / 1e9:.1f} GB of disk, {free / 1e9:.1f} GB free at {where}",
        flush=True,
    )
    if need > 0.9 * free:
        raise SystemExit(
            f"scale.py: {url}: a root of {partitions * per_partition:,} samples needs "
            f"~{need / 1e9:.0f} GB, more than 90% of the {free / 1e9:.0f} GB free at {where}; "
            "run a smaller row or point --work at a larger disk"
        )


def reuse_or_build(
    url: str, partitions: int, per_partition: int, options: dict[str, Any] | None = None
) -> Store:
    """``build_root``, or (``--work DIR`` kept from an earlier run, a local store) the root
    already there: a 1M-sample root takes ~2 minutes to build, 5M ~4."""
    if os.environ.get("SCALE_REUSE") and options is None and (Path(url) / "versions").is_dir():
        return open_store(url, options)
    lean = bool(os.environ.get("SCALE_LEAN"))
    if options is None:
        check_disk(url, partitions, per_partition, lean)
    return build_root(url, partitions, per_partition, options, lean)


def build_row(url: str, n: int, per_partition: int) -> dict[str, Any]:
    """Build (or find) one root; its build time, disk bytes and this process's peak RSS."""
    import resource

    started = time.perf_counter()
    reuse_or_build(url, n, per_partition)
    disk = sum(f.stat().st_size for f in Path(url).rglob("*") if f.is_file())
    return {
        "N": n,
        "samples": n * per_partition,
        "build_s": round(time.perf_counter() - started, 1),
        "disk_bytes": disk,
        "disk_b_per_sample": round(disk / (n * per_partition), 1),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }


# --- start-up in a fresh interpreter -----------------------------------------------------------


def _pss_tree() -> int:
    import psutil

    me = psutil.Process()
    return sum(p.memory_full_info().pss for p in [me, *me.children(recursive=True)])


def _wait_for(barrier: Path, name: str, count: int) -> None:
    (barrier / f"{name}-{os.getpid()}").touch()
    while len(list(barrier.glob(f"{name}-*"))) < count:
        time.sleep(0.05)


def _read_every_row(ds: Any) -> None:
    """Read the row-table columns an epoch reads, every row (the first batch has read only
    a few pages of a mapped table): PSS then is what the rank holds through its epoch."""
    t = ds.table
    for column in (t.shard, t.offset, t.size, t.crc32):
        int(column.sum(dtype="int64"))


def child_startup(url: str, options: dict[str, Any] | None, rank_doc: str = "") -> dict[str, Any]:
    """``ShardDataset`` -> first batch of a 2-slot loader; requests before the first shard
    read; PSS of the process tree after the first batch. ``rank_doc`` (JSON: engine, rank,
    world_size, barrier) runs one rank of several started together: PSS is read once every
    rank holds its first batch, so the pages they share are split among them."""
    from shardlake.torch import ShardDataset

    rank = json.loads(rank_doc) if rank_doc else {}
    store, counter = counted_store(url, options)
    started = time.perf_counter()  # imports (torch: ~3 s here) are not start-up
    keyset = rank.get("keyset")
    ds = ShardDataset(
        store,
        None if keyset else "v1",
        keyset=keyset,
        batch_size=8,
        num_workers=2,
        engine=rank.get("engine"),
        rank=rank.get("rank", 0),
        world_size=rank.get("world_size", 1),
    )
    requests = counter.total_requests
    loader = ds.loader()
    batches = iter(loader)
    next(batches)
    out = {"startup_s": time.perf_counter() - started, "startup_requests": requests}
    if "barrier" in rank:
        barrier, world = Path(rank["barrier"]), int(rank["world_size"])
        _wait_for(barrier, "first", world)
        out["pss_bytes"] = _pss_tree()
        _wait_for(barrier, "measured", world)
        _read_every_row(ds)
        _wait_for(barrier, "read", world)
        out["pss_read_bytes"] = _pss_tree()
        _wait_for(barrier, "measured-read", world)
    else:
        out["pss_bytes"] = _pss_tree()
        # load_state_dict of a state two steps in, then its first batch (this rank set up).
        next(batches)
        state = loader.state_dict()
        del batches
        again = ds.loader()
        started = time.perf_counter()
        again.load_state_dict(state)
        next(iter(again))
        out["resume_s"] = time.perf_counter() - started
    return out


def run_child(url: str, options: dict[str, Any] | None, rank_doc: str = "") -> dict[str, Any]:
    """One rank's start-up in a fresh interpreter (the catalog cache as ``CACHE_ENV`` says)."""
    done = subprocess.run(
        _child_cmd(url, options, rank_doc), capture_output=True, text=True, timeout=1800
    )
    if done.returncode != 0:
        raise RuntimeError(f"start-up child failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _child_cmd(url: str, options: dict[str, Any] | None, rank_doc: str) -> list[str]:
    cmd = [sys.executable, __file__, "--child", url, json.dumps(options or {})]
    return [*cmd, "--rank-doc", rank_doc] if rank_doc else cmd


def run_ranks(
    url: str, options: dict[str, Any] | None, world: int, engine: str | None
) -> list[dict[str, Any]]:
    """``world`` ranks of one node started together, each in a fresh interpreter."""
    with tempfile.TemporaryDirectory(prefix="scale-ranks-") as barrier:
        docs = [
            json.dumps({"engine": engine, "rank": r, "world_size": world, "barrier": barrier})
            for r in range(world)
        ]
        procs = [
            subprocess.Popen(_child_cmd(url, options, d), stdout=subprocess.PIPE, text=True)
            for d in docs
        ]
        outs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("a rank's start-up child failed (its stderr is above)")
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def ranks_rows(
    url: str,
    options: dict[str, Any] | None,
    samples: int,
    empty_url: str,
    worlds: list[int],
    engines: list[str],
) -> list[dict[str, Any]]:
    """Issue #31: PSS per sample with 1, 2, 4 ranks on one node (the catalog cache warm), per
    engine: the node's PSS above ``world`` loaders over a 1-partition root, per sample; and
    the slowest rank's first batch; ``again_*``: the same ranks started a second time (the
    layout's plan then mapped from the node-local cache as well)."""
    rows = []
    for engine in engines:
        for world in worlds:
            # The baseline: as many ranks over a 1-partition root (the ranks share library
            # pages, so one rank's baseline times ``world`` would be too high).
            empty_ranks = run_ranks(empty_url, options, world, engine)
            empty = sum(r["pss_bytes"] for r in empty_ranks)
            got = run_ranks(url, options, world, engine)
            total = sum(r["pss_bytes"] for r in got)
            # Started again: this layout's plan is now in the node-local cache too (the first
            # start computed it on one rank while the others waited for its file).
            again = run_ranks(url, options, world, engine)
            total_again = sum(r["pss_bytes"] for r in again)
            total_read = sum(r["pss_read_bytes"] for r in again)
            empty_read = sum(r["pss_read_bytes"] for r in empty_ranks)
            rows.append(
                {
                    "engine": engine,
                    "ranks": world,
                    "samples": samples,
                    "node_pss_mb": round(total / 2**20, 1),
                    "pss_b_per_sample": round((total - empty) / samples, 1),
                    "pss_b_per_sample_per_rank": round((total - empty) / samples / world, 1),
                    "slowest_first_batch_s": round(max(r["startup_s"] for r in got), 2),
                    "again_pss_b_per_sample": round((total_again - empty) / samples, 1),
                    # Started again, then every row of the columns an epoch reads read.
                    "again_rows_read_pss_b_per_sample": round(
                        (total_read - empty_read) / samples, 1
                    ),
                    "again_slowest_first_batch_s": round(max(r["startup_s"] for r in again), 2),
                }
            )
            print(json.dumps({"ranks": rows[-1]}), flush=True)
    return rows


# --- one row -----------------------------------------------------------------------------------


def measure(
    url: str,
    n: int,
    per_partition: int,
    options: dict[str, Any] | None,
    empty_pss: int,
    ranks: tuple[list[int], list[str]] = ([], []),
) -> dict[str, Any]:
    from shardlake.format.documents import PartitionEntry
    from shardlake.meta.commits import read_state
    from shardlake.meta.publish import VersionBody, publish_version
    from shardlake.meta.versions import load_version

    started = time.perf_counter()
    store = reuse_or_build(url, n, per_partition, options)
    row: dict[str, Any] = {"N": n, "samples": n * per_partition}
    row["build_s"] = time.perf_counter() - started
    # A fresh node-local catalog cache: the first rank of a node fills it (cold), the others
    # find it (warm); keyset --where below runs warm too.
    os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="catalog-cache-", dir=os.path.dirname(url))
    row.update(run_child(url, options))
    warm = run_child(url, options)
    row["warm_startup_s"] = warm["startup_s"]
    row["warm_requests"] = warm["startup_requests"]
    row["warm_resume_s"] = warm["resume_s"]
    row["pss_mb"] = row["pss_bytes"] / 2**20
    row["pss_b_per_sample"] = (row.pop("pss_bytes") - empty_pss) / row["samples"]
    if ranks[0]:
        empty_url = url.rsplit("/", 1)[0] + "/empty"
        ranks_rows(url, options, row["samples"], empty_url, *ranks)
    share = float(os.environ.get("SCALE_KEYSET_SHARE", "0"))
    if share:
        print(json.dumps({"keyset": keyset_row(url, options, share)}), flush=True)
    if os.environ.get("SCALE_STARTUP_ONLY"):
        return {**row, **{c: 0 for c in COLUMNS if c not in row and c != "store"}}
    store, counter = counted_store(url, options)
    started = time.perf_counter()
    shardlake.open(store).keysets.create("turns", version="v1", where="scenario = 'turn'")
    row["keyset_where_s"] = time.perf_counter() - started
    row["keyset_requests"] = counter.total_requests
    store, counter = counted_store(url, options)
    started = time.perf_counter()
    version = load_version(store, "v1")
    entry = partition(store, "added", per_partition, encoded_sample())
    parts = [*version.entries, PartitionEntry.from_json(entry, url)]
    body = VersionBody.successor(version.header_doc, tag="v2", base="v1", partitions=parts)
    publish_version(store, body, read_state(store))
    row["add_one_s"] = time.perf_counter() - started
    row["add_one_requests"] = counter.total_requests
    row["record_bytes"] = len(store.read(f"versions/v1/{version.hash}.json"))
    return row


def keyset_row(url: str, options: dict[str, Any] | None, share: float) -> dict[str, Any]:
    """Issue #47: a keyset of ``share`` of the samples (``speed % k = 0``: every k-th sample
    of each partition) created, then opened in the loader: ``ShardDataset(keyset=...)`` to
    the first batch, a node's first rank (the catalog cache empty) and a second one. The
    keyset is deleted afterwards, so a kept root (``--work``) stays as it was."""
    store, counter = counted_store(url, options)
    root = shardlake.open(store)
    name = "scale-share"
    if name in {k.name for k in root.keysets.list()}:
        root.keysets.delete(name)
    every = max(1, round(1 / share))
    started = time.perf_counter()
    made = root.keysets.create(name, version="v1", where=f"speed % {every} = 0")
    out: dict[str, Any] = {
        "share": share,
        "keys": len(made.keys),
        "create_s": round(time.perf_counter() - started, 2),
        "create_requests": counter.total_requests,
    }
    del made
    os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="catalog-cache-", dir=os.path.dirname(url))
    doc = json.dumps({"keyset": name})
    for label in ("open", "warm_open"):
        got = run_child(url, options, doc)
        out[f"{label}_s"] = round(got["startup_s"], 2)
        out[f"{label}_requests"] = got["startup_requests"]
        out[f"{label}_pss_mb"] = round(got["pss_bytes"] / 2**20, 1)
    shardlake.open(url, **(options or {})).keysets.delete(name)
    return out


COLUMNS = [
    "store",
    "N",
    "samples",
    "build_s",
    "startup_s",
    "startup_requests",
    "warm_startup_s",
    "warm_requests",
    "warm_resume_s",
    "pss_mb",
    "pss_b_per_sample",
    "keyset_where_s",
    "keyset_requests",
    "add_one_s",
    "add_one_requests",
    "record_bytes",
]


def _print_row(row: dict[str, Any]) -> None:
    cells = [f"{row[c]:.2f}" if isinstance(row[c], float) else str(row[c]) for c in COLUMNS]
    print(" | ".join(cells), flush=True)


def _serve_s3(queue: Any, stop: Any) -> None:
    from shardlake.testing.servers import moto_s3_server

    with moto_s3_server(set_env=False) as server:
        queue.put((server.url("scale"), dict(server.storage_options)))
        stop.wait()


def run_store(
    kind: str,
    sizes: list[tuple[int, int]],
    work: Path,
    ranks: tuple[list[int], list[str]] = ([], []),
) -> None:
    stop: Any = None
    server: Any = None
    if kind == "s3":
        # Its own process: in this one moto would compete with the measured code for the GIL.
        ctx = mp.get_context("spawn")
        queue: Any = ctx.Queue()
        stop = ctx.Event()
        server = ctx.Process(target=_serve_s3, args=(queue, stop), daemon=True)
        server.start()
        base_url, options = queue.get(timeout=60)
    else:
        base_url, options = str(work), None
    try:
        empty_url = f"{base_url}/empty"
        reuse_or_build(empty_url, 1, 64, options)  # 4 ranks x batch 8 without replays
        os.environ[CACHE_ENV] = "off"
        empty = run_child(empty_url, options)["pss_bytes"]
        for n, per in sizes:
            row = measure(f"{base_url}/n{n}x{per}", n, per, options, empty, ranks)
            _print_row({"store": kind, **row})
    finally:
        if stop is not None:
            stop.set()
            server.join(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument(
        "--samples-per-partition",
        type=int,
        nargs="+",
        default=[3],
        help="one row per partition count and value (500: ~5M samples at 10,000 partitions)",
    )
    parser.add_argument("--s3", action="store_true", help="also measure a loopback moto S3")
    parser.add_argument("--no-local", action="store_true", help="skip the local store")
    parser.add_argument(
        "--ranks",
        type=int,
        nargs="*",
        default=[],
        help="issue #31: also PSS per sample with this many ranks of one node (e.g. 1 2 4)",
    )
    parser.add_argument(
        "--engines", nargs="+", default=["threads"], choices=["threads", "processes"]
    )
    parser.add_argument(
        "--work",
        default=None,
        help="keep the roots under this directory and reuse them on a later run (local store; "
        "with SCALE_STARTUP_ONLY=1, as the keyset and publish steps change a root)",
    )
    parser.add_argument(
        "--lean",
        action="store_true",
        help="catalog-only roots: each partition's samples share its shard's one payload "
        "(~70 B of disk a sample instead of ~1.1 KB; the loader reads the same catalog)",
    )
    parser.add_argument(
        "--keyset-share",
        type=float,
        default=0.0,
        help="issue #47: also create a keyset of this share of the samples (e.g. 0.1) and "
        "open it in the loader (first batch, cold and warm)",
    )
    parser.add_argument(
        "--build-only",
        action="store_true",
        help="issue #47: only build (or find, with --work) the roots and print their build "
        "time, disk and the build's peak memory, one row each",
    )
    parser.add_argument("--child", nargs=2, metavar=("URL", "OPTIONS"), help=argparse.SUPPRESS)
    parser.add_argument("--rank-doc", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        url, opts = args.child
        print(json.dumps(child_startup(url, json.loads(opts) or None, args.rank_doc)))
        return 0
    print("command: python benchmarks/scale.py " + " ".join(argv or sys.argv[1:]))
    sizes = [(n, per) for per in args.samples_per_partition for n in args.partitions]
    kinds = ([] if args.no_local else ["local"]) + (["s3"] if args.s3 else [])
    if args.work:
        os.environ["SCALE_REUSE"] = "1"
    if args.lean:
        os.environ["SCALE_LEAN"] = "1"
    if args.keyset_share:
        os.environ["SCALE_KEYSET_SHARE"] = str(args.keyset_share)
    if args.build_only:
        if not args.work:
            parser.error("--build-only needs --work (a root is built to be kept)")
        for n, per in sizes:
            print(json.dumps(build_row(str(Path(args.work) / "local" / f"n{n}x{per}"), n, per)))
        return 0
    print(f"goals at 10k partitions / 1M samples: {GOALS}, PSS growth <= 100 B/sample")
    print(" | ".join(COLUMNS))
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            run_store(kind, sizes, Path(args.work or tmp) / kind, (args.ranks, args.engines))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
