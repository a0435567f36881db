"""Commands: remove, forget, prune-version, gc, scrub, export, verify, verify-offsets."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from ..errors import SHOW_MAX, UsageError
from ..progress.bar import plural
from . import flags
from .common import (
    build,
    flag_values,
    open_root,
    parse_storage_options,
    print_report,
    progress_wanted,
)
from .flags import Command

if TYPE_CHECKING:
    from shardlake import GcReport, OffsetsReport, PruneReport, ScrubReport, VerifyReport

__all__ = ["COMMANDS"]


def _task_flags(p: argparse.ArgumentParser) -> None:
    """``--quiet``, ``--workers`` and ``--executor``: every per-partition checker takes all three."""
    flags.quiet(p, "no progress bar on stderr")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="partitions checked at once (default 4)",
    )
    p.add_argument(
        "--executor",
        default=None,
        metavar="SPEC",
        help="where the per-partition tasks run: thread (default, --workers threads), process, "
        "inline, dask://HOST:PORT, ray or ray://HOST:PORT (the same spec pack takes)",
    )


def _task_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options ``_task_flags`` sets, as every per-partition checker takes them."""
    return {"progress": progress_wanted(args), **flag_values(args, "workers", "executor")}


def _remove_flags(p: argparse.ArgumentParser) -> None:
    flags.root(p)
    p.add_argument("--tag", required=True, metavar="NEW")
    p.add_argument("--base", default="latest", metavar="TAG")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--partition", nargs="+", metavar="ID_OR_PATH", help="partitions to drop (id or path)"
    )
    flags.keys_file(what, "file of keys to drop")
    what.add_argument("--where", metavar="SQL", help="drop the samples matching this expression")
    flags.strip_prefix(p)


def _forget_flags(p: argparse.ArgumentParser) -> None:
    flags.root(p)
    p.add_argument(
        "forget_id", nargs="?", metavar="ID", help="with --check: only this forget's receipt"
    )
    what = p.add_mutually_exclusive_group()
    flags.keys_file(what, "file of keys to forget")
    what.add_argument("--where", metavar="SQL", help="forget the samples matching this expression")
    what.add_argument(
        "--check",
        action="store_true",
        help="re-read every object under ROOT and prove no forgotten key or payload is left "
        "(exit 1 naming the objects that hold one)",
    )
    p.add_argument(
        "--reason",
        metavar="TEXT",
        help="why (recorded verbatim in the commit log and the receipt: no personal data)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="list what would be rewritten; change nothing"
    )
    flags.strip_prefix(p)
    _task_flags(p)


def _prune_version_flags(p: argparse.ArgumentParser) -> None:
    flags.root(p)
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


def _gc_flags(p: argparse.ArgumentParser) -> None:
    flags.root(p)
    p.add_argument("--dry-run", action="store_true", help="only list what would be deleted")
    p.add_argument("--grace", default="6h", metavar="DURATION", help="keep younger objects (6h)")
    p.add_argument(
        "--break-lock",
        action="store_true",
        help="only release the lock of a gc that died (publishes wait for it until it expires)",
    )
    p.add_argument("--yes", action="store_true", help="with --break-lock: do not ask")


def _scrub_flags(p: argparse.ArgumentParser) -> None:
    flags.root(p)
    which = p.add_mutually_exclusive_group()
    flags.version(which, default=None)
    which.add_argument("--all", action="store_true", help="every live version")
    _task_flags(p)


def _export_flags(p: argparse.ArgumentParser) -> None:
    flags.root(p)
    p.add_argument("dest", metavar="DEST")
    flags.version(p, None, "default: the version of the one --keyset given, else latest")
    p.add_argument(
        "--keyset", action="append", metavar="NAME", help="keyset(s) to carry (npz: to select)"
    )
    p.add_argument("--format", choices=("root", "npz"), default="root")
    flags.allow_foreign(p, "export")
    flags.storage(p, "dest", "DEST")
    _task_flags(p)


