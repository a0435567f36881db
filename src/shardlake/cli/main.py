"""``shardlake`` entry point: builds the parser from the command groups and maps errors to exits.

Exit codes: 0 ok, 1 error (one line on stderr, never a traceback), 2 usage, 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .. import __version__
from ..errors import ShardlakeError, UsageError
from . import catalog_cmds, dataset_cmds, lifecycle_cmds, pack_cmds, run_cmds
from .common import resolve_local_paths

COMMAND_GROUPS = (pack_cmds, dataset_cmds, lifecycle_cmds, run_cmds, catalog_cmds)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardlake",
        description="Versioned, verifiable, cloud-portable shard datasets.",
    )
    parser.add_argument("--version", action="version", version=f"shardlake {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for group in COMMAND_GROUPS:
        group.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    resolve_local_paths(args)
    try:
        code = args.func(args)
    except UsageError as exc:
        print(f"shardlake {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ShardlakeError as exc:
        print(f"shardlake {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"shardlake {args.command}: interrupted; nothing was published", file=sys.stderr)
        return 130
    except (OSError, ValueError) as exc:
        if os.environ.get("SHARDLAKE_DEBUG"):
            raise
        print(f"shardlake {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - the CLI never shows a raw traceback
        if os.environ.get("SHARDLAKE_DEBUG"):
            raise
        print(
            f"shardlake {args.command}: internal error: {type(exc).__name__}: {exc} "
            "(set SHARDLAKE_DEBUG=1 for a traceback)",
            file=sys.stderr,
        )
        return 1
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
