"""Commands: inspect, synth, pack, versions, show."""

from __future__ import annotations

import argparse
import csv
import re
import sys
from typing import Any

from ..errors import SHOW_MAX, UsageError
from ..progress.bar import plural
from . import flags
from .common import build, flag_values, open_root, print_report, progress_wanted
from .flags import Command

__all__ = ["COMMANDS"]


def _add_rule_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--partition-depth",
        type=int,
        help="the first N directory levels are one partition (default 1)",
    )
    parser.add_argument(
        "--partition-regex",
        help="regex searched in each relative npz path; its named group 'partition' is the partition",
    )
    parser.add_argument(
        "--path-list",
        metavar="FILE",
        help="only these frames: npz paths one a line or a JSON list, relative to SOURCE or "
        "absolute (under SOURCE, or under --strip-prefix)",
    )
    flags.strip_prefix(parser, "absolute --path-list entries start with OLD_ROOT instead of SOURCE")
    flags.include_exclude(
        parser, "{verb} files whose relative path matches (repeatable; * crosses /)"
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="refuse files that are neither frames (.npz) nor a frame's sidecar (default: "
        "ignore them; inspect lists them)",
    )


# The source-scoping flags of ``_add_rule_options`` (all but ``--strict``): keywords that
# ``inspect_source`` and ``PackOptions`` both take.
_RULE_DESTS = (
    "partition_depth",
    "partition_regex",
    "path_list",
    "strip_prefix",
    "include",
    "exclude",
)


def _inspect_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SOURCE")
    _add_rule_options(p)
    p.add_argument("--out", metavar="TSV", help="also write the per-partition table as TSV")
    p.add_argument(
        "--no-frame-check",
        action="store_true",
        help="list and stat files only; by default every .npz is read as pack reads it and each "
        "one pack would refuse is listed as unreadable",
    )


def _synth_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--partitions", type=int, required=True)
    p.add_argument("--samples", type=int, required=True, help="frames per partition")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--format", choices=("v2", "nuplan"), default="v2")
    p.add_argument("--neighbors", type=int, default=320, help="neighbour slots N (real: 320)")
    p.add_argument("--lanes", type=int, help="lane rows (v2: 140, nuplan: 70); small for tests")
    p.add_argument("--skip-fraction", type=float, default=0.0)
    p.add_argument("--no-sidecars", action="store_true", help="write npz files only")
    p.add_argument(
        "--layout",
        choices=("flat", "converter"),
        default="flat",
        help="flat: <log_dir>/ frames; converter: <location>/<split>/<date>/<time>/ frames plus "
        "routes/*.json, like Diffusion-Planner's converter",
    )
    p.add_argument(
        "--add",
        action="store_true",
        help="write into a SOURCE that already holds files (refused otherwise); a run that would "
        "replace any existing file is still refused as a whole, before writing anything",
    )
    flags.quiet(p)


def _pack_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SOURCE")
    flags.publish(p, "reuse unchanged partitions of this version")
    _add_rule_options(p)
    p.add_argument(
        "--partition",
        action="append",
        metavar="ID_OR_PATH",
        help="pack only this partition (repeatable); the base's others are carried over",
    )
    p.add_argument("--workers", type=int, help="parallel partition builds (default: CPU count)")
    p.add_argument(
        "--executor",
        default="process",
        help="process (default), thread, inline, dask://HOST:PORT, ray or ray://HOST:PORT",
    )
    flags.recipe(p)
    p.add_argument("--keep-skipped", action="store_true", help="keep is_skipped frames")
    p.add_argument("--require-sidecars", action="store_true")
    p.add_argument("--replace-all", action="store_true", help="rebuild every partition")
    p.add_argument("--source-namespace", metavar="NS", help="source identity (default: its path)")
    flags.allow_foreign(p)
    flags.quiet(p)
    p.add_argument(
        "--heartbeat", type=float, default=60.0, help="seconds without progress before a heartbeat"
    )


def _show_flags(p: argparse.ArgumentParser) -> None:
    flags.root(p)
    p.add_argument("tag", metavar="TAG", nargs="?", default=None)
    p.add_argument("--version", dest="version_tag", metavar="TAG", help="same as TAG")


