"""``shardlake`` entry point: builds the parser from the command groups and maps errors to exits.

Exit codes: 0 ok, 1 error (one line on stderr, never a traceback), 2 usage, 130 interrupted.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Sequence
from typing import Any

from .. import __version__
from ..errors import ShardlakeError, UsageError
from . import (
    catalog_cmds,
    dataset_cmds,
    lifecycle_cmds,
    pack_cmds,
    run_cmds,
    store_cmds,
    write_cmds,
)
from .common import flag_advice, resolve_local_paths

COMMAND_GROUPS = (
    pack_cmds,
    write_cmds,
    dataset_cmds,
    lifecycle_cmds,
    run_cmds,
    catalog_cmds,
    store_cmds,
)


class _Parser(argparse.ArgumentParser):
    """No flag prefixes (``--wher`` must not mean ``--where``); subparsers inherit the class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
    args, extras = parser.parse_known_args(argv)
    if extras:
        _reject_unknown(parser, args, extras)
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


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    """The innermost (sub)command parser that ``args`` went through."""
    current = parser
    while True:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return current
        chosen = getattr(args, subs[0].dest, None)
        if chosen not in subs[0].choices:
            return current
        current = subs[0].choices[chosen]


def _reject_unknown(
    parser: argparse.ArgumentParser, args: argparse.Namespace, extras: list[str]
) -> None:
    """Usage error (exit 2) for unknown arguments, suggesting the nearest flag of the command."""
    command = _command_parser(parser, args)
    known = sorted(o for a in command._actions for o in a.option_strings if o.startswith("--"))
    parts = []
    for extra in extras:
        flag = extra.split("=", 1)[0]
        close = (
            difflib.get_close_matches(flag, known, n=1, cutoff=0.6) if flag.startswith("-") else []
        )
        parts.append(f"{extra} (did you mean `{close[0]}`?)" if close else extra)
    command.error("unrecognized arguments: " + " ".join(parts))


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
