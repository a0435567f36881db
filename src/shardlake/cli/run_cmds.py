"""Commands: demo, compare-runs, mixing, bench."""

from __future__ import annotations

import argparse
import sys

from ..progress.bar import plural
from . import flags
from .bench_cmds import BENCH_COMMANDS
from .common import flag_values, open_root, print_json, print_report
from .flags import Command

__all__ = ["COMMANDS"]


def _compare_runs(args: argparse.Namespace) -> int:
    from ..tools.compare_runs import compare_runs
    from ..tools.compare_strict import compare_runs_strict

    if args.strict:
        strict = compare_runs_strict(
            args.baseline,
            args.candidate,
            metrics=args.metric,
            ignore_args=args.ignore_arg or (),
            check_args=args.check_arg or (),
        )
        return print_report(args, strict.to_json(), strict.report(), ok=strict.passed)
    result = compare_runs(
        args.baseline,
        args.candidate,
        plateau=args.plateau,
        k=args.k,
        metrics=args.metric,
        ignore_args=args.ignore_arg or (),
        check_args=args.check_arg or (),
    )
    return print_report(args, result.to_json(), result.report(), ok=result.passed)


def _demo(args: argparse.Namespace) -> int:
    from ..tools.demo import DemoConfig, run_demo

    cfg = DemoConfig(
        **flag_values(args, "store", "workdir", "partitions", "samples", "extra_partitions"),
        **flag_values(args, "steps", "nproc", "batch_size", "num_workers", "small_frames", "keep"),
        # With --json the progress lines go to stderr and stdout holds only the JSON.
        out=sys.stderr if args.json else sys.stdout,
    )
    summary = run_demo(cfg)
    if args.json:
        print_json(summary)
    return 0


def _mixing(args: argparse.Namespace) -> int:
    from ..tools.bench.mixing import mixing_summary
    from ..torch.plan_types import DEFAULT_MAX_PAD_FRACTION

    ds = (
        open_root(args)
        .dataset(args.version, keyset=args.keyset)
        .to_torch(
            **flag_values(
                args, "keyset", "where", "batch_size", "seed", "num_workers", "world_size"
            ),
            shuffle=not args.no_shuffle,
            rank=0,
            max_pad_fraction=(
                DEFAULT_MAX_PAD_FRACTION if args.max_pad_fraction is None else args.max_pad_fraction
            ),
        )
    )
    doc = mixing_summary(
        ds,
        num_workers=args.num_workers,
        rank=None if args.rank is None else args.rank,
        epoch=args.epoch,
    )
    doc.update(version=ds.version_tag, version_hash=ds.version_hash, selection=ds.selection_desc)
    base = doc["global_shuffle_baseline"]
    return print_report(
        args,
        doc,
        f"{plural(doc['batches'], 'batch', 'batches')} over {plural(doc['partitions'], 'partition')} (epoch {doc['epoch']}): "
        f"JS distance to the selection mean {doc['js_mean']}, p95 {doc['js_p95']}, "
        f"max {doc['js_max']}; a perfect global shuffle: mean {base['js_mean']}, "
        f"p95 {base['js_p95']} (0 = batches look like the selection, 1 = no overlap)",
    )


def _demo_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", choices=("local", "s3"), default="local", help="where the root lives")
    p.add_argument(
        "--workdir",
        help="directory for the corpus and the local root (default: a temporary directory, removed "
        "at the end unless --keep)",
    )
    p.add_argument("--partitions", type=int, default=6, help="partitions in the first batch")
    p.add_argument("--samples", type=int, default=24, help="samples per partition")
    p.add_argument(
        "--extra-partitions", type=int, default=2, help="logs in the incremental second batch"
    )
    p.add_argument(
        "--small-frames",
        action="store_true",
        help="tiny arrays instead of full-size driving frames (CI; same array names)",
    )
    p.add_argument("--steps", type=int, default=20, help="training steps per rank")
    p.add_argument("--num-workers", type=int, default=1, help="loader workers per rank")
    p.add_argument("--nproc", type=int, default=2, help="DDP ranks (gloo, CPU)")
    p.add_argument("--batch-size", type=flags.positive_int, default=8, help="per-rank batch size")
    p.add_argument("--keep", action="store_true", help="keep the temporary working directory")


