"""Command: catalog (attach a catalog to versions published before format 2)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import add_json_flag, add_storage_flags, open_root, print_json


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
    add_json_flag(p)
    add_storage_flags(p)
    p.set_defaults(func=cmd_catalog)


def cmd_catalog(args: argparse.Namespace) -> int:
    from ..catalog import attach_catalog
    from ..versions import load_version, load_version_by_hash, read_state

    store = open_root(args).store
    if args.tag is not None:
        versions = [load_version(store, args.tag)]
    else:
        state = read_state(store)
        versions = [load_version_by_hash(store, t, h) for t, h in state.versions.items()]
    rows = []
    for version in versions:
        native = version.header.catalog is not None
        ref = attach_catalog(store, version)
        rows.append(
            {
                "tag": version.tag,
                "hash": version.hash,
                "catalog": "in record" if native else "attached",
                "segments": len(ref.segments),
                "rows": sum(s.rows for s in ref.segments),
            }
        )
    if args.json:
        print_json(rows)
        return 0
    for row in rows:
        print(f"{row['tag']}\t{row['catalog']}\t{row['segments']} segment(s)\t{row['rows']} rows")
    if not rows:
        print(f"no versions in {store.url}", file=sys.stderr)
    return 0
