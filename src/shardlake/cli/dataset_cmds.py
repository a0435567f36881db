"""Commands: query, get, keyset."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: "argparse._SubParsersAction[Any]") -> None:
    """Add this group's subcommands to the ``shardlake`` parser."""
