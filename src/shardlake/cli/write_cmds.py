"""``import-wds``: a WebDataset tar set into a new version (maps flags to ``Root.import_wds``)."""

from __future__ import annotations

import argparse

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

__all__ = ["COMMANDS"]


def _import_wds_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "sources",
        nargs="+",
        metavar="SRC",
        help="tar files, a brace pattern (shards-{000..009}.tar) or a directory of .tar files; "
        "local paths or store URLs",
    )
    flags.publish(p, "carry this version's partitions that are not imported")
    p.add_argument("--key-prefix", default="", help="prepended to every sample key")
    p.add_argument(
        "--partition-by",
        choices=("shard", "key"),
        default="shard",
        help="shard: one partition per tar (keys <prefix><tar name>/<key>); key: a key's "
        "parent path (keys <prefix><key>)",
    )
    p.add_argument(
        "--skip-undecoded",
        action="store_true",
        help="leave out members that are not .npy, .npz, .json or numeric text (images, audio, "
        "captions); by default they are kept bit-exact as uint8 byte arrays named by their field",
    )
    flags.recipe(p)
    p.add_argument("--keep-skipped", action="store_true", help="keep is_skipped samples")
    p.add_argument("--spill-dir", metavar="DIR", help="local directory for the writer's spill")
    p.add_argument(
        "--encode-threads", type=int, default=1, help="threads encoding samples (default 1)"
    )
    flags.allow_foreign(p)
    flags.quiet(p)
    flags.storage(p, "source", "the source tars")


def cmd_import_wds(args: argparse.Namespace) -> int:
    from shardlake import WriteOptions

    names = ("keep_skipped", "spill_dir", "encode_threads", "allow_foreign")
    options = build(WriteOptions, **flag_values(args, *flags.RECIPE_DESTS, *names))
    sources = args.sources[0] if len(args.sources) == 1 else args.sources
    report = open_root(args).import_wds(
        sources,
        args.tag,
        **flag_values(args, "key_prefix", "partition_by", "base", "skip_undecoded"),
        options=options,
        source_storage_options=parse_storage_options(args.source_storage_options) or None,
        progress=progress_wanted(args),
    )
    return print_report(args, report.to_json(), report.summary())


COMMANDS = (
    Command(
        "import-wds",
        cmd_import_wds,
        _import_wds_flags,
        help="import a WebDataset tar set (.npy/.npz/.json/numeric text members; others as bytes) "
        "as a version",
    ),
)
