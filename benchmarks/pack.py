"""Pack throughput: shardlake ``pack`` vs webdataset's ``ShardWriter``, and vs the per-frame floor.

All three start from the same synthetic corpus of realistic 18-array compressed npz frames and use
the same number of worker processes (one task per partition), timed as whole pools:

- **webdataset** (baseline): each worker reads a frame with ``np.load`` the way its users write it,
  encodes it like shardlake (safetensors + zstd, same level) and writes it with ``ShardWriter``;
- **shardlake**: ``pack`` (hashes every source, verifies every sample bit-exactly, writes parquet
  manifests, publishes a version);
- **floor**: only the unavoidable work, per frame, on bytes already in memory: the fastest inflate
  (:func:`shardlake.source.npz.load_npz`), safetensors encode and zstd; no I/O, no verification.

    .venv/bin/python benchmarks/pack.py --partitions 4 --samples 50 --workers 2

Goals (issue #14): shardlake >= 2x webdataset and >= 80% of the floor. Prints the per-stage
breakdown (one thread), samples/s and MB/s, the ratios and the command that produced them.

The same run also times the **writer** (issue #32): ``Root.writer`` from arrays already in
memory (the frames loaded once, untimed), against pack from the npz files and against
webdataset's ``ShardWriter`` fed the same in-memory arrays with the same encoding
(safetensors + zstd); the writer and that baseline both run in this one process, the writer
once with one thread and once with ``encode_threads=--workers`` (``writer-threads``).

``--writer-memory-mb N`` instead measures the writer's memory: it writes about N MB of
generated frames (made on the fly, never all in memory) round-robin into ``--mem-partitions``
partitions and reports the peak RSS above the process's RSS before writing, against the bound
of two shards per active partition (``2 * shard_size * partitions``)::

    .venv/bin/python benchmarks/pack.py --writer-memory-mb 2048 --shard-size 67108864

``--s3`` instead measures writing to an object store (issue #47), on SeaweedFS on loopback
(started here, as the tests do), with s3fs' production part size (not the tests' 5 MiB): in
each round, alternating, ``pack`` to local disk, ``pack`` to SeaweedFS, ``export`` of the
local root to SeaweedFS, and a bare upload of the local root's files (boto3 ``put_object`` on
8 threads, one file each); the median and the best of ``--repeat`` rounds each (the machine
is shared: use 3 or more), with the CPU seconds of this process (both packs use the thread
executor, so that their CPU is counted) and of SeaweedFS, the create-if-absent probe a fresh
root pays once (timed apart each round; pack to S3 and export pay it in their rows, the bare
upload does not), and the ratios of the medians against the goals (pack to S3 <= 1.25x the larger of pack local and the bare upload; export <= 1.25x the
bare upload). ``--serial-too`` adds ``pack-s3-serial`` and ``export-s3-serial``: the same
through the upload path before issue #47 (one 50 MiB part at a time), for an A/B in one run::

    .venv/bin/python benchmarks/pack.py --s3 --serial-too --partitions 8 --samples 150 --repeat 2
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import shardlake
from shardlake.tools.bench.pack import (
    GOAL_VS_FLOOR,
    GOAL_VS_WEBDATASET,
    stage_ceilings,
    stage_costs,
)


def _wds_partition(args: tuple[str, list[str], str, int, int]) -> tuple[int, int]:
    """Baseline worker: np.load each frame, encode like shardlake, write with ShardWriter."""
    import webdataset as wds

    from shardlake.format.codec import Encoder
    from shardlake.format.layout import escape_member_key

    root, keys, out_dir, level, shard_size = args
    encoder = Encoder(level)
    samples = payload = 0
    pattern = os.path.join(out_dir, "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxsize=shard_size, verbose=0) as sink:
        for key in keys:
            with np.load(Path(root, key + ".npz")) as npz:
                arrays = {name: npz[name] for name in npz.files}
            _, blob = encoder.encode(arrays, key)
            sink.write({"__key__": escape_member_key(key), "safetensors.zst": blob})
            samples += 1
            payload += len(blob)
    return samples, payload


def _floor_partition(args: tuple[str, list[str], int]) -> tuple[int, float]:
    """Floor worker: frames already in memory -> fastest inflate + safetensors + zstd, timed."""
    from shardlake.format.codec import Encoder, encode_safetensors
    from shardlake.source.npz import load_npz

    root, keys, level = args
    blobs = [Path(root, key + ".npz").read_bytes() for key in keys]  # untimed: no I/O
    encoder = Encoder(level)
    start = time.perf_counter()
    for key, blob in zip(keys, blobs, strict=True):
        encoder.compress(encode_safetensors(load_npz(blob, key)))
    return len(keys), time.perf_counter() - start


def _load_arrays(src: Path) -> list[tuple[str, dict[str, Any], dict[str, Any] | None]]:
    """Every frame as ``(key, arrays, sidecar)`` in memory: the writer's input (untimed)."""
    import json

    from shardlake.source.npz import load_npz

    out = []
    for keys in _partitions(src).values():
        for key in keys:
            arrays = load_npz(Path(src, key + ".npz").read_bytes(), key)
            side = Path(src, key + ".json")
            out.append((key, arrays, json.loads(side.read_text()) if side.exists() else None))
    return out