def _compare_runs_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("baseline", metavar="BASELINE_DIR", help="the reference run (e.g. npz path)")
    p.add_argument("candidate", metavar="CANDIDATE_DIR", help="the run to check (e.g. shard path)")
    p.add_argument(
        "--plateau", type=int, default=5, metavar="N", help="epochs at the end forming the plateau"
    )
    p.add_argument("--k", type=float, default=2.0, help="band half-width in baseline sds (> 0)")
    p.add_argument(
        "--strict",
        action="store_true",
        help="require every cell of the two train_log.tsv to be equal (a switch that must change "
        "nothing, e.g. order='torch'); says 'identical' or names the cells that differ",
    )
    p.add_argument(
        "--metric",
        action="append",
        metavar="COLUMN",
        help="train_log.tsv column to compare (repeatable; default: every column named *loss*, "
        "with --strict every column)",
    )
    p.add_argument(
        "--check-arg",
        action="append",
        metavar="KEY",
        help="require this args.json key to be equal even if the allowlist ignores it (repeatable)",
    )
    p.add_argument(
        "--ignore-arg",
        action="append",
        metavar="KEY",
        help="let this args.json key differ (repeatable; only for settings that cannot shift a "
        "loss)",
    )


def _mixing_flags(p: argparse.ArgumentParser) -> None:
    flags.root(p, help="dataset root URL")
    flags.selection(p)
    p.add_argument("--batch-size", type=flags.positive_int, default=32, help="per-rank batch size")
    p.add_argument(
        "--num-workers", type=flags.non_negative_int, default=2, help="loader workers per rank"
    )
    p.add_argument("--world-size", type=flags.positive_int, default=1, help="ranks")
    p.add_argument("--rank", type=int, help="only this rank's batches (default: all ranks)")
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-shuffle", action="store_true", help="the unshuffled (validation) order")
    flags.max_pad_fraction(p)


COMMANDS = (
    Command(
        "demo",
        _demo,
        _demo_flags,
        help="end-to-end demo: synth -> pack -> keysets -> incremental version -> DDP training",
        description=(
            "Create a small synthetic driving-frame corpus, pack it into a root, create disjoint "
            "train/valid keysets, add a second batch incrementally as a second version (--base), "
            "train a small model for a few steps with 2 DDP ranks (gloo) reading the shards, and "
            "print versions, samples and throughput. --store s3 runs the same against a loopback "
            "S3 endpoint (moto) that the demo starts and stops itself."
        ),
        storage=False,
    ),
    Command(
        "compare-runs",
        _compare_runs,
        _compare_runs_flags,
        help="does a candidate run's loss plateau lie inside the baseline's own noise band?",
        description=(
            "Read args.json and train_log.tsv from both run directories. Per metric, the band is "
            "the baseline's mean ± k·sd over its last N epochs; the candidate passes when its own "
            "mean over the same epochs lies inside every band (exit 0), else fails (exit 1). "
            "Refuses (exit 1, says why) when epoch coverage differs, a cell in range is empty or "
            "not a finite number, --k <= 0, or the runs' args.json differ in any argument outside "
            "the documented allowlist of settings that cannot shift a loss (output paths, "
            "experiment names, the data-path arguments of the two paths, training worker counts, "
            "logging cadence); the report lists every difference and whether it was ignored."
        ),
        storage=False,
    ),
    Command(
        "mixing",
        _mixing,
        _mixing_flags,
        help="how well the loader's batches mix partitions (from the plan; reads no shards)",
        description=(
            "Plan an epoch exactly as the training loader would and report the Jensen-Shannon "
            "distance between each batch's partition histogram and the selection's (mean, p95, "
            "max), next to what a perfect global shuffle of the same selection scores."
        ),
    ),
    Command(
        "bench",
        None,
        help="pack and load benchmarks with JSON output, against any root URL",
        description=(
            "Benchmarks with JSON output. 'bench pack' measures packing throughput on a few "
            "partitions and extrapolates a per-partition cost model for sizing a conversion; "
            "'bench load' measures the training loader (samples/s, MB/s, RSS, time to first "
            "batch, bytes fetched, mixing JSD) against a root URL."
        ),
        actions=BENCH_COMMANDS,
        action_dest="bench_command",
        action_metavar="BENCH",
    ),
)
