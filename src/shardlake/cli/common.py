"""Helpers shared by the command groups: store options, JSON output, local paths."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


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
