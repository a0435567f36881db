"""``shardlake`` entry point: builds the parser from the command groups and maps errors to exits.

Exit codes: 0 ok, 1 error (one line on stderr, never a traceback), 2 usage, 130 interrupted,
141 output closed early (``shardlake inspect ... | head``): like coreutils, which die of
SIGPIPE (128 + 13), nothing is printed. With ``--json`` an error is also printed on stdout as
``{"error": {"type": ..., "message": ...}}``.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import re
import select
import shlex
import sys
import warnings
from collections.abc import Callable, Sequence
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
from .flags import add_command
from .interrupt import INTERRUPTED_EXIT, INTERRUPTED_TEXT

__all__ = [
    "build_parser",
    "main",
]

COMMAND_GROUPS = (
    pack_cmds,
    write_cmds,
    dataset_cmds,
    lifecycle_cmds,
    run_cmds,
    catalog_cmds,
    store_cmds,
)


CLOSED_PIPE_EXIT = 141  # 128 + SIGPIPE, what a shell reports for `seq 1000000 | head -1`


class _Parser(argparse.ArgumentParser):
    """No flag prefixes (``--wher`` must not mean ``--where``); subparsers inherit the class."""

    json_errors = False  # set by main() for a command line with --json

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:
        if _Parser.json_errors:
            _print_error_json("UsageError", message)
        return super().error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="shardlake",
        description="Versioned, verifiable, cloud-portable shard datasets.",
    )
    parser.add_argument("--version", action="version", version=f"shardlake {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for group in COMMAND_GROUPS:
        for command in group.COMMANDS:
            add_command(sub, command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        _Parser.json_errors = "--json" in argv
        args, extras = parser.parse_known_args(argv)
    except KeyboardInterrupt:
        print(f"{' '.join(['shardlake', *argv[:1]])}: {INTERRUPTED_TEXT}", file=sys.stderr)
        return INTERRUPTED_EXIT
    if extras:
        _reject_unknown(parser, args, extras)
    resolve_local_paths(args)

    def fail(kind: str, text: str, code: int, line: str = "") -> int:
        print(f"shardlake {args.command}: {line or 'error: ' + text}", file=sys.stderr)
        if getattr(args, "json", False):
            _print_error_json(kind, text)
        return code

    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning(args.command)
            code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
    except BrokenPipeError as exc:
        if _output_closed():
            _silence_stdout()
            return CLOSED_PIPE_EXIT
        if os.environ.get("SHARDLAKE_DEBUG"):
            raise
        return fail(type(exc).__name__, f"{type(exc).__name__}: {exc}", 1)  # some socket's
    except ShardlakeError as exc:
        text = _with_advice(exc, parser, args)
        return fail(type(exc).__name__, text, 2 if isinstance(exc, UsageError) else 1)
    except KeyboardInterrupt:
        return fail("KeyboardInterrupt", INTERRUPTED_TEXT, INTERRUPTED_EXIT, INTERRUPTED_TEXT)
    except (OSError, ValueError) as exc:
        if os.environ.get("SHARDLAKE_DEBUG"):
            raise
        return fail(type(exc).__name__, f"{type(exc).__name__}: {exc}", 1)
    except Exception as exc:  # noqa: BLE001 - the CLI never shows a raw traceback
        if os.environ.get("SHARDLAKE_DEBUG"):
            raise
        text = f"{type(exc).__name__}: {exc} (set SHARDLAKE_DEBUG=1 for a traceback)"
        return fail(type(exc).__name__, text, 1, f"internal error: {text}")
    return int(code or 0)


def _one_line_warning(command: str) -> Callable[..., None]:
    """A warning as one line on stderr (``shardlake get: warning: ...``), not Python's
    ``file.py:LINE: Category: ...`` followed by a line of the library's source."""

    def show(message: Warning | str, *_args: Any, **_kwargs: Any) -> None:
        with contextlib.suppress(OSError, ValueError):
            print(f"shardlake {command}: warning: {message}", file=sys.stderr)

    return show


def _print_error_json(kind: str, message: str) -> None:
    """The failure on stdout too, for a caller that parses ``--json`` output."""
    try:
        json.dump({"error": {"type": kind, "message": message}}, sys.stdout, sort_keys=True)
        sys.stdout.write("\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        pass  # stdout is gone: stderr has it


def _output_closed() -> bool:
    """True when stdout or stderr is a pipe whose reader has gone (not some socket's EPIPE)."""
    if not hasattr(select, "poll"):
        return True
    poller = select.poll()
    for stream in (sys.stdout, sys.stderr):
        try:
            poller.register(stream.fileno(), select.POLLOUT)
        except (AttributeError, OSError, ValueError):
            continue  # not a file (captured in tests)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush meets no closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass


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


def _with_advice(
    exc: ShardlakeError, parser: argparse.ArgumentParser, args: argparse.Namespace
) -> str:
    """The error's message, plus the flags that set the options it names (library terms) and
    the command its hint names, with ``ROOT`` the root of this command line."""
    known = _option_flags(parser)
    flags = [f for f in flag_advice(exc.options).split(", ") if f in known]
    text = f"{exc} (see {', '.join(flags)})" if flags else str(exc)
    hint = getattr(exc, "hint", "")
    if hint:
        root = getattr(args, "root", None)
        if isinstance(root, str) and root:
            hint = re.sub(r"\bROOT\b", lambda _: shlex.quote(root), hint)
        text += f" ({hint})"
    return text


if __name__ == "__main__":
    sys.exit(main())  # `python -m shardlake.cli` also covers Ctrl-C during the imports
