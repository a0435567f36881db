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
from . import catalog_cmds, dataset_cmds, lifecycle_cmds, pack_cmds, run_cmds, store_cmds
from .common import flag_advice, resolve_local_paths

COMMAND_GROUPS = (pack_cmds, dataset_cmds, lifecycle_cmds, run_cmds, catalog_cmds, store_cmds)


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
    except ShardlakeError as exc:
        print(f"shardlake {args.command}: error: {_with_advice(exc, parser)}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1
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


def _option_flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every ``--flag`` of the parser and its subcommands."""
    flags: set[str] = set()
    for action in parser._actions:
        flags.update(o for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                flags |= _option_flags(child)
    return flags


def _with_advice(exc: ShardlakeError, parser: argparse.ArgumentParser) -> str:
    """The error's message, plus the flags that set the options it names (library terms)."""
    known = _option_flags(parser)
    flags = [f for f in flag_advice(exc.options).split(", ") if f in known]
    return f"{exc} (see {', '.join(flags)})" if flags else str(exc)


if __name__ == "__main__":
    sys.exit(main())
