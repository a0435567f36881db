"""Commands: inspect, synth, pack, versions, show."""

from __future__ import annotations

import argparse
import csv
import re
import sys
from typing import Any

from ..errors import SHOW_MAX, UsageError
from .common import (
    finish_command,
    open_root,
    print_json,
    progress_wanted,
)

__all__ = [
    "add_recipe_flags",
    "register",
]

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str) -> int:
    """``1GiB``, ``512MB``, ``64k`` or plain bytes -> bytes."""
    match = _SIZE_RE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (e.g. 1GiB, 256MB, 65536)")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    binary = "i" in unit
    letter = unit[:1] if unit[:1] in "kmgt" else ""
    factor = 1024 ** "kmgt".index(letter) * 1024 if binary and letter else _UNITS[letter]
    value = int(number * factor)
    if value < 1:
        raise argparse.ArgumentTypeError(f"size {text!r} must be at least 1 byte")
    return value


def add_recipe_flags(parser: argparse.ArgumentParser) -> None:
    """``--shard-size``, ``--level``, ``--seed``: how shards are built (pack and import-wds)."""
    parser.add_argument("--shard-size", type=parse_size, help="target shard size (default 1GiB)")
    parser.add_argument("--level", type=int, help="zstd level (default 3)")
    parser.add_argument("--seed", type=int, help="sample-order shuffle seed (default 0)")


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
    parser.add_argument(
        "--strip-prefix",
        metavar="OLD_ROOT",
        help="absolute --path-list entries start with OLD_ROOT instead of SOURCE",
    )
    parser.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="GLOB",
        help="consider only files whose relative path matches (repeatable; * crosses /)",
    )
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="leave out files whose relative path matches (repeatable; * crosses /)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="refuse files that are neither frames (.npz) nor a frame's sidecar (default: "
        "ignore them; inspect lists them)",
    )


def _rule_args(args: argparse.Namespace) -> dict[str, Any]:
    """The source-scoping flags of ``_add_rule_options`` (all but ``--strict``) as the keywords
    ``inspect_source`` and ``PackOptions`` both take."""
    names = (
        "partition_depth",
        "partition_regex",
        "path_list",
        "strip_prefix",
        "include",
        "exclude",
    )
    return {name: getattr(args, name) for name in names}


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add this group's subcommands to the ``shardlake`` parser."""
    _add_inspect(sub)
    _add_synth(sub)
    _add_pack(sub)
    _add_versions(sub)
    _add_show(sub)


