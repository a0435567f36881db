"""Commands: remove, prune-version, gc, scrub, export, verify, verify-offsets."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import SHOW_MAX
from .common import (
    add_storage_flags,
    finish_command,
    open_root,
    parse_storage_options,
    print_json,
    progress_wanted,
)

__all__ = ["register"]


def _task_flags(p: argparse.ArgumentParser) -> None:
    """``--quiet``, ``--workers`` and ``--executor``: every per-partition checker takes all three."""
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    p.add_argument(
        "--workers", type=int, default=4, metavar="N", help="partitions checked at once (default 4)"
    )
    p.add_argument(
        "--executor",
        default=None,
        metavar="SPEC",
        help="where the per-partition tasks run: thread (default, --workers threads), process, "
        "inline or dask://HOST:PORT (the same spec pack takes)",
    )


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add this group's subcommands to the ``shardlake`` parser."""
    _add_remove(sub)
    _add_prune_version(sub)
    _add_gc(sub)
    _add_scrub(sub)
    _add_export(sub)
    _add_verify(sub)
    _add_verify_offsets(sub)


def _add_remove(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "remove",
        help="publish a new version without some partitions or samples",
        description="Publish TAG: the base version without the given partitions or samples. "
        "Removing samples writes a new manifest revision, never new shards.",
    )
    p.add_argument("root", metavar="ROOT")
    p.add_argument("--tag", required=True, metavar="NEW")
    p.add_argument("--base", default="latest", metavar="TAG")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--partition", nargs="+", metavar="ID_OR_PATH", help="partitions to drop (id or path)"
    )
    what.add_argument("--keys", dest="keys_file", metavar="FILE", help="file of keys to drop")
    what.add_argument("--where", metavar="SQL", help="drop the samples matching this expression")
    p.add_argument("--strip-prefix", metavar="OLD_ROOT", help="map absolute npz paths to keys")
    finish_command(p, cmd_remove)


