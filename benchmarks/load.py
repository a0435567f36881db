"""Loader benchmark: shardlake vs webdataset vs the plain npz path, plus this machine's limits.

Same shards, same machine, same run, 2 DataLoader workers, batch 32 (defaults):

* ``shardlake``   - ``ShardDataset(...).loader()``: batches built in the workers, decoded straight
  into shared-memory batch tensors.
* ``webdataset``  - ``wds.WebDataset`` over the very same tar shards + shuffle buffer, per-sample
  decode (zstd + safetensors), ``DataLoader(batch_size=32)``.
* ``npz``         - a map-style ``Dataset`` doing ``np.load`` of the source files (today's path).
* ``dataloader limit`` - 2 workers yielding an already-decoded sample of the same size with
  default collate: what any per-sample loader can reach at most.
* ``decode limit`` - zstd + safetensors decode of the same members on all cores (no loader).
* ``shardlake s3`` (``--s3``) - the shardlake loader from a loopback moto S3 endpoint.

Prints samples/s, MB/s (decoded bytes), time to first batch, peak RSS and PSS (main process plus
workers) and the ratios. ``--ttfb-partitions N`` also times the first batch of an N-partition
version (small frames)::

    .venv/bin/python benchmarks/load.py --samples 1200 --partitions 12 --s3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from shardlake.dataset import open_dataset
from shardlake.format.codec import Decoder, decode_safetensors, to_python_strings
from shardlake.pack import pack
from shardlake.store import open_store
from shardlake.tools.bench.measure import MemorySampler
from shardlake.tools.synth import synth_corpus
from shardlake.torch import ShardDataset

DROP = ("version",)


EPOCHS = 3


def measure(
    name: str,
    make: Callable[[], Iterable[Any]],
    count: Callable[[Any], int],
    mb_per_sample: float,
    extra_pids: tuple[int, ...] = (),
) -> dict[str, Any]:
    """Iterate ``EPOCHS`` passes of ``make()``; rates over all of them, TTFB of the first.

    CPU seconds per sample are those of this process, its (reaped) workers and ``extra_pids``
    (e.g. the S3 server).
    """
    extra = [psutil.Process(p) for p in extra_pids]
    cpu0 = _cpu_seconds()
    extra0 = sum(sum(p.cpu_times()[:2]) for p in extra)
    with MemorySampler() as mem:
        t0 = time.perf_counter()
        loader = make()
        it = iter(loader)
        first = next(it)
        ttfb = time.perf_counter() - t0
        n = count(first)
        for batch in it:
            n += count(batch)
        for _ in range(EPOCHS - 1):
            for batch in loader:
                n += count(batch)
        total = time.perf_counter() - t0
    extra_cpu = sum(sum(p.cpu_times()[:2]) for p in extra) - extra0
    cpu = _cpu_seconds() - cpu0 + extra_cpu
    rate = n / total
    first_n = count(first)
    steady = (n - first_n) / max(total - ttfb, 1e-9)  # after the first batch
    return {
        "name": name,
        "samples": n,
        "seconds": round(total, 3),
        "samples_per_s": round(rate, 1),
        "steady_per_s": round(steady, 1),
        "mb_per_s": round(rate * mb_per_sample, 1),
        "cpu_ms_per_sample": round(cpu / n * 1e3, 3),
        **({"server_cpu_ms_per_sample": round(extra_cpu / n * 1e3, 3)} if extra else {}),
        "ttfb_s": round(ttfb, 3),
        "peak_rss_mb": round(mem.peak_rss / 2**20),
        "peak_pss_mb": round(mem.peak_pss / 2**20),
    }


def _cpu_seconds() -> float:
    import resource

    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def batch_len(batch: Any) -> int:
    for value in batch.values():
        if isinstance(value, torch.Tensor):
            return int(value.shape[0])
    return 0


# --- the contenders --------------------------------------------------------------------------


class NpzDataset(Dataset[dict[str, Any]]):
    """What users have today: one ``np.load`` per sample."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> dict[str, Any]:
        with np.load(self.files[i]) as z:
            arrays = {k: z[k] for k in z.files if k not in DROP}
        return to_python_strings(arrays)


_DECODER: Decoder | None = None


def wds_decode(sample: dict[str, Any]) -> dict[str, Any]:
    global _DECODER
    if _DECODER is None:
        _DECODER = Decoder()
    payload = next(v for k, v in sample.items() if k.endswith("safetensors.zst"))
    arrays = decode_safetensors(_DECODER.decompress(payload))
    return {k: torch.from_numpy(v.copy()) for k, v in arrays.items() if k not in DROP}


