"""Commands: check-store."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from shardlake import check_store

from . import flags
from .common import parse_storage_options, print_report
from .flags import Command

if TYPE_CHECKING:
    from shardlake import StoreReport

__all__ = ["COMMANDS"]


def _check_store_flags(p: argparse.ArgumentParser) -> None:
    flags.root(p, "URL")
    p.add_argument(
        "--create-bucket",
        action="store_true",
        help="create the bucket (Azure: container) URL names first, where it does not exist "
        "(S3, GCS, Azure; the filesystem's defaults, e.g. region, come from the environment "
        "or --storage-option)",
    )


def cmd_check_store(args: argparse.Namespace) -> int:
    report = check_store(
        args.root,
        create_bucket=args.create_bucket,
        **parse_storage_options(args.storage_options),
    )
    return print_report(args, report.to_json(), lambda: _print_checks(report), ok=report.safe)


def _print_checks(report: StoreReport) -> None:
    width = max(len(c.name) for c in report.checks)
    if report.bucket_created:
        print(f"{report.url}: created its bucket")
    print(f"{report.url}: {'safe' if report.safe else 'NOT safe'}")
    for c in report.checks:
        print(f"  {c.name:<{width}}  {'ok  ' if c.ok else 'FAIL'}  {c.detail}")
    if not report.safe:
        print(f"failed: {', '.join(report.failed())}")


COMMANDS = (
    Command(
        "check-store",
        cmd_check_store,
        _check_store_flags,
        help="check that an object store keeps the promises shardlake needs",
        description="Run named checks against URL (create-if-absent, a race of concurrent "
        "creates, read-after-write, ranged reads, list-after-write, delete) and measure "
        "small-object latency and large-object throughput. Everything is written under "
        "_shardlake/check/<uuid>/ and deleted afterwards. Exit 0 when safe, 1 when not.",
    ),
)
