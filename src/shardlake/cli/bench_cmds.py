"""``shardlake bench pack|load`` argument parsing (kept import-light: no torch at parse time)."""

from __future__ import annotations

import argparse
from typing import Any

from .common import add_max_pad_flag, add_selection_flags, positive_int

__all__ = ["register_bench"]


def register_bench(bsub: argparse._SubParsersAction[Any]) -> None:
    _register_pack(bsub)
    _register_load(bsub)


def _register_pack(bsub: argparse._SubParsersAction[Any]) -> None:
    p = bsub.add_parser(
        "pack",
        help="pack throughput and a calibrated per-partition cost model (JSON)",
        description=(
            "Pack a few calibration partitions of SOURCE one at a time (1 worker, fresh scratch "
            "prefix each, nothing reused), fit seconds = overhead + npz_bytes / rate, measure "
            "parallel efficiency with --workers, and predict the wall time of packing the whole "
            "corpus (SOURCE itself, or --corpus: the partition table of a bigger one from "
            "'shardlake inspect --json' or '--out partitions.tsv'). Without SOURCE a small "
            "synthetic corpus is generated. Prints JSON."
        ),
    )
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
    p.set_defaults(func=_run, bench_command="pack")


def _register_load(bsub: argparse._SubParsersAction[Any]) -> None:
    p = bsub.add_parser(
        "load",
        help="loader throughput, memory, first batch, bytes fetched and mixing (JSON)",
        description=(
            "Iterate shardlake's training loader over a selection of a version at URL (a path, "
            "s3:// or gs://) as one rank of a --world-size job would, and print JSON: samples/s, "
            "MB/s decoded and payload, time to first batch, peak RSS of the process tree, bytes "
            "fetched and requests made (all processes), and the batches' partition mixing "
            "(Jensen-Shannon distance to the selection)."
        ),
    )
    p.add_argument("url", metavar="ROOT", help="dataset root URL")
    add_selection_flags(p)
    p.add_argument("--batch-size", type=positive_int, default=32)
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
    add_max_pad_flag(p)
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
    from .common import add_storage_flags

    add_storage_flags(p)
    p.set_defaults(func=_run, bench_command="load")


def _run(args: argparse.Namespace) -> int:
    from .common import print_json

    print_json(run_bench(args))
    return 0


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    if args.bench_command == "pack":
        from ..tools.bench.pack import bench_pack

        return bench_pack(
            args.source,
            root=args.root,
            calibrate=args.calibrate,
            workers=args.workers,
            parallel=not args.no_parallel,
            corpus=args.corpus,
            predict_workers=args.predict_workers,
            synth_partitions=args.synth_partitions,
            synth_samples=args.synth_samples,
            neighbors=args.neighbors,
            keep=args.keep,
        )
    from ..tools.bench.load import bench_load
    from .common import parse_storage_options

    return bench_load(
        args.url,
        version=args.version,
        keyset=args.keyset,
        where=args.where,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        engine=args.engine,
        max_batches=args.max_batches,
        epochs=args.epochs,
        seed=args.seed,
        world_size=args.world_size,
        rank=args.rank,
        max_pad_fraction=args.max_pad_fraction,
        count_bytes=not args.no_count_bytes,
        cache_dir=args.cache_dir,
        cache_bytes=args.cache_bytes,
        storage_options=parse_storage_options(args.storage_options) or None,
    )