class PreDecoded(IterableDataset[dict[str, Any]]):
    """The DataLoader limit: yield an already-decoded sample, ``n`` times in total."""

    def __init__(self, sample: dict[str, Any], n: int) -> None:
        self.sample = sample
        self.n = n

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        workers, wid = (1, 0) if info is None else (info.num_workers, info.id)
        for _ in range(wid, self.n, workers):
            yield self.sample


def _decode_range(args: tuple[str, list[tuple[str, int, int]]]) -> int:
    root, spans = args
    store = open_store(root)
    decoder = Decoder()
    payloads = store.read_ranges(spans)
    t0 = time.perf_counter()
    for p in payloads:
        decode_safetensors(decoder.decompress(p))
    return int((time.perf_counter() - t0) * 1e9)


def decode_limit(root: str, ds: ShardDataset, procs: int) -> dict[str, Any]:
    t = ds.table
    spans = [
        (t.shard_keys[int(t.shard[i])], int(t.offset[i]), int(t.offset[i] + t.size[i]))
        for i in range(len(t))
    ]
    parts = [(root, spans[k::procs]) for k in range(procs)]
    with mp.get_context("fork").Pool(procs) as pool:
        ns = pool.map(_decode_range, parts)
    # Each process decodes its share concurrently; the wall time is the slowest one's.
    wall = max(ns) / 1e9
    single = sum(ns) / 1e9 / len(spans)
    return {
        "name": f"decode limit ({procs} cores)",
        "samples_per_s": round(len(spans) / wall, 1),
        "single_core_samples_per_s": round(1 / single, 1),
    }


def _serve_s3(queue: Any, stop: Any) -> None:
    from shardlake.testing.servers import moto_s3_server

    with moto_s3_server(set_env=False) as server:
        queue.put((server.url("bench"), dict(server.storage_options)))
        stop.wait()


# --- setup -----------------------------------------------------------------------------------


