"""Command: catalog (attach a catalog to versions published before format 2)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import finish_command, open_root, print_json


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add this group's subcommands to the ``shardlake`` parser."""
    p = sub.add_parser(
        "catalog",
        help="write the catalog of versions published before format 2",
        description="Versions published before format 2 list their partitions inline and have "
        "no catalog: readers then read every manifest once per process. This writes a catalog "
        "for each such live version (idempotent; versions that have one are left alone).",
    )
    p.add_argument("root", metavar="ROOT", help="the dataset root (path or URL)")
    p.add_argument("--version", dest="tag", default=None, metavar="TAG", help="only this one")
    finish_command(p, cmd_catalog)


def cmd_catalog(args: argparse.Namespace) -> int:
    root = open_root(args)
    rows = [info.to_json() for info in root.attach_catalogs(args.tag)]
    if args.json:
        print_json(rows)
        return 0
    for row in rows:
        print(f"{row['tag']}\t{row['catalog']}\t{row['segments']} segment(s)\t{row['rows']} rows")
    if not rows:
        print(f"no versions in {root.url}", file=sys.stderr)
    return 0
