"""Commands that upgrade older roots: catalog (attach a catalog to versions published before
format 2) and index (write the root index an HTTP reader needs)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..progress.bar import plural
from . import flags
from .common import open_root, print_report
from .flags import Command

__all__ = ["COMMANDS"]

_ROOT_HELP = "the dataset root (path or URL)"


def _catalog_flags(p: argparse.ArgumentParser) -> None:
    flags.root(p, help=_ROOT_HELP)
    flags.version(p, None, "only this one")


def _index_flags(p: argparse.ArgumentParser) -> None:
    flags.root(p, help=_ROOT_HELP)


def cmd_catalog(args: argparse.Namespace) -> int:
    root = open_root(args)
    rows = [info.to_json() for info in root.attach_catalogs(args.tag)]
    return print_report(args, rows, lambda: _print_catalogs(rows, root.url))


def _print_catalogs(rows: list[dict[str, Any]], url: str) -> None:
    for row in rows:
        print(
            f"{row['tag']}\t{row['catalog']}\t{plural(row['segments'], 'segment')}\t{plural(row['rows'], 'row')}"
        )
    if not rows:
        print(f"no versions in {url}", file=sys.stderr)


def cmd_index(args: argparse.Namespace) -> int:
    root = open_root(args)
    index = root.write_index()
    return print_report(
        args,
        index,
        f"wrote {root.url}/index.json: commit {index['commit']}, {len(index['versions'])} "
        f"version(s), latest {index['latest']}, {plural(len(index['keysets']), 'keyset')}",
    )


COMMANDS = (
    Command(
        "catalog",
        cmd_catalog,
        _catalog_flags,
        help="write the catalog of versions published before format 2",
        description="Versions published before format 2 list their partitions inline and have "
        "no catalog: readers then read every manifest once per process. This writes a catalog "
        "for each such live version (idempotent; versions that have one are left alone).",
    ),
    Command(
        "index",
        cmd_index,
        _index_flags,
        help="write index.json, which serving the root over HTTP(S) needs",
        description="A static web server cannot list: readers of an http(s):// root find "
        "latest, the tags and the keysets in the root's index.json. Every publish, prune and "
        "keyset change writes it; this writes it for a root published before it existed (or "
        "rewrites a stale one). Run it where the root is stored, not over HTTP.",
    ),
)
