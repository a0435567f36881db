"""What the commands share when they run: store options, opening the root, reports (text or
``--json``), local paths, flag advice. The parser side is in ``flags``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import UsageError
from ..options import build_options

if TYPE_CHECKING:
    from shardlake import Root

__all__ = [
    "build",
    "flag_advice",
    "flag_values",
    "open_root",
    "parse_storage_options",
    "print_json",
    "print_report",
    "progress_wanted",
    "resolve_local_paths",
]


_O = TypeVar("_O")


def build(cls: type[_O], **values: Any) -> _O:
    """The options object of a command, from its flags (every command builds one and hands it
    to its ``Root`` method): an unset flag (None) means the field's default, as a ``None``
    keyword does for the ``Root`` methods (:func:`shardlake.options.build_options`)."""
    return build_options(cls, None, values, cls.__name__)


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def print_report(
    args: argparse.Namespace, doc: Any, text: str | Callable[[], object], *, ok: bool = True
) -> int:
    """How every report command ends: ``doc`` as JSON with ``--json``, else ``text`` (a line,
    or a function that prints the lines); exit 0, or 1 when the report is not ``ok``."""
    if args.json:
        print_json(doc)
    elif callable(text):
        text()
    else:
        print(text)
    return 0 if ok else 1


def flag_values(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The flags whose dest is the library's option name, as keywords for that option."""
    return {name: getattr(args, name) for name in names}


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
    target = url if url is not None else args.root
    if isinstance(target, str) and not target.strip():
        raise UsageError(f"ROOT is empty ({target!r}): give a path or a URL, never ''")
    return shardlake.open(target, **parse_storage_options(pairs))


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