def cmd_inspect(args: argparse.Namespace) -> int:
    from shardlake import inspect_source

    report = inspect_source(
        args.source,
        **flag_values(args, *_RULE_DESTS),
        check_frames=not args.no_frame_check,
    )
    columns = ["id", "path", "samples", "skipped", "missing_sidecars", "npz_bytes", "sidecar_bytes"]
    if args.out:
        with open(args.out, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
            writer.writerow(columns)
            for row in report["partitions"]:
                writer.writerow([row[c] for c in columns])
    problems = sum(len(report[k]) for k in ("collisions", "unreadable", "bad_sidecars"))
    if args.strict:
        problems += len(report["not_frames"])
    return print_report(args, report, lambda: _print_inspection(report, columns), ok=not problems)


def _print_inspection(report: dict[str, Any], columns: list[str]) -> None:
    print("\t".join(columns))
    for row in report["partitions"]:
        print("\t".join(str(row[c]) for c in columns))
    print(
        f"# {plural(len(report['partitions']), 'partition')}, {plural(report['samples'], 'sample')}, "
        f"{report['skipped']} skipped, {report['missing_sidecars']} without sidecar, "
        f"{report['npz_bytes']} npz bytes"
    )
    for kind in ("collisions", "unreadable", "outside_partitions", "bad_sidecars"):
        for item in report[kind]:
            print(f"# {kind.replace('_', ' ')}: {item}")
    _print_not_frames(report)
    if report["suggestion"]:
        # the library says "partition depth N"; on the command line that is the flag
        advice = re.sub(r"\bpartition depth (\d+)", r"--partition-depth \1", report["suggestion"])
        print(f"# suggestion: {advice}")


def _print_not_frames(report: dict[str, Any]) -> None:
    others = report["not_frames"]
    if others:
        print(
            f"# not frames: {plural(len(others), 'file')} neither .npz nor a frame's sidecar; pack "
            "ignores them (--strict refuses them)"
        )
    for item in others[:SHOW_MAX]:
        print(f"# not frames: {item}")
    if len(others) > SHOW_MAX:
        print(f"# not frames: ... and {len(others) - SHOW_MAX} more (--json lists all)")
    if report["excluded"]:
        print(f"# excluded by --include/--exclude: {plural(report['excluded'], 'file')}")


def cmd_synth(args: argparse.Namespace) -> int:
    from ..tools.synth import synth_corpus

    try:
        result = synth_corpus(
            args.source,
            args.partitions,
            args.samples,
            **flag_values(args, "seed", "format", "neighbors", "lanes", "skip_fraction"),
            **flag_values(args, "layout", "add"),
            sidecars=not args.no_sidecars,
            progress=progress_wanted(args),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    doc = {
        "root": str(result.root),
        "samples": result.samples,
        "skipped": result.skipped,
        "partitions": result.partitions,
    }
    return print_report(
        args,
        doc,
        f"wrote {plural(result.samples, 'frame')} ({result.skipped} skipped) in "
        f"{plural(len(result.partitions), 'partition')} under {result.root}",
    )


def cmd_pack(args: argparse.Namespace) -> int:
    from shardlake import PackOptions

    options = build(
        PackOptions,
        **flag_values(args, "workers", "executor", *_RULE_DESTS, "strict", *flags.RECIPE_DESTS),
        **flag_values(args, "keep_skipped", "require_sidecars", "replace_all"),
        **flag_values(args, "source_namespace", "allow_foreign"),
        partitions=args.partition,
        progress=progress_wanted(args),
        heartbeat_s=args.heartbeat,
    )
    report = open_root(args).pack(args.source, tag=args.tag, base=args.base, options=options)
    return print_report(args, report.to_json(), report.summary())


def cmd_versions(args: argparse.Namespace) -> int:
    root = open_root(args)
    rows = [info.to_json() for info in root.versions()]
    return print_report(args, rows, lambda: _print_versions(rows, root.url))


def _print_versions(rows: list[dict[str, Any]], url: str) -> None:
    if not rows:
        print(f"no versions in {url}", file=sys.stderr)
    for row in rows:
        mark = "*" if row["latest"] else " "
        print(
            f"{mark} {row['tag']}\t{row['hash']}\t{row['created_at']}\t"
            f"{plural(row['partitions'], 'partition')}\t{plural(row['samples'], 'sample')}\tbase={row['base'] or '-'}"
        )


def _pairs(doc: Any) -> str:
    """``{'codec': 'x', 'level': 3}`` as ``codec=x level=3`` (no Python reprs in reports)."""
    return " ".join(f"{k}={v}" for k, v in dict(doc).items()) or "-"


def cmd_show(args: argparse.Namespace) -> int:
    if args.tag is not None and args.version_tag is not None and args.tag != args.version_tag:
        raise UsageError(f"two versions given ({args.tag!r} and --version {args.version_tag!r})")
    version = open_root(args).dataset(args.tag or args.version_tag or "latest").version
    doc = {"tag": version.tag, "hash": version.hash, **version.doc}
    return print_report(args, doc, lambda: _print_version(version))


def _print_version(version: Any) -> None:
    record = version.record
    parts = record.partitions
    shards = sum(len(p.shards) for p in parts)
    payload = sum(p.payload_bytes for p in parts)
    print(f"version {version.tag} ({version.hash})")
    print(f"created_at      {record.created_at}")
    print(f"base            {record.base or '- (none: made from scratch)'}")
    print(f"format_version  {record.format_version}")
    print(f"recipe          {_pairs(record.recipe)}")
    print(f"partition_rule  {_pairs(record.partition_rule)}")
    # Only pack records its source tree; Root.writer, write_bag and import-wds have none.
    print(
        f"source          {record.source_namespace or '- (none: written by Root.writer, write_bag or import-wds)'}"
    )
    print(
        f"samples         {record.samples} in {plural(len(parts), 'partition')}, {plural(shards, 'shard')}, "
        f"{payload} payload bytes"
    )
    print("id\tpath\tsamples\tshards\tdata_rev\tmeta_rev")
    for p in parts:
        print(f"{p.id}\t{p.path}\t{p.samples}\t{len(p.shards)}\t{p.data_rev}\t{p.meta_rev}")


COMMANDS = (
    Command(
        "inspect",
        cmd_inspect,
        _inspect_flags,
        help="report the partitions of a source tree (read-only)",
        storage=False,
    ),
    Command(
        "synth",
        cmd_synth,
        _synth_flags,
        help="write a synthetic driving-frame corpus",
        storage=False,
    ),
    Command(
        "pack",
        cmd_pack,
        _pack_flags,
        help="pack a source tree into a new version of a dataset root",
    ),
    Command("versions", cmd_versions, flags.root, help="list the versions of a dataset root"),
    Command("show", cmd_show, _show_flags, help="describe one version (default: latest)"),
)