def _add_inspect(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("inspect", help="report the partitions of a source tree (read-only)")
    p.add_argument("source", metavar="SOURCE")
    _add_rule_options(p)
    p.add_argument("--out", metavar="TSV", help="also write the per-partition table as TSV")
    p.add_argument(
        "--no-frame-check",
        action="store_true",
        help="list and stat files only; by default every .npz is read as pack reads it and each "
        "one pack would refuse is listed as unreadable",
    )
    finish_command(p, cmd_inspect, opens_root=False)


def _add_synth(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("synth", help="write a synthetic driving-frame corpus")
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
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    finish_command(p, cmd_synth, opens_root=False)


def _add_pack(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("pack", help="pack a source tree into a new version of a dataset root")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("root", metavar="ROOT", help="dataset root URL (path, s3://, gs://, memory://)")
    p.add_argument("--tag", required=True, help="the new version's tag (never reused)")
    p.add_argument("--base", metavar="TAG", help="reuse unchanged partitions of this version")
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
        help="process (default), thread, inline, or dask://HOST:PORT",
    )
    add_recipe_flags(p)
    p.add_argument("--keep-skipped", action="store_true", help="keep is_skipped frames")
    p.add_argument("--require-sidecars", action="store_true")
    p.add_argument("--replace-all", action="store_true", help="rebuild every partition")
    p.add_argument("--source-namespace", metavar="NS", help="source identity (default: its path)")
    p.add_argument(
        "--allow-foreign",
        action="store_true",
        help="publish into a location that already holds other objects (gc leaves them alone)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument(
        "--heartbeat", type=float, default=60.0, help="seconds without progress before a heartbeat"
    )
    finish_command(p, cmd_pack)


def _add_versions(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("versions", help="list the versions of a dataset root")
    p.add_argument("root", metavar="ROOT")
    finish_command(p, cmd_versions)


def _add_show(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("show", help="describe one version (default: latest)")
    p.add_argument("root", metavar="ROOT")
    p.add_argument("tag", metavar="TAG", nargs="?", default=None)
    p.add_argument("--version", dest="version_tag", metavar="TAG", help="same as TAG")
    finish_command(p, cmd_show)


def cmd_inspect(args: argparse.Namespace) -> int:
    from shardlake import inspect_source

    report = inspect_source(
        args.source,
        **_rule_args(args),
        check_frames=not args.no_frame_check,
    )
    columns = ["id", "path", "samples", "skipped", "missing_sidecars", "npz_bytes", "sidecar_bytes"]
    if args.out:
        with open(args.out, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
            writer.writerow(columns)
            for row in report["partitions"]:
                writer.writerow([row[c] for c in columns])
    if args.json:
        print_json(report)
    else:
        print("\t".join(columns))
        for row in report["partitions"]:
            print("\t".join(str(row[c]) for c in columns))
        print(
            f"# {len(report['partitions'])} partitions, {report['samples']} samples, "
            f"{report['skipped']} skipped, {report['missing_sidecars']} without sidecar, "
            f"{report['npz_bytes']} npz bytes"
        )
        for kind in ("collisions", "unreadable", "outside_partitions", "bad_sidecars"):
            for item in report[kind]:
                print(f"# {kind.replace('_', ' ')}: {item}")
        _print_not_frames(report)
        if report["suggestion"]:
            # the library says "partition depth N"; on the command line that is the flag
            flags = re.sub(
                r"\bpartition depth (\d+)", r"--partition-depth \1", report["suggestion"]
            )
            print(f"# suggestion: {flags}")
    problems = sum(len(report[k]) for k in ("collisions", "unreadable", "bad_sidecars"))
    if args.strict:
        problems += len(report["not_frames"])
    return 1 if problems else 0


def _print_not_frames(report: dict[str, Any]) -> None:
    others = report["not_frames"]
    if others:
        print(
            f"# not frames: {len(others)} file(s) neither .npz nor a frame's sidecar; pack "
            "ignores them (--strict refuses them)"
        )
    for item in others[:SHOW_MAX]:
        print(f"# not frames: {item}")
    if len(others) > SHOW_MAX:
        print(f"# not frames: ... and {len(others) - SHOW_MAX} more (--json lists all)")
    if report["excluded"]:
        print(f"# excluded by --include/--exclude: {report['excluded']} file(s)")


def cmd_synth(args: argparse.Namespace) -> int:
    from ..tools.synth import synth_corpus

    try:
        result = synth_corpus(
            args.source,
            args.partitions,
            args.samples,
            seed=args.seed,
            format=args.format,
            neighbors=args.neighbors,
            lanes=args.lanes,
            skip_fraction=args.skip_fraction,
            sidecars=not args.no_sidecars,
            layout=args.layout,
            add=args.add,
            progress=progress_wanted(args),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if args.json:
        print_json(
            {
                "root": str(result.root),
                "samples": result.samples,
                "skipped": result.skipped,
                "partitions": result.partitions,
            }
        )
        return 0
    print(
        f"wrote {result.samples} frames ({result.skipped} skipped) in "
        f"{len(result.partitions)} partitions under {result.root}"
    )
    return 0


def cmd_pack(args: argparse.Namespace) -> int:
    from shardlake import PackOptions

    options = PackOptions(
        workers=args.workers,
        executor=args.executor,
        **_rule_args(args),
        strict=args.strict,
        partitions=args.partition,
        shard_size=args.shard_size,
        level=args.level,
        seed=args.seed,
        keep_skipped=args.keep_skipped,
        require_sidecars=args.require_sidecars,
        replace_all=args.replace_all,
        source_namespace=args.source_namespace,
        progress=progress_wanted(args),
        allow_foreign=args.allow_foreign,
        heartbeat_s=args.heartbeat,
    )
    report = open_root(args).pack(args.source, tag=args.tag, base=args.base, options=options)
    if args.json:
        print_json(report.to_json())
    else:
        print(report.summary())
    return 0


def cmd_versions(args: argparse.Namespace) -> int:
    root = open_root(args)
    rows = [info.to_json() for info in root.versions()]
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print(f"no versions in {root.url}", file=sys.stderr)
    for row in rows:
        mark = "*" if row["latest"] else " "
        print(
            f"{mark} {row['tag']}\t{row['hash']}\t{row['created_at']}\t"
            f"{row['partitions']} partitions\t{row['samples']} samples\tbase={row['base'] or '-'}"
        )
    return 0


def _pairs(doc: Any) -> str:
    """``{'codec': 'x', 'level': 3}`` as ``codec=x level=3`` (no Python reprs in reports)."""
    return " ".join(f"{k}={v}" for k, v in dict(doc).items()) or "-"


def cmd_show(args: argparse.Namespace) -> int:
    if args.tag is not None and args.version_tag is not None and args.tag != args.version_tag:
        raise UsageError(f"two versions given ({args.tag!r} and --version {args.version_tag!r})")
    version = open_root(args).dataset(args.tag or args.version_tag or "latest").version
    if args.json:
        print_json({"tag": version.tag, "hash": version.hash, **version.doc})
        return 0
    record = version.record
    parts = record.partitions
    shards = sum(len(p.shards) for p in parts)
    payload = sum(p.payload_bytes for p in parts)
    print(f"version {version.tag} ({version.hash})")
    print(f"created_at      {record.created_at}")
    print(f"base            {record.base or '- (packed from scratch)'}")
    print(f"format_version  {record.format_version}")
    print(f"recipe          {_pairs(record.recipe)}")
    print(f"partition_rule  {_pairs(record.partition_rule)}")
    print(f"source          {record.source_namespace}")
    print(
        f"samples         {record.samples} in {len(parts)} partitions, {shards} shards, "
        f"{payload} payload bytes"
    )
    print("id\tpath\tsamples\tshards\tdata_rev\tmeta_rev")
    for p in parts:
        print(f"{p.id}\t{p.path}\t{p.samples}\t{len(p.shards)}\t{p.data_rev}\t{p.meta_rev}")
    return 0