def _verify_flags(p: argparse.ArgumentParser) -> None:
    flags.root(p)
    p.add_argument(
        "--source",
        metavar="SOURCE",
        help="the source tree to compare the version with, bit for bit; without it the "
        "version is checked against its own checksums (what scrub does), as for a version "
        "written from Python or imported, which has no source tree",
    )
    flags.storage(p, "source", "SOURCE")
    flags.version(p)
    p.add_argument(
        "--path-list",
        metavar="FILE",
        help="the source is only these frames (text or JSON list, relative or absolute paths)",
    )
    flags.strip_prefix(p, "absolute --path-list entries start with OLD_ROOT instead of SOURCE")
    flags.include_exclude(
        p, "{verb} source frames whose relative path matches, as pack did (repeatable)"
    )
    p.add_argument("--allow-missing", type=int, default=None, metavar="N", help="exactly N missing")
    p.add_argument("--expected-partitions", type=int, default=None, metavar="N")
    _task_flags(p)


def _verify_offsets_flags(p: argparse.ArgumentParser) -> None:
    flags.root(p)
    flags.version(p)
    _task_flags(p)


def cmd_remove(args: argparse.Namespace) -> int:
    from shardlake import RemoveOptions

    options = build(
        RemoveOptions,
        partitions=args.partition,
        key_file=args.keys_file,
        **flag_values(args, "base", "strip_prefix", "where"),
    )
    report = open_root(args).remove(args.tag, options=options)
    return print_report(args, report.to_json(), report.summary())


def cmd_forget(args: argparse.Namespace) -> int:
    from shardlake import ForgetOptions

    from ..errors import UsageError

    root = open_root(args)
    if args.check:
        check = root.check_forget(args.forget_id)
        return print_report(args, check.to_json(), check.summary(), ok=check.ok)
    if args.forget_id is not None:
        raise UsageError("a forget ID is taken only with --check")
    if args.keys_file is None and args.where is None:
        raise UsageError("forget needs --keys FILE or --where SQL (or --check)")
    options = build(
        ForgetOptions,
        key_file=args.keys_file,
        reason=args.reason or "",
        **flag_values(args, "where", "dry_run", "strip_prefix"),
        **_task_options(args),
    )
    report = root.forget(options=options)
    return print_report(args, report.to_json(), report.summary())


def cmd_prune(args: argparse.Namespace) -> int:
    from ..errors import UsageError

    tags = list(dict.fromkeys([*args.tags, *args.version_tags]))
    if not tags:
        raise UsageError("name the version(s) to prune: TAG or --version TAG")
    report = open_root(args).prune(tags, force=args.force)
    return print_report(args, report.to_json(), lambda: _print_pruned(report))


def _print_pruned(report: PruneReport) -> None:
    print(f"pruned {', '.join(report.pruned)}; latest is now {report.latest or '(none)'}")
    print("run 'shardlake gc' to reclaim their storage")
    for tag, names in report.pinned.items():
        print(
            f"version {tag} is still kept by keyset(s) {', '.join(names)}: gc reclaims it "
            "once they are deleted ('shardlake keyset ROOT delete NAME')"
        )


def cmd_gc(args: argparse.Namespace) -> int:
    if args.break_lock:
        return _break_lock(args)
    # Through the Root the flags opened: its storage options reach every request.
    from shardlake import GcOptions

    options = build(GcOptions, grace_s=args.grace, dry_run=args.dry_run)
    report = open_root(args).gc(options=options)
    return print_report(args, report.to_json(), lambda: _print_gc(args, report))


def _print_gc(args: argparse.Namespace, report: GcReport) -> None:
    from ..progress.bar import human_bytes

    verb = "would delete" if args.dry_run else "deleted"
    for info in report.garbage:
        print(f"{verb} {info.key} ({plural(info.size, 'byte')})")
    for leftover in report.leftovers:
        print(f"{verb} staging leftover {leftover.path}")
    print(
        f"{verb} {plural(len(report.garbage), 'object')} and {len(report.leftovers)} staging "
        f"leftover(s), {human_bytes(report.garbage_bytes)} ({plural(report.garbage_bytes, 'byte')}); "
        f"kept {plural(len(report.young), 'unreferenced object')} and {len(report.young_leftovers)} "
        f"staging leftover(s) younger than {args.grace}; {report.referenced} referenced by "
        f"{plural(len(report.live_versions), 'version')}"
    )
    for lease in report.leases:
        print(f"live {lease.describe()}: its objects are kept")
    if report.leases:
        print(
            f"kept {plural(len(report.leased), 'object')} and {len(report.leased_leftovers)} staging "
            f"leftover(s) of {plural(len(report.leases), 'running writer')} (live leases), at any grace"
        )
    for lease in report.lapsed_leases:
        print(f"{'would remove' if args.dry_run else 'removed'} lapsed {lease.describe()}")
    if report.foreign:
        shown = ", ".join(info.key for info in report.foreign[:5])
        more = ", ..." if len(report.foreign) > 5 else ""
        print(
            f"{plural(len(report.foreign), 'foreign object')} under the root, left alone "
            f"(not written by shardlake): {shown}{more}"
        )


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
    return print_report(
        args,
        {"broken": None if broken is None else broken.to_json()},
        f"broke the gc lock: {'-' if broken is None else broken.describe()}",
    )


