"""What the command line says on Ctrl-C (shared by the console script and ``main``)."""

from __future__ import annotations

__all__ = ["INTERRUPTED_EXIT", "INTERRUPTED_TEXT"]

INTERRUPTED_EXIT = 130  # 128 + SIGINT
INTERRUPTED_TEXT = "interrupted; nothing was published"
