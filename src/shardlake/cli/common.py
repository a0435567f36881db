"""Helpers shared by the command groups: store options, JSON output, local paths."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import UsageError

if TYPE_CHECKING:
    from shardlake import Root

__all__ = [
    "add_max_pad_flag",
    "add_selection_flags",
    "add_storage_flags",
    "finish_command",
    "flag_advice",
    "non_negative_int",
    "open_root",
    "parse_storage_options",
    "positive_int",
    "print_json",
    "progress_wanted",
    "resolve_local_paths",
]


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


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def add_selection_flags(parser: argparse.ArgumentParser) -> None:
    """``--version`` and one of ``--keyset`` / ``--where``: the loader commands' selection."""
    parser.add_argument(
        "--version", default=None, help="version tag (default: the keyset's version, or latest)"
    )
    sel = parser.add_mutually_exclusive_group()
    sel.add_argument("--keyset", metavar="NAME", help="select by keyset")
    sel.add_argument("--where", metavar="SQL", help="select by a WHERE over manifest columns")


def add_max_pad_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-pad-fraction",
        type=float,
        default=None,
        help="share of the epoch the plan may replay to fill whole batches (loader default 0.1)",
    )


def finish_command(
    parser: argparse.ArgumentParser,
    func: Callable[[argparse.Namespace], int],
    *,
    opens_root: bool = True,
) -> None:
    """What every report command shares: ``--json``, ``--storage-option`` where it opens a
    root, and the function that runs it."""
    add_json_flag(parser)
    if opens_root:
        add_storage_flags(parser)
    parser.set_defaults(func=func)


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


# Arguments that name a local file, directory or store root. A relative value is resolved
# against the working directory here, at the boundary, so that messages show the resolved path
# and whatever is persisted or handed to worker processes is absolute.
LOCAL_PATH_ARGS = (
    "source",
    "root",
    "dest",
    "path_list",
    "keys_file",
    "out",
    "out_dir",
    "workdir",
    "baseline",
    "candidate",
)


def resolve_local_paths(args: argparse.Namespace) -> None:
    """Make every local path argument of ``args`` absolute (URLs and ``-`` stay as given)."""
    for name in LOCAL_PATH_ARGS:
        value = getattr(args, name, None)
        if isinstance(value, str) and value.strip() and value != "-" and "://" not in value:
            setattr(args, name, os.path.abspath(os.path.expanduser(value)))


def add_storage_flags(
    parser: argparse.ArgumentParser, prefix: str = "", what: str = "the root"
) -> None:
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


def parse_storage_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``["key=v", "anon=true"]`` -> ``{"key": "v", "anon": True}`` (JSON values where valid)."""
    options: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name.strip():
            raise UsageError(
                f"storage option {pair!r} is not KEY=VALUE", options=("storage_option",)
            )
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        options[name.strip()] = value
    return options


def open_root(args: argparse.Namespace, url: str | None = None) -> Root:
    """The root a command works on, opened with the command's storage options."""
    import shardlake

    pairs = getattr(args, "storage_options", None) or []
    return shardlake.open(url if url is not None else args.root, **parse_storage_options(pairs))


# Library option names whose flag is spelled otherwise.
_FLAG_NAMES = {
    "key_file": "keys",
    "partitions": "partition",
    "grace_s": "grace",
    "format": "format",
}


def flag_advice(options: Sequence[str]) -> str:
    """Library option names as the flags that set them: ``shard_size`` -> ``--shard-size``."""
    names = [_FLAG_NAMES.get(name, name) for name in options]
    return ", ".join(dict.fromkeys("--" + name.replace("_", "-") for name in names))


def progress_wanted(args: argparse.Namespace) -> bool:
    """Progress on stderr unless ``--quiet`` or ``--json`` (a bar on a terminal, lines in a log)."""
    return not (getattr(args, "quiet", False) or getattr(args, "json", False))