def _scrub_options(args: argparse.Namespace, **values: Any) -> Any:
    from shardlake import ScrubOptions

    return build(ScrubOptions, version=args.tag, **values, **_task_options(args))


def cmd_scrub(args: argparse.Namespace) -> int:
    report = open_root(args).scrub(options=_scrub_options(args, all_versions=args.all))
    return print_report(args, report.to_json(), lambda: _print_scrub(report), ok=report.ok)


def _print_scrub(report: ScrubReport) -> None:
    from ..progress.bar import human_bytes

    for part in report.partitions:
        status = "ok" if not part.problems else f"{part.problems} PROBLEM(S)"
        print(
            f"{part.partition}\t{plural(part.samples, 'sample')}\t{human_bytes(part.bytes)}\t{status}"
        )
    for problem in report.problems:
        label = "corrupt" if problem.corrupt_at_rest else "unreadable"
        print(f"{label}: {problem}", file=sys.stderr)
    for text in report.index_problems:
        print(f"index: {text}", file=sys.stderr)
    counts = report.to_json()
    print(
        f"scrubbed {plural(report.samples, 'sample')} ({human_bytes(report.bytes)}) of "
        f"{', '.join(report.versions)}: "
        + (
            "ok"
            if report.ok
            else f"{plural(len(report.problems) + len(report.index_problems), 'problem')}: "
            f"{counts['corrupt_at_rest']} corrupt at rest, {counts['transport_errors']} "
            f"transport error(s)"
            + (f", {len(report.index_problems)} in index.json" if report.index_problems else "")
        )
    )


def cmd_export(args: argparse.Namespace) -> int:
    from shardlake import ExportOptions, ExportReport

    options = build(
        ExportOptions,
        version=args.tag,
        keysets=args.keyset,
        format=args.format,
        allow_foreign=args.allow_foreign,
        **_task_options(args),
    )
    report = open_root(args).export(
        args.dest,
        dest_storage_options=parse_storage_options(args.dest_storage_options) or None,
        options=options,
    )
    if not isinstance(report, ExportReport):
        text = f"wrote {plural(report.samples, 'npz file')} and {report.sidecars} sidecar(s) to {report.dest}"
    else:
        text = (
            f"exported {report.version} ({report.version_hash}) to {report.dest}: copied "
            f"{plural(len(report.copied), 'object')} ({plural(report.bytes_copied, 'byte')}), skipped "
            f"{len(report.skipped)} already present and verified"
            + (f"; keysets {', '.join(report.keysets)}" if report.keysets else "")
        )
    return print_report(args, report.to_json(), text)


# verify's flags that describe a source tree: without --source they cannot apply.
_SOURCE_FLAGS = (
    ("--path-list", "path_list"),
    ("--strip-prefix", "strip_prefix"),
    ("--include", "include"),
    ("--exclude", "exclude"),
    ("--allow-missing", "allow_missing"),
    ("--expected-partitions", "expected_partitions"),
    ("--source-storage-option", "source_storage_options"),
)


def cmd_verify(args: argparse.Namespace) -> int:
    from shardlake import VerifyOptions

    if args.source is None:
        for flag, name in _SOURCE_FLAGS:
            if getattr(args, name, None) not in (None, [], ()):
                raise UsageError(f"{flag} describes the source tree: give --source SOURCE")
        if not args.json:
            print(
                "shardlake verify: no --source: checking the version against its own "
                "checksums (what `shardlake scrub` does); give --source to compare it with "
                "its source tree bit for bit",
                file=sys.stderr,
            )
        scrubbed = open_root(args).scrub(options=_scrub_options(args))
        return print_report(
            args, scrubbed.to_json(), lambda: _print_scrub(scrubbed), ok=scrubbed.ok
        )
    options = build(
        VerifyOptions,
        version=args.tag,
        **flag_values(args, "allow_missing", "expected_partitions", "path_list", "strip_prefix"),
        **flag_values(args, "include", "exclude"),
        **_task_options(args),
    )
    source_options = parse_storage_options(args.source_storage_options)
    report = open_root(args).verify(
        args.source, source_storage_options=source_options, options=options
    )
    return print_report(args, report.to_json(), lambda: _print_verify(report), ok=report.ok)


