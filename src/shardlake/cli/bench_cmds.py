"""``shardlake bench pack|load`` (kept import-light: no torch at parse time)."""

from __future__ import annotations

import argparse

from . import flags
from .common import flag_values, parse_storage_options, print_json
from .flags import Command

__all__ = ["BENCH_COMMANDS"]


def _pack_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", nargs="?", metavar="SOURCE", help="npz source tree (default: synth)")
    p.add_argument(
        "--root",
        metavar="URL",
        help="where to write the calibration packs (a scratch prefix under it is removed after; "
        "default: a local temp dir). Use the conversion's real target to measure its write path",
    )
    p.add_argument("--calibrate", type=int, default=3, metavar="K", help="calibration partitions")
    p.add_argument("--workers", type=int, default=2, help="workers for the parallel measurement")
    p.add_argument(
        "--no-parallel", action="store_true", help="skip the parallel efficiency measurement"
    )
    p.add_argument("--corpus", metavar="FILE", help="partition table to predict (inspect output)")
    p.add_argument(
        "--predict-workers",
        type=int,
        action="append",
        metavar="N",
        help="predict for N workers (repeatable; default: --workers)",
    )
    p.add_argument("--synth-partitions", type=int, default=3, help="synthetic corpus partitions")
    p.add_argument("--synth-samples", type=int, default=16, help="frames in the largest one")
    p.add_argument("--neighbors", type=int, default=320, help="synthetic frame size (N agents)")
    p.add_argument("--keep", action="store_true", help="keep the scratch packs")


def _load_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", metavar="ROOT", help="dataset root URL")
    flags.selection(p)
    p.add_argument("--batch-size", type=flags.positive_int, default=32)
    p.add_argument(
        "--num-workers", type=int, default=2, help="loader slots (worker processes or streams)"
    )
    p.add_argument(
        "--engine",
        choices=("threads", "processes", "both"),
        default="both",
        help="loader engine; both (default): the default engine's figures, then both side by "
        "side under 'engines'",
    )
    p.add_argument("--max-batches", type=int, metavar="N", help="stop after N batches")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1, help="plan as one rank of this many")
    flags.max_pad_fraction(p)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="local epoch cache for fetched payloads (re-read epochs come from it)",
    )
    p.add_argument(
        "--cache-bytes",
        type=int,
        metavar="N",
        help="epoch cache budget in bytes (default 64 GiB)",
    )
    p.add_argument(
        "--no-count-bytes",
        action="store_true",
        help="do not log store requests (saves a little overhead; drops bytes_fetched)",
    )


def _bench_pack(args: argparse.Namespace) -> int:
    from ..tools.bench.pack import bench_pack

    names = ("root", "calibrate", "workers", "corpus", "predict_workers")
    synth = ("synth_partitions", "synth_samples", "neighbors", "keep")
    doc = bench_pack(
        args.source, **flag_values(args, *names, *synth), parallel=not args.no_parallel
    )
    print_json(doc)
    return 0


def _bench_load(args: argparse.Namespace) -> int:
    from ..tools.bench.load import bench_load

    selection = ("version", "keyset", "where", "max_pad_fraction")
    loader = ("batch_size", "num_workers", "engine", "max_batches", "epochs", "seed")
    plan = ("world_size", "rank", "cache_dir", "cache_bytes")
    doc = bench_load(
        args.url,
        **flag_values(args, *selection, *loader, *plan),
        count_bytes=not args.no_count_bytes,
        storage_options=parse_storage_options(args.storage_options) or None,
    )
    print_json(doc)
    return 0


# Benchmarks always print JSON: no --json flag.
BENCH_COMMANDS = (
    Command(
        "pack",
        _bench_pack,
        _pack_flags,
        help="pack throughput and a calibrated per-partition cost model (JSON)",
        description=(
            "Pack a few calibration partitions of SOURCE one at a time (1 worker, fresh scratch "
            "prefix each, nothing reused), fit seconds = overhead + npz_bytes / rate, measure "
            "parallel efficiency with --workers, and predict the wall time of packing the whole "
            "corpus (SOURCE itself, or --corpus: the partition table of a bigger one from "
            "'shardlake inspect --json' or '--out partitions.tsv'). Without SOURCE a small "
            "synthetic corpus is generated. Prints JSON."
        ),
        json=False,
        storage=False,
    ),
    Command(
        "load",
        _bench_load,
        _load_flags,
        help="loader throughput, memory, first batch, bytes fetched and mixing (JSON)",
        description=(
            "Iterate shardlake's training loader over a selection of a version at URL (a path, "
            "s3:// or gs://) as one rank of a --world-size job would, and print JSON: samples/s, "
            "MB/s decoded and payload, time to first batch, peak RSS of the process tree, bytes "
            "fetched and requests made (all processes), and the batches' partition mixing "
            "(Jensen-Shannon distance to the selection)."
        ),
        json=False,
    ),
)
