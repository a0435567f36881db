"""Commands that upgrade older roots: catalog (attach a catalog to versions published before
format 2) and index (write the root index an HTTP reader needs)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import finish_command, open_root, print_json

__all__ = ["register"]


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
    p = sub.add_parser(
        "index",
        help="write index.json, which serving the root over HTTP(S) needs",
        description="A static web server cannot list: readers of an http(s):// root find "
        "latest, the tags and the keysets in the root's index.json. Every publish, prune and "
        "keyset change writes it; this writes it for a root published before it existed (or "
        "rewrites a stale one). Run it where the root is stored, not over HTTP.",
    )
    p.add_argument("root", metavar="ROOT", help="the dataset root (path or URL)")
    finish_command(p, cmd_index)


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


def cmd_index(args: argparse.Namespace) -> int:
    root = open_root(args)
    index = root.write_index()
    if args.json:
        print_json(index)
        return 0
    print(
        f"wrote {root.url}/index.json: commit {index['commit']}, {len(index['versions'])} "
        f"version(s), latest {index['latest']}, {len(index['keysets'])} keyset(s)"
    )
    return 0