def prepare(work: Path, partitions: int, samples: int, neighbors: int) -> tuple[Path, Path]:
    source, root = work / "src", work / "root"
    stamp = work / "prepared.json"
    want = {"partitions": partitions, "samples": samples, "neighbors": neighbors}
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return source, root
    import shutil

    shutil.rmtree(source, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    per = [
        samples // partitions + (1 if i < samples % partitions else 0) for i in range(partitions)
    ]
    t0 = time.perf_counter()
    synth_corpus(source, partitions, per, seed=11, neighbors=neighbors)
    print(f"synth: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    t0 = time.perf_counter()
    pack(source, str(root), tag="bench", workers=2)
    print(f"pack: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    stamp.write_text(json.dumps(want))
    return source, root


def ttfb_many_partitions(work: Path, partitions: int, batch: int, workers: int) -> dict[str, Any]:
    source, root = work / f"src-{partitions}", work / f"root-{partitions}"
    if not (root / "shardlake.json").exists():
        synth_corpus(source, partitions, 2, seed=5, neighbors=4, lanes=4)
        pack(source, str(root), tag="many", workers=2)
    t0 = time.perf_counter()
    ds = ShardDataset(str(root), batch_size=batch, num_workers=workers, max_pad_fraction=1.0)
    opened = time.perf_counter() - t0
    next(iter(ds.loader()))
    return {
        "name": f"time to first batch, {partitions} partitions",
        "open_s": round(opened, 3),
        "ttfb_s": round(time.perf_counter() - t0, 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--work", default="/tmp/shardlake-bench-load")
    ap.add_argument("--samples", type=int, default=1200)
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--neighbors", type=int, default=40, help="N of the v2 frame (40: ~540 KB raw)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--s3", action="store_true", help="also load from a loopback moto S3 endpoint")
    ap.add_argument("--ttfb-partitions", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    source, root = prepare(work, args.partitions, args.samples, args.neighbors)
    ds0 = ShardDataset(str(root), batch_size=args.batch, num_workers=args.workers)
    raw_mb = float(ds0.table.raw_size.mean()) / 1e6
    comp_kb = float(ds0.table.size.mean()) / 1e3
    b, w = args.batch, args.workers
    results: list[dict[str, Any]] = []

    def shardlake_loader(url: Any = str(root), opts: dict[str, Any] | None = None) -> Iterable[Any]:
        ds = ShardDataset(url, batch_size=b, num_workers=w, storage_options=opts)
        return ds.loader()

    results.append(measure("shardlake", shardlake_loader, batch_len, raw_mb))

    import webdataset as wds

    shard_files = sorted(str(p) for p in root.glob("data/*/*/shard-*.tar"))

    def wds_loader() -> Iterable[Any]:
        pipeline = (
            wds.WebDataset(shard_files, shardshuffle=len(shard_files), empty_check=False)
            .shuffle(1000)
            .map(wds_decode)
        )
        return DataLoader(pipeline, batch_size=b, num_workers=w)

    results.append(measure("webdataset", wds_loader, batch_len, raw_mb))

    files = sorted(source.glob("*/*.npz"))
    results.append(
        measure(
            "npz",
            lambda: DataLoader(NpzDataset(files), batch_size=b, num_workers=w, shuffle=True),
            batch_len,
            raw_mb,
        )
    )
    sample = {k: v for k, v in next(iter(ds0)).items()}
    results.append(
        measure(
            "dataloader limit",
            lambda: DataLoader(PreDecoded(sample, len(files)), batch_size=b, num_workers=w),
            batch_len,
            raw_mb,
        )
    )
    results.append(decode_limit(str(root), ds0, os.cpu_count() or 1))

    if args.s3:
        # The server runs in its own process: in this one it would compete for the GIL with
        # the loader's main process (a real endpoint costs this machine nothing).
        ctx = mp.get_context("spawn")
        queue: Any = ctx.Queue()
        stop = ctx.Event()
        server = ctx.Process(target=_serve_s3, args=(queue, stop), daemon=True)
        server.start()
        try:
            url, opts = queue.get(timeout=60)
            local = open_store(str(root))
            remote = open_store(url, opts)
            for key in local.list():
                local.copy_to(remote, key)
            results.append(
                measure(
                    "shardlake s3",
                    lambda: shardlake_loader(url, opts),
                    batch_len,
                    raw_mb,
                    extra_pids=(server.pid,) if server.pid else (),
                )
            )
        finally:
            stop.set()
            server.join(timeout=30)
    if args.ttfb_partitions:
        results.append(ttfb_many_partitions(work, args.ttfb_partitions, b, w))

    # Partition mixing of the plan's batches (JS distance to the selection; lower is better),
    # next to a perfect global shuffle and to streaming partitions in order.
    from shardlake.torch.mixing import batch_mixing, plan_mixing

    part = ds0.partition_of
    perm = np.random.default_rng(0).permutation(len(part))
    ordered = ShardDataset(str(root), batch_size=b, num_workers=w, shuffle=False)
    mixing = {
        "shardlake plan": plan_mixing(ds0).to_json(),
        "global shuffle": batch_mixing(
            [part[perm[i : i + b]] for i in range(0, len(perm) - b + 1, b)], part
        ).to_json(),
        "no shuffle": plan_mixing(ordered).to_json(),
    }

    by = {r["name"]: r for r in results}
    ratios = {
        "shardlake / webdataset": by["shardlake"]["samples_per_s"]
        / by["webdataset"]["samples_per_s"],
        "shardlake / npz": by["shardlake"]["samples_per_s"] / by["npz"]["samples_per_s"],
        "webdataset / dataloader limit": by["webdataset"]["samples_per_s"]
        / by["dataloader limit"]["samples_per_s"],
        "shardlake / dataloader limit": by["shardlake"]["samples_per_s"]
        / by["dataloader limit"]["samples_per_s"],
    }
    if "shardlake s3" in by:
        ratios["shardlake s3 / local"] = (
            by["shardlake s3"]["samples_per_s"] / by["shardlake"]["samples_per_s"]
        )
    header = {
        "samples": len(ds0.table),
        "partitions": len(ds0.partition_names),
        "compressed_kb_per_sample": round(comp_kb, 1),
        "decoded_mb_per_sample": round(raw_mb, 3),
        "batch": b,
        "workers": w,
        "cpus": os.cpu_count(),
        "dataset": open_dataset(str(root)).version.tag,
    }
    if args.json:
        doc = {"setup": header, "results": results, "ratios": ratios, "mixing": mixing}
        print(json.dumps(doc, indent=2))
        return 0
    print(json.dumps(header))
    cols = [
        "samples_per_s",
        "mb_per_s",
        "cpu_ms_per_sample",
        "ttfb_s",
        "peak_rss_mb",
        "peak_pss_mb",
    ]
    print(f"{'loader':<32}" + "".join(f"{c:>15}" for c in cols))
    for r in results:
        extra = {k: v for k, v in r.items() if k not in cols and k not in ("name",)}
        print(f"{r['name']:<32}" + "".join(f"{r.get(c, ''):>15}" for c in cols) + f"   {extra}")
    for name, value in ratios.items():
        print(f"{name:<32}{value:>15.2f}")
    for name, report in mixing.items():
        print(f"mixing {name:<25}{json.dumps(report)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
