"""The ``shardlake`` command line; one module per command group.

:func:`run` is the console script: it takes Ctrl-C from its first moment, before the command
modules (and fsspec, pyarrow, ...) are imported, so an early Ctrl-C gives exit 130 and one line
like a late one, not an import traceback.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import NoReturn

from .interrupt import INTERRUPTED_EXIT, INTERRUPTED_TEXT

__all__ = ["run"]


def run() -> NoReturn:
    """``shardlake ...``: :func:`shardlake.cli.main.main` with Ctrl-C covered from the start."""
    seen: list[int] = []
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, lambda signum, _frame: seen.append(signum))
    # The slow part, a Ctrl-C meanwhile only noted: the command modules and what nearly every
    # command imports on first use (an import stopped inside a native module can abort).
    from .. import PackReport, root  # noqa: F401 - PackReport: the public name loads pack
    from .main import main

    if previous is not None:
        signal.signal(signal.SIGINT, previous)
    if seen:
        words = ["shardlake", *sys.argv[1:2]]  # the command, as main() names it
        print(f"{' '.join(words)}: {INTERRUPTED_TEXT}", file=sys.stderr)
        sys.exit(INTERRUPTED_EXIT)
    sys.exit(main())