def _print_verify(report: VerifyReport) -> None:
    out = sys.stdout if report.ok else sys.stderr
    for label, keys in (("missing", report.missing), ("extra", report.extra)):
        for key in keys[:SHOW_MAX]:
            print(f"{label}: {key}", file=out)
    for problem in report.problems[:SHOW_MAX]:
        print(f"differs: {problem}", file=out)
    summary = (
        f"version {report.version}: {plural(report.partitions, 'partition')}, {report.compared} of "
        f"{plural(report.source_samples, 'source sample')} compared bit-exactly, {len(report.missing)} "
        f"missing, {len(report.extra)} extra"
    )
    if report.ok:
        print(f"verify OK - {summary}")
    else:
        print(f"verify FAILED ({'; '.join(report.failures())}) - {summary}")


def cmd_verify_offsets(args: argparse.Namespace) -> int:
    from shardlake import OffsetsOptions

    options = build(OffsetsOptions, version=args.tag, **_task_options(args))
    report = open_root(args).verify_offsets(options=options)
    return print_report(args, report.to_json(), lambda: _print_offsets(report), ok=report.ok)


def _print_offsets(report: OffsetsReport) -> None:
    for problem in report.problems:
        print(f"mismatch: {problem}", file=sys.stderr)
    status = "OK" if report.ok else f"FAILED ({plural(len(report.problems), 'problem')})"
    print(
        f"verify-offsets {status} - version {report.version}: {plural(report.partitions, 'partition')}, "
        f"{plural(report.shards, 'shard')}, {plural(report.rows, 'manifest row')}"
    )


COMMANDS = (
    Command(
        "remove",
        cmd_remove,
        _remove_flags,
        help="publish a new version without some partitions or samples",
        description="Publish TAG: the base version without the given partitions or samples. "
        "Removing samples writes a new manifest revision, never new shards.",
    ),
    Command(
        "forget",
        cmd_forget,
        _forget_flags,
        help="erase samples from every retained version, with a receipt",
        description="Erase the samples --keys or --where select from every retained version "
        "and keyset in one commit: each affected tag gets a redacted successor (same tag, new "
        "hash), only the shards that held them are rewritten, and the superseded objects are "
        "deleted at once. A receipt is stored under receipts/. --check re-reads every object "
        "and proves no forgotten key or payload is left.",
    ),
    Command(
        "prune-version",
        cmd_prune,
        _prune_version_flags,
        help="prune version tags (gc reclaims their bytes)",
    ),
    Command(
        "gc",
        cmd_gc,
        _gc_flags,
        help="delete objects no live version or keyset references",
        description="Delete unreferenced shards, manifests, version documents and staging "
        "leftovers older than the grace period. Only names shardlake writes are candidates: "
        "foreign objects under the root are counted and shown, never deleted. What a running "
        "writer's live lease covers is kept at any grace (--dry-run lists the leases); "
        "publishes wait while gc holds the root.",
    ),
    Command("scrub", cmd_scrub, _scrub_flags, help="re-read every payload and check its checksums"),
    Command(
        "export",
        cmd_export,
        _export_flags,
        help="copy a version to another store (or write it out as npz + json)",
        description="Copy a version's closure to DEST (any store URL), verifying checksums; "
        "DEST becomes a self-contained root whose latest is that version. Re-running resumes. "
        "With --format npz, DEST is a directory that receives <key>.npz and <key>.json.",
    ),
    Command(
        "verify",
        cmd_verify,
        _verify_flags,
        help="prove a version equals its source tree, bit for bit",
    ),
    Command(
        "verify-offsets",
        cmd_verify_offsets,
        _verify_offsets_flags,
        help="check manifest offsets against tar headers and manifests against the version",
    ),
)