def _add_prune_version(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("prune-version", help="prune version tags (gc reclaims their bytes)")
    p.add_argument("root", metavar="ROOT")
    p.add_argument("tags", metavar="TAG", nargs="*")
    p.add_argument(
        "--version",
        dest="version_tags",
        action="append",
        default=[],
        metavar="TAG",
        help="a tag to prune (repeatable; same as TAG)",
    )
    p.add_argument("--force", action="store_true", help="also prune the version 'latest' names")
    finish_command(p, cmd_prune)


def _add_gc(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "gc",
        help="delete objects no live version or keyset references",
        description="Delete unreferenced shards, manifests, version documents and staging "
        "leftovers older than the grace period. Only names shardlake writes are candidates: "
        "foreign objects under the root are counted and shown, never deleted. Writers that "
        "started before gc must re-run their publish (they get a clear conflict error).",
    )
    p.add_argument("root", metavar="ROOT")
    p.add_argument("--dry-run", action="store_true", help="only list what would be deleted")
    p.add_argument("--grace", default="6h", metavar="DURATION", help="keep younger objects (6h)")
    p.add_argument(
        "--break-lock",
        action="store_true",
        help="only release the lock of a gc that died (publishes wait for it until it expires)",
    )
    p.add_argument("--yes", action="store_true", help="with --break-lock: do not ask")
    finish_command(p, cmd_gc)


def _add_scrub(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("scrub", help="re-read every payload and check its checksums")
    p.add_argument("root", metavar="ROOT")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--version", dest="tag", default=None, metavar="TAG")
    which.add_argument("--all", action="store_true", help="every live version")
    _task_flags(p)
    finish_command(p, cmd_scrub)


def _add_export(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "export",
        help="copy a version to another store (or write it out as npz + json)",
        description="Copy a version's closure to DEST (any store URL), verifying checksums; "
        "DEST becomes a self-contained root whose latest is that version. Re-running resumes. "
        "With --format npz, DEST is a directory that receives <key>.npz and <key>.json.",
    )
    p.add_argument("root", metavar="ROOT")
    p.add_argument("dest", metavar="DEST")
    p.add_argument(
        "--version",
        dest="tag",
        default=None,
        metavar="TAG",
        help="default: the version of the one --keyset given, else latest",
    )
    p.add_argument(
        "--keyset", action="append", metavar="NAME", help="keyset(s) to carry (npz: to select)"
    )
    p.add_argument("--format", choices=("root", "npz"), default="root")
    p.add_argument(
        "--allow-foreign",
        action="store_true",
        help="export into a location that already holds other objects (gc leaves them alone)",
    )
    add_storage_flags(p, "dest", "DEST")
    _task_flags(p)
    finish_command(p, cmd_export)


def _add_verify(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "verify",
        help="prove a version equals its source tree, bit for bit",
    )
    p.add_argument("root", metavar="ROOT")
    p.add_argument("--source", required=True, metavar="SOURCE")
    add_storage_flags(p, "source", "SOURCE")
    p.add_argument("--version", dest="tag", default="latest", metavar="TAG")
    p.add_argument(
        "--path-list",
        metavar="FILE",
        help="the source is only these frames (text or JSON list, relative or absolute paths)",
    )
    p.add_argument(
        "--strip-prefix",
        metavar="OLD_ROOT",
        help="absolute --path-list entries start with OLD_ROOT instead of SOURCE",
    )
    for flag, verb in (("--include", "consider only"), ("--exclude", "leave out")):
        p.add_argument(
            flag,
            action="append",
            default=[],
            metavar="GLOB",
            help=f"{verb} source frames whose relative path matches, as pack did (repeatable)",
        )
    p.add_argument("--allow-missing", type=int, default=None, metavar="N", help="exactly N missing")
    p.add_argument("--expected-partitions", type=int, default=None, metavar="N")
    _task_flags(p)
    finish_command(p, cmd_verify)


def _add_verify_offsets(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "verify-offsets",
        help="check manifest offsets against tar headers and manifests against the version",
    )
    p.add_argument("root", metavar="ROOT")
    p.add_argument("--version", dest="tag", default="latest", metavar="TAG")
    _task_flags(p)
    finish_command(p, cmd_verify_offsets)


def cmd_remove(args: argparse.Namespace) -> int:
    report = open_root(args).remove(
        args.tag,
        base=args.base,
        partitions=args.partition,
        key_file=args.keys_file,
        strip_prefix=args.strip_prefix,
        where=args.where,
    )
    if args.json:
        print_json(report.to_json())
    else:
        print(report.summary())
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    from ..errors import UsageError

    tags = list(dict.fromkeys([*args.tags, *args.version_tags]))
    if not tags:
        raise UsageError("name the version(s) to prune: TAG or --version TAG")
    report = open_root(args).prune(tags, force=args.force)
    if args.json:
        print_json(report.to_json())
    else:
        print(f"pruned {', '.join(report.pruned)}; latest is now {report.latest or '(none)'}")
        print("run 'shardlake gc' to reclaim their storage")
        for tag, names in report.pinned.items():
            print(
                f"version {tag} is still kept by keyset(s) {', '.join(names)}: gc reclaims it "
                "once they are deleted ('shardlake keyset ROOT delete NAME')"
            )
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from ..progress.bar import human_bytes

    if args.break_lock:
        return _break_lock(args)
    # Through the Root the flags opened: its storage options reach every request.
    report = open_root(args).gc(grace_s=args.grace, dry_run=args.dry_run)
    if args.json:
        print_json(report.to_json())
        return 0
    verb = "would delete" if args.dry_run else "deleted"
    for info in report.garbage:
        print(f"{verb} {info.key} ({info.size} bytes)")
    for leftover in report.leftovers:
        print(f"{verb} staging leftover {leftover.path}")
    print(
        f"{verb} {len(report.garbage)} object(s) and {len(report.leftovers)} staging "
        f"leftover(s), {human_bytes(report.garbage_bytes)} ({report.garbage_bytes} bytes); "
        f"kept {len(report.young)} unreferenced object(s) and {len(report.young_leftovers)} "
        f"staging leftover(s) younger than {args.grace}; {report.referenced} referenced by "
        f"{len(report.live_versions)} version(s)"
    )
    if report.foreign:
        shown = ", ".join(info.key for info in report.foreign[:5])
        more = ", ..." if len(report.foreign) > 5 else ""
        print(
            f"{len(report.foreign)} foreign object(s) under the root, left alone "
            f"(not written by shardlake): {shown}{more}"
        )
    return 0


def _break_lock(args: argparse.Namespace) -> int:
    from ..errors import UsageError

    root = open_root(args)
    lock = root.gc_lock()
    if lock is None:
        raise UsageError(f"{root.url}: no gc lock is held; nothing to break")
    if not args.yes:
        if not sys.stdin.isatty():
            raise UsageError(
                "breaking the gc lock needs confirmation (stdin is no terminal)", options=("yes",)
            )
        answer = input(f"{lock.describe()}. Break it only if that gc is dead. Break? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("lock kept", file=sys.stderr)
            return 1
    broken = root.break_gc_lock()
    if args.json:
        print_json({"broken": None if broken is None else broken.to_json()})
    else:
        print(f"broke the gc lock: {'-' if broken is None else broken.describe()}")
    return 0


def cmd_scrub(args: argparse.Namespace) -> int:
    from ..progress.bar import human_bytes

    report = open_root(args).scrub(
        args.tag,
        all_versions=args.all,
        progress=progress_wanted(args),
        workers=args.workers,
        executor=args.executor,
    )
    if args.json:
        print_json(report.to_json())
    else:
        for part in report.partitions:
            status = "ok" if not part.problems else f"{part.problems} PROBLEM(S)"
            print(f"{part.partition}\t{part.samples} samples\t{human_bytes(part.bytes)}\t{status}")
        for problem in report.problems:
            label = "corrupt" if problem.corrupt_at_rest else "unreadable"
            print(f"{label}: {problem}", file=sys.stderr)
        for text in report.index_problems:
            print(f"index: {text}", file=sys.stderr)
        counts = report.to_json()
        print(
            f"scrubbed {report.samples} samples ({human_bytes(report.bytes)}) of "
            f"{', '.join(report.versions)}: "
            + (
                "ok"
                if report.ok
                else f"{len(report.problems) + len(report.index_problems)} problem(s): "
                f"{counts['corrupt_at_rest']} corrupt at rest, {counts['transport_errors']} "
                f"transport error(s)"
                + (f", {len(report.index_problems)} in index.json" if report.index_problems else "")
            )
        )
    return 0 if report.ok else 1


def cmd_export(args: argparse.Namespace) -> int:
    from shardlake import ExportReport

    report = open_root(args).export(
        args.dest,
        version=args.tag,
        keysets=args.keyset,
        format=args.format,
        dest_storage_options=parse_storage_options(args.dest_storage_options) or None,
        progress=progress_wanted(args),
        allow_foreign=args.allow_foreign,
        workers=args.workers,
        executor=args.executor,
    )
    if args.json:
        print_json(report.to_json())
    elif not isinstance(report, ExportReport):
        print(
            f"wrote {report.samples} npz file(s) and {report.sidecars} sidecar(s) to {report.dest}"
        )
    else:
        print(
            f"exported {report.version} ({report.version_hash}) to {report.dest}: copied "
            f"{len(report.copied)} object(s) ({report.bytes_copied} bytes), skipped "
            f"{len(report.skipped)} already present and verified"
            + (f"; keysets {', '.join(report.keysets)}" if report.keysets else "")
        )
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    import shardlake
    from shardlake import VerifyOptions

    options = VerifyOptions(
        version=args.tag,
        allow_missing=args.allow_missing,
        expected_partitions=args.expected_partitions,
        path_list=args.path_list,
        strip_prefix=args.strip_prefix,
        include=args.include,
        exclude=args.exclude,
        progress=progress_wanted(args),
        executor=args.executor,
        workers=args.workers,
    )
    source_options = parse_storage_options(args.source_storage_options)
    # A source in another store is opened with its own options (storage options enter at open).
    source = shardlake.open_store(args.source, source_options) if source_options else args.source
    report = open_root(args).verify(source, options=options)
    if args.json:
        print_json(report.to_json())
        return 0 if report.ok else 1
    out = sys.stdout if report.ok else sys.stderr
    for label, keys in (("missing", report.missing), ("extra", report.extra)):
        for key in keys[:SHOW_MAX]:
            print(f"{label}: {key}", file=out)
    for problem in report.problems[:SHOW_MAX]:
        print(f"differs: {problem}", file=out)
    summary = (
        f"version {report.version}: {report.partitions} partition(s), {report.compared} of "
        f"{report.source_samples} source sample(s) compared bit-exactly, {len(report.missing)} "
        f"missing, {len(report.extra)} extra"
    )
    if report.ok:
        print(f"verify OK - {summary}")
        return 0
    print(f"verify FAILED ({'; '.join(report.failures())}) - {summary}")
    return 1


def cmd_verify_offsets(args: argparse.Namespace) -> int:
    report = open_root(args).verify_offsets(
        args.tag, progress=progress_wanted(args), workers=args.workers, executor=args.executor
    )
    if args.json:
        print_json(report.to_json())
        return 0 if report.ok else 1
    for problem in report.problems:
        print(f"mismatch: {problem}", file=sys.stderr)
    status = "OK" if report.ok else f"FAILED ({len(report.problems)} problem(s))"
    print(
        f"verify-offsets {status} - version {report.version}: {report.partitions} partition(s), "
        f"{report.shards} shard(s), {report.rows} manifest row(s)"
    )
    return 0 if report.ok else 1
