"""The parser side of the CLI: the ``Command`` table entry, ``add_command`` that turns one into a
(sub)parser, and the flags several commands share (one definition each, used as
``flags.version(p)``)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "RECIPE_DESTS",
    "Command",
    "add_command",
    "allow_foreign",
    "include_exclude",
    "json_output",
    "keys_file",
    "max_pad_fraction",
    "non_negative_int",
    "parse_size",
    "positive_int",
    "publish",
    "quiet",
    "recipe",
    "root",
    "selection",
    "storage",
    "strip_prefix",
    "version",
]

Container = argparse._ActionsContainer  # a parser or one of its (mutually exclusive) groups


@dataclass(frozen=True)
class Command:
    """One ``shardlake`` command (or sub-command) as the command groups declare it.

    ``flags`` adds its own arguments; every report command then gets ``--json`` and, where it
    opens a store, ``--storage-option``, last. A command with ``actions`` is a group of
    sub-commands (``keyset ROOT create|list|...``) and runs nothing itself.
    """

    name: str
    run: Callable[[argparse.Namespace], int] | None
    flags: Callable[[argparse.ArgumentParser], None] | None = None
    help: str = ""
    description: str | None = None
    json: bool = True
    storage: bool = True
    actions: tuple[Command, ...] = ()
    action_dest: str = "action"
    action_metavar: str = "ACTION"


def add_command(sub: argparse._SubParsersAction[Any], command: Command) -> None:
    """Add ``command`` (and its sub-commands) to the parser that ``sub`` belongs to."""
    parser = sub.add_parser(command.name, help=command.help, description=command.description)
    if command.flags is not None:
        command.flags(parser)
    if command.actions:
        actions = parser.add_subparsers(dest=command.action_dest, metavar=command.action_metavar)
        actions.required = True
        for action in command.actions:
            add_command(actions, action)
        return
    if command.json:
        json_output(parser)
    if command.storage:
        storage(parser)
    parser.set_defaults(func=command.run)


# --- argument types -----------------------------------------------------------------------------


def _int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``low`` (argparse names the flag, exit 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    parse.__name__ = "int"  # argparse's "invalid int value" wording for a non-number
    return parse


positive_int = _int_at_least(1)
non_negative_int = _int_at_least(0)

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str) -> int:
    """``1GiB``, ``512MB``, ``64k`` or plain bytes -> bytes."""
    match = _SIZE_RE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (e.g. 1GiB, 256MB, 65536)")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    binary = "i" in unit
    letter = unit[:1] if unit[:1] in "kmgt" else ""
    factor = 1024 ** "kmgt".index(letter) * 1024 if binary and letter else _UNITS[letter]
    value = int(number * factor)
    if value < 1:
        raise argparse.ArgumentTypeError(f"size {text!r} must be at least 1 byte")
    return value


# --- shared flags -------------------------------------------------------------------------------


def root(parser: argparse.ArgumentParser, metavar: str = "ROOT", help: str | None = None) -> None:
    """The positional store root (or URL) a command works on."""
    parser.add_argument("root", metavar=metavar, help=help)


def version(parser: Container, default: str | None = "latest", help: str | None = None) -> None:
    """``--version TAG`` (stored as ``tag``): the version a command reads."""
    parser.add_argument("--version", dest="tag", default=default, metavar="TAG", help=help)


def json_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def storage(parser: argparse.ArgumentParser, prefix: str = "", what: str = "the root") -> None:
    """``--storage-option KEY=VALUE`` (repeatable) for what a command opens; with ``prefix``
    (``dest``) the flag is ``--dest-storage-option`` for that other store."""
    flag = f"--{prefix}-storage-option" if prefix else "--storage-option"
    parser.add_argument(
        flag,
        dest=f"{prefix}_storage_options" if prefix else "storage_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"fsspec storage option for {what} (repeatable; VALUE is parsed as JSON when it "
        "parses, else taken as a string); fsspec config files and FSSPEC_<PROTOCOL>_<OPTION> "
        "environment variables apply too",
    )


def keys_file(parser: Container, help: str) -> None:
    """``--keys FILE`` (stored as ``keys_file``): a file of sample keys."""
    parser.add_argument("--keys", dest="keys_file", metavar="FILE", help=help)


def strip_prefix(
    parser: argparse.ArgumentParser, help: str = "map absolute npz paths to keys"
) -> None:
    parser.add_argument("--strip-prefix", metavar="OLD_ROOT", help=help)


def include_exclude(parser: argparse.ArgumentParser, help: str) -> None:
    """``--include`` / ``--exclude GLOB`` (repeatable); ``help`` has a ``{verb}`` to fill."""
    for flag, verb in (("--include", "consider only"), ("--exclude", "leave out")):
        parser.add_argument(
            flag, action="append", default=[], metavar="GLOB", help=help.format(verb=verb)
        )


def allow_foreign(parser: argparse.ArgumentParser, verb: str = "publish") -> None:
    parser.add_argument(
        "--allow-foreign",
        action="store_true",
        help=f"{verb} into a location that already holds other objects (gc leaves them alone)",
    )


def quiet(parser: argparse.ArgumentParser, help: str = "no progress on stderr") -> None:
    """``--quiet``: no progress output (``common.progress_wanted`` reads it)."""
    parser.add_argument("--quiet", action="store_true", help=help)


def publish(parser: argparse.ArgumentParser, base_help: str) -> None:
    """``ROOT``, ``--tag`` and ``--base``: where a new version goes (pack and import-wds)."""
    root(parser, help="dataset root URL (path, s3://, gs://, memory://)")
    parser.add_argument("--tag", required=True, help="the new version's tag (never reused)")
    parser.add_argument("--base", metavar="TAG", help=base_help)


def recipe(parser: argparse.ArgumentParser) -> None:
    """``--shard-size``, ``--level``, ``--seed``: how shards are built (pack and import-wds)."""
    parser.add_argument("--shard-size", type=parse_size, help="target shard size (default 1GiB)")
    parser.add_argument("--level", type=int, help="zstd level (default 3)")
    parser.add_argument("--seed", type=int, help="sample-order shuffle seed (default 0)")


RECIPE_DESTS = ("shard_size", "level", "seed")  # what ``recipe`` sets, as the options name it


def selection(parser: argparse.ArgumentParser) -> None:
    """``--version`` and one of ``--keyset`` / ``--where``: the loader commands' selection."""
    parser.add_argument(
        "--version", default=None, help="version tag (default: the keyset's version, or latest)"
    )
    sel = parser.add_mutually_exclusive_group()
    sel.add_argument("--keyset", metavar="NAME", help="select by keyset")
    sel.add_argument("--where", metavar="SQL", help="select by a WHERE over manifest columns")


def max_pad_fraction(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-pad-fraction",
        type=float,
        default=None,
        help="share of the epoch replayed to fill whole batches above which the loader warns "
        "(loader default 0.1)",
    )
