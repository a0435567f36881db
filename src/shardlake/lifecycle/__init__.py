"""Lifecycle operations on a dataset root: remove, prune, gc, scrub, export, verify.

Every writer here publishes through the commit log (:mod:`shardlake.meta.commits`): it reads the
root state before working and commits with create-if-absent, so two lifecycle writers racing on
one root end with one winner and a :class:`~shardlake.errors.ConflictError` for the other.
"""

from .export import ExportOptions, ExportReport, export
from .gc import GcOptions, GcReport, collect_garbage
from .prune import PruneReport, prune
from .remove import remove
from .scrub import ScrubReport, scrub
from .verify import VerifyReport, verify_offsets, verify_version

__all__ = [
    "ExportOptions",
    "ExportReport",
    "GcOptions",
    "GcReport",
    "PruneReport",
    "ScrubReport",
    "VerifyReport",
    "collect_garbage",
    "export",
    "prune",
    "remove",
    "scrub",
    "verify_offsets",
    "verify_version",
]
