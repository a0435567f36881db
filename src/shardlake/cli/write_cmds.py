"""``import-wds``: a WebDataset tar set into a new version (maps flags to ``Root.import_wds``)."""

from __future__ import annotations

import argparse
from typing import Any

from .common import add_storage_flags, finish_command, open_root, parse_storage_options, print_json
from .pack_cmds import add_recipe_flags

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add this group's subcommands to the ``shardlake`` parser."""
    p = sub.add_parser(
        "import-wds",
        help="import a WebDataset tar set (.npy/.npz/.json/numeric text members) as a version",
    )
    p.add_argument(
        "sources",
        nargs="+",
        metavar="SRC",
        help="tar files, a brace pattern (shards-{000..009}.tar) or a directory of .tar files; "
        "local paths or store URLs",
    )
    p.add_argument("root", metavar="ROOT", help="dataset root URL (path, s3://, gs://, memory://)")
    p.add_argument("--tag", required=True, help="the new version's tag (never reused)")
    p.add_argument(
        "--base", metavar="TAG", help="carry this version's partitions that are not imported"
    )
    p.add_argument("--key-prefix", default="", help="prepended to every sample key")
    p.add_argument(
        "--partition-by",
        choices=("shard", "key"),
        default="shard",
        help="shard: one partition per tar (keys <prefix><tar name>/<key>); key: a key's "
        "parent path (keys <prefix><key>)",
    )
    add_recipe_flags(p)
    p.add_argument("--keep-skipped", action="store_true", help="keep is_skipped samples")
    p.add_argument("--spill-dir", metavar="DIR", help="local directory for the writer's spill")
    p.add_argument(
        "--encode-threads", type=int, default=1, help="threads encoding samples (default 1)"
    )
    p.add_argument(
        "--allow-foreign",
        action="store_true",
        help="publish into a location that already holds other objects (gc leaves them alone)",
    )
    add_storage_flags(p, "source", "the source tars")
    finish_command(p, cmd_import_wds)


def cmd_import_wds(args: argparse.Namespace) -> int:
    from shardlake import WriteOptions

    options = WriteOptions(
        shard_size=args.shard_size,
        level=args.level,
        seed=args.seed,
        keep_skipped=args.keep_skipped,
        spill_dir=args.spill_dir,
        encode_threads=args.encode_threads,
        allow_foreign=args.allow_foreign,
    )
    sources = args.sources[0] if len(args.sources) == 1 else args.sources
    report = open_root(args).import_wds(
        sources,
        args.tag,
        key_prefix=args.key_prefix,
        partition_by=args.partition_by,
        base=args.base,
        options=options,
        storage_options=parse_storage_options(args.source_storage_options) or None,
    )
    if args.json:
        print_json(report.to_json())
    else:
        print(report.summary())
    return 0