def run_writer(
    frames: list[tuple[str, dict[str, Any], dict[str, Any] | None]],
    root: Path,
    level: int,
    shard_size: int,
    threads: int = 1,
) -> tuple[float, Any]:
    """``Root.writer`` over in-memory frames (skipped frames left out, as pack does)."""
    import shardlake

    options = shardlake.WriteOptions(level=level, shard_size=shard_size, encode_threads=threads)
    start = time.perf_counter()
    with shardlake.open(root).writer("bench", options=options) as w:
        for key, arrays, meta in frames:
            w.write(key, arrays, meta)
    return time.perf_counter() - start, w.report


def run_webdataset_memory(
    frames: list[tuple[str, dict[str, Any], dict[str, Any] | None]],
    out: Path,
    level: int,
    shard_size: int,
) -> tuple[float, int, int]:
    """webdataset's ShardWriter over the same in-memory frames, encoded like shardlake."""
    import webdataset as wds

    from shardlake.format.codec import Encoder
    from shardlake.format.layout import escape_member_key

    encoder = Encoder(level)
    samples = payload = 0
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxsize=shard_size, verbose=0) as sink:
        for key, arrays, meta in frames:
            if meta and meta.get("is_skipped") is True:
                continue
            _, blob = encoder.encode(arrays, key)
            sink.write({"__key__": escape_member_key(key), "safetensors.zst": blob})
            samples += 1
            payload += len(blob)
    return time.perf_counter() - start, samples, payload


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def writer_memory(megabytes: int, partitions: int, shard_size: int, level: int, work: Path) -> int:
    """Peak RSS of the writer writing about ``megabytes`` MB; see the module docs."""
    import resource

    import shardlake

    frame_bytes = 4 << 20  # 4 MiB of arrays per frame
    frames = max(1, (megabytes << 20) // frame_bytes)
    rng = np.random.default_rng(0)
    # Values 0..15: compressible about 2:1, like sensor data (random bytes would not compress).
    pool = rng.integers(0, 16, size=(8, frame_bytes), dtype=np.uint8)
    root = work / "memroot"
    options = shardlake.WriteOptions(level=level, shard_size=shard_size, spill_dir=work)
    writer = shardlake.open(root).writer("mem", options=options)
    before = _rss_bytes()
    start = time.perf_counter()
    with writer as w:
        for i in range(frames):
            data = np.roll(pool[i % 8], i)  # a new frame each time, made on the fly
            arrays = {"cams": data[: frame_bytes // 2], "lidar": data[frame_bytes // 2 :]}
            w.write(f"p{i % partitions}/{i:08d}", arrays, {"i": i})
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    over = peak - before
    bound = 2 * shard_size * partitions
    written = frames * frame_bytes
    report = w.report
    print(
        f"writer memory: {frames} frames, {written / 1e9:.2f} GB of arrays "
        f"({sum(e.payload_bytes for e in report.version.entries) / 1e9:.2f} GB payload) into "
        f"{partitions} partitions, shard_size {shard_size >> 20} MiB, {seconds:.1f}s "
        f"({written / seconds / 1e6:.0f} MB/s)"
    )
    print(
        f"writer memory: RSS before {before / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB, "
        f"peak above before {over / 2**20:.0f} MiB; bound 2 shards x {partitions} partitions "
        f"= {bound / 2**20:.0f} MiB: {'met' if over < bound else 'MISSED'}"
    )
    print("command: " + " ".join([os.path.basename(sys.executable), *sys.argv]))
    return 0 if over < bound else 1


def _partitions(src: Path) -> dict[str, list[str]]:
    parts: dict[str, list[str]] = {}
    for path in sorted(src.rglob("*.npz")):
        rel = path.relative_to(src).as_posix()[: -len(".npz")]
        parts.setdefault(rel.split("/")[0], []).append(rel)
    return parts


def run_floor(src: Path, workers: int, level: int) -> tuple[float, int]:
    """``(seconds, frames)``: the floor's busy time spread over ``workers`` processes."""
    tasks = [(str(src), keys, level) for keys in _partitions(src).values()]
    with cf.ProcessPoolExecutor(workers, mp_context=_context()) as pool:
        results = list(pool.map(_floor_partition, tasks))
    return sum(r[1] for r in results) / workers, sum(r[0] for r in results)


def _context() -> Any:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["shardlake.pack.build", "webdataset"])
    return ctx


def run_webdataset(
    src: Path, out: Path, workers: int, level: int, shard_size: int
) -> tuple[float, int, int]:
    parts = _partitions(src)
    tasks = []
    for name, keys in parts.items():
        (out / name).mkdir(parents=True, exist_ok=True)
        tasks.append((str(src), keys, str(out / name), level, shard_size))
    start = time.perf_counter()
    with cf.ProcessPoolExecutor(workers, mp_context=_context()) as pool:
        results = list(pool.map(_wds_partition, tasks))
    seconds = time.perf_counter() - start
    return seconds, sum(r[0] for r in results), sum(r[1] for r in results)


def run_shardlake(
    src: Path, root: Path, workers: int, level: int, shard_size: int
) -> tuple[float, Any]:

    start = time.perf_counter()
    report = shardlake.open(str(root)).pack(
        src, tag="bench", workers=workers, level=level, shard_size=shard_size
    )
    return time.perf_counter() - start, report


BARE_THREADS = 8
GOAL_S3_OVER = 1.25


def _bare_upload(root: Path, storage_options: dict[str, Any], url: str) -> tuple[float, int]:
    """Every file of ``root`` PUT to ``url`` by boto3 on BARE_THREADS threads: the ceiling."""
    import boto3

    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    client = boto3.client(
        "s3",
        endpoint_url=storage_options["endpoint_url"],
        aws_access_key_id=storage_options["key"],
        aws_secret_access_key=storage_options["secret"],
        region_name=storage_options["client_kwargs"]["region_name"],
    )
    files = [p for p in root.rglob("*") if p.is_file()]

    def put(path: Path) -> int:
        data = path.read_bytes()
        key = f"{prefix}/{path.relative_to(root).as_posix()}"
        client.put_object(Bucket=bucket, Key=key, Body=data)
        return len(data)

    start = time.perf_counter()
    with cf.ThreadPoolExecutor(BARE_THREADS) as pool:
        total = sum(pool.map(put, files))
    return time.perf_counter() - start, total


def _cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) of this process and its reaped children, or of ``pid``."""
    import resource

    if pid is not None:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run_s3(args: argparse.Namespace, src: Path, work: Path) -> int:
    """The ``--s3`` rows; see the module docs."""
    from shardlake.store import open_store
    from shardlake.store.backends import s3 as s3_backend
    from shardlake.testing.seaweedfs import seaweedfs_server

    best: dict[str, float] = {}
    runs: dict[str, list[float]] = {}
    cpus: dict[str, list[tuple[float, float]]] = {}  # each run's (client, server) CPU seconds
    probes: list[float] = []
    written = 0
    with seaweedfs_server(set_env=False) as server:
        # The production part size: drop the tests' 5 MiB parts.
        base_options = {
            k: v for k, v in server.storage_options.items() if k != "default_block_size"
        }
        options = base_options
        parallel = s3_backend._parallel_file_class
        weed = server._weed.proc.pid if server._weed and server._weed.proc else None
        for rep in range(args.repeat):
            local = work / f"s3-local-{rep}"
            shutil.rmtree(local, ignore_errors=True)
            order = ["pack-local", "pack-s3", "export-s3", "bare-upload"]
            if args.serial_too:
                order += ["pack-s3-serial", "export-s3-serial"]
            if rep % 2:
                order = [order[0], *reversed(order[1:])]
            # The create-if-absent probe a fresh root pays once (pack to S3 and export each
            # write a fresh root every round; the bare upload never probes): timed apart.
            start = time.perf_counter()
            open_store(server.fresh_url(f"probe-{rep}"), base_options).ensure_create_enforced()
            probes.append(time.perf_counter() - start)
            for name in order:
                url = server.fresh_url(f"{name}-{rep}")
                # "-serial": the upload path before issue #47 (s3fs sends one part at a time,
                # 50 MiB parts), in the same run for an A/B on a noisy machine.
                serial = name.endswith("-serial")
                s3_backend._parallel_file_class = (
                    s3_backend._retrying_file_class if serial else parallel
                )
                if serial:
                    options = {**base_options, "default_block_size": 50 << 20}
                else:
                    options = base_options
                client0, server0 = _cpu_s(), _cpu_s(weed) if weed else 0.0
                start = time.perf_counter()
                if name == "pack-local":
                    shardlake.open(str(local)).pack(
                        src,
                        tag="bench",
                        workers=args.workers,
                        executor="thread",
                        level=args.level,
                        shard_size=args.shard_size,
                        progress=False,
                    )
                    written = sum(p.stat().st_size for p in local.rglob("*") if p.is_file())
                elif name.startswith("pack-s3"):
                    shardlake.open(url, **options).pack(
                        src,
                        tag="bench",
                        workers=args.workers,
                        executor="thread",
                        level=args.level,
                        shard_size=args.shard_size,
                        progress=False,
                    )
                elif name.startswith("export-s3"):
                    shardlake.open(str(local)).export(
                        url, dest_storage_options=options, progress=False
                    )
                else:
                    _bare_upload(local, options, url)
                seconds = time.perf_counter() - start
                used = (_cpu_s() - client0, (_cpu_s(weed) - server0) if weed else 0.0)
                runs.setdefault(name, []).append(seconds)
                cpus.setdefault(name, []).append(used)
                best[name] = min(best.get(name, float("inf")), seconds)
            shutil.rmtree(local, ignore_errors=True)
        s3_backend._parallel_file_class = parallel
    print(f"bytes per root: {written / 1e6:.1f} MB; rounds: {args.repeat} (alternating order)")
    # The machine is shared: a row's rounds spread widely, so the ratios use the medians (and,
    # for comparison, the best rounds), and each row's CPU is its median round's.
    med = {name: statistics.median(times) for name, times in runs.items()}
    for name, seconds in med.items():
        all_runs = ", ".join(f"{t:.2f}" for t in runs[name])
        client, srv = (statistics.median(c[i] for c in cpus[name]) for i in (0, 1))
        print(
            f"{name:>16}: median {seconds:6.2f}s {written / seconds / 1e6:6.1f} MB/s, best "
            f"{best[name]:6.2f}s; cpu client {client:5.2f}s server {srv:5.2f}s; runs {all_runs}"
        )
    print(
        f"create-if-absent probe of a fresh root (in pack to S3 and export, not in the bare "
        f"upload): median {statistics.median(probes):.2f}s, runs "
        + ", ".join(f"{t:.2f}" for t in probes)
    )
    ok = True
    for label, figures in (("median", med), ("best", best)):
        ceiling = max(figures["pack-local"], figures["bare-upload"])
        for what, value in (
            ("pack to S3 / max(pack local, bare upload)", figures["pack-s3"] / ceiling),
            ("export to S3 / bare upload", figures["export-s3"] / figures["bare-upload"]),
        ):
            verdict = "met" if value <= GOAL_S3_OVER else "MISSED"
            ok = ok and (label != "median" or value <= GOAL_S3_OVER)
            print(f"{label}: {what}: {value:.2f}x (goal <= {GOAL_S3_OVER:g}x: {verdict})")
    # The probe is paid once per root (then recorded there for a day): the streaming alone.
    probe = statistics.median(probes)
    print(
        "median less the median probe: pack to S3 / max(pack local, bare upload) "
        f"{(med['pack-s3'] - probe) / max(med['pack-local'], med['bare-upload']):.2f}x, "
        f"export to S3 / bare upload {(med['export-s3'] - probe) / med['bare-upload']:.2f}x"
    )
    # With every core busy, wall time cannot fall below (client + server CPU) / cores; and
    # where the store runs on the same cores as the packer, pack to S3 cannot fall below
    # pack local's CPU plus the bare upload's (client and server) on those cores.
    cores = len(os.sched_getaffinity(0))
    cpu = {n: statistics.median(sum(c) for c in cpus[n]) for n in cpus}
    print(
        f"CPU floor ((client + server CPU) / {cores} cores, medians): "
        + ", ".join(f"{name} {value / cores:.2f}s" for name, value in cpu.items())
    )
    print(
        "ratios the CPU allows (rows at equal CPU utilisation): pack to S3 / pack local "
        f"{(cpu['pack-local'] + cpu['bare-upload']) / cpu['pack-local']:.2f}x (pack local's "
        f"CPU + the bare upload's), export / bare upload {cpu['export-s3'] / cpu['bare-upload']:.2f}x"
    )
    print("command: " + " ".join([os.path.basename(sys.executable), *sys.argv]))
    return 0 if ok else 1


def _goal(what: str, value: float, goal: float, unit: str) -> None:
    verdict = "met" if value >= goal else "MISSED"
    print(f"{what}: {value:.2f}{unit} (goal >= {goal:g}{unit}: {verdict})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--samples", type=int, default=50, help="frames per partition")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--neighbors", type=int, default=320, help="N (real frames: 320)")
    parser.add_argument("--level", type=int, default=3)
    parser.add_argument("--shard-size", type=int, default=1 << 30)
    parser.add_argument("--repeat", type=int, default=1, help="alternate the two runs this often")
    parser.add_argument("--workdir", help="where to put corpus and outputs (default: a temp dir)")
    parser.add_argument(
        "--writer-memory-mb",
        type=int,
        help="only measure the writer's peak memory writing this many MB (see the docs above)",
    )
    parser.add_argument("--mem-partitions", type=int, default=2, help="active partitions")
    parser.add_argument(
        "--s3", action="store_true", help="only the writes to SeaweedFS (see the docs above)"
    )
    parser.add_argument(
        "--serial-too",
        action="store_true",
        help="with --s3: also pack and export through the serial upload path (before #47)",
    )
    args = parser.parse_args(argv)

    if args.writer_memory_mb:
        work = Path(args.workdir or tempfile.mkdtemp(prefix="shardlake-bench-"))
        try:
            return writer_memory(
                args.writer_memory_mb, args.mem_partitions, args.shard_size, args.level, work
            )
        finally:
            if not args.workdir:
                shutil.rmtree(work, ignore_errors=True)

    from shardlake.tools.synth import synth_corpus

    work = Path(args.workdir or tempfile.mkdtemp(prefix="shardlake-bench-"))
    src = work / "src"
    if not src.exists():
        t = time.perf_counter()
        synth_corpus(src, args.partitions, args.samples, seed=0, neighbors=args.neighbors)
        print(f"synth: {args.partitions * args.samples} frames in {time.perf_counter() - t:.1f}s")
    npz_bytes = sum(p.stat().st_size for p in src.rglob("*.npz"))
    total = args.partitions * args.samples
    print(
        f"corpus: {total} frames, {npz_bytes / total / 1e3:.0f} KB npz/frame, workers={args.workers}"
    )
    if args.s3:
        try:
            return run_s3(args, src, work)
        finally:
            if not args.workdir:
                shutil.rmtree(work, ignore_errors=True)
    costs = stage_costs(src, sorted(src.rglob("*.npz"))[:20], args.level)
    print("per-frame ms (1 thread): " + ", ".join(f"{k} {v:.2f}" for k, v in costs.items()))
    ceil = stage_ceilings(costs)
    print(
        f"per-frame ms: floor {ceil['floor_ms']:.2f}, shardlake {ceil['shardlake_ms']:.2f} "
        f"(floor + read+sha256 + verify), webdataset {ceil['webdataset_ms']:.2f} "
        f"(np.load + encode + zstd); best ratios these allow: vs floor "
        f"{ceil['ceiling_vs_floor']:.2f}, vs webdataset {ceil['ceiling_vs_webdataset']:.2f}x"
    )

    frames = _load_arrays(src)
    best: dict[str, float] = {}
    payload = 0
    kept = total - sum(1 for _, _, m in frames if m and m.get("is_skipped") is True)
    for rep in range(args.repeat):
        for name in ("writer", "writer-threads", "webdataset-mem"):
            out = work / f"out-{name}-{rep}"
            shutil.rmtree(out, ignore_errors=True)
            if name.startswith("writer"):
                threads = args.workers if name == "writer-threads" else 1
                seconds, report = run_writer(frames, out, args.level, args.shard_size, threads)
                samples = report.version.samples
            else:
                seconds, samples, _ = run_webdataset_memory(
                    frames, out, args.level, args.shard_size
                )
            if samples != kept:
                print(f"{name}: wrote {samples} of {kept} samples", file=sys.stderr)
                return 1
            best[name] = min(best.get(name, float("inf")), seconds)
            shutil.rmtree(out, ignore_errors=True)
        for name in ("webdataset", "shardlake", "floor"):
            out = work / f"out-{name}-{rep}"
            shutil.rmtree(out, ignore_errors=True)
            if name == "floor":
                seconds, samples = run_floor(src, args.workers, args.level)
            elif name == "webdataset":
                seconds, samples, payload = run_webdataset(
                    src, out, args.workers, args.level, args.shard_size
                )
            else:
                seconds, report = run_shardlake(src, out, args.workers, args.level, args.shard_size)
                samples = report.version.samples
                payload = sum(e.payload_bytes for e in report.record.entries)
            if samples != total:
                print(f"{name}: wrote {samples} of {total} samples", file=sys.stderr)
                return 1
            best[name] = min(best.get(name, float("inf")), seconds)
            shutil.rmtree(out, ignore_errors=True)
    for name, seconds in best.items():
        print(
            f"{name:>10}: {seconds:6.2f}s  {total / seconds:8.1f} samples/s  "
            f"{npz_bytes / seconds / 1e6:7.1f} MB/s npz in  {payload / seconds / 1e6:7.1f} MB/s payload out"
        )
    print(
        f"writer (in-memory arrays, 1 process) vs webdataset ShardWriter (same arrays, same "
        f"encoding, 1 process): {best['webdataset-mem'] / best['writer']:.2f}x; vs pack from npz "
        f"({args.workers} workers): {best['shardlake'] / best['writer']:.2f}x; writer with "
        f"encode_threads={args.workers} vs webdataset ShardWriter: "
        f"{best['webdataset-mem'] / best['writer-threads']:.2f}x"
    )
    vs_wds = best["webdataset"] / best["shardlake"]
    vs_floor = best["floor"] / best["shardlake"]
    _goal("shardlake / webdataset (np.load + ShardWriter)", vs_wds, GOAL_VS_WEBDATASET, "x")
    _goal("shardlake / floor (inflate + safetensors + zstd)", vs_floor, GOAL_VS_FLOOR, "")
    print("command: " + " ".join([os.path.basename(sys.executable), *sys.argv]))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
