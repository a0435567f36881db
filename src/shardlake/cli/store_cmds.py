"""Commands: check-store."""

from __future__ import annotations

import argparse
from typing import Any

from shardlake import check_store

from .common import finish_command, parse_storage_options, print_json

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add this group's subcommands to the ``shardlake`` parser."""
    p = sub.add_parser(
        "check-store",
        help="check that an object store keeps the promises shardlake needs",
        description="Run named checks against URL (create-if-absent, a race of concurrent "
        "creates, read-after-write, ranged reads, list-after-write, delete) and measure "
        "small-object latency and large-object throughput. Everything is written under "
        "_shardlake/check/<uuid>/ and deleted afterwards. Exit 0 when safe, 1 when not.",
    )
    p.add_argument("root", metavar="URL")
    p.add_argument(
        "--create-bucket",
        action="store_true",
        help="create the bucket (Azure: container) URL names first, where it does not exist "
        "(S3, GCS, Azure; the filesystem's defaults, e.g. region, come from the environment "
        "or --storage-option)",
    )
    finish_command(p, cmd_check_store)


def cmd_check_store(args: argparse.Namespace) -> int:
    report = check_store(
        args.root,
        create_bucket=args.create_bucket,
        **parse_storage_options(args.storage_options),
    )
    if args.json:
        print_json(report.to_json())
    else:
        width = max(len(c.name) for c in report.checks)
        if report.bucket_created:
            print(f"{report.url}: created its bucket")
        print(f"{report.url}: {'safe' if report.safe else 'NOT safe'}")
        for c in report.checks:
            print(f"  {c.name:<{width}}  {'ok  ' if c.ok else 'FAIL'}  {c.detail}")
        if not report.safe:
            print(f"failed: {', '.join(report.failed())}")
    return 0 if report.safe else 1
