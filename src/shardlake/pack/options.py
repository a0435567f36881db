"""``PackOptions``: every setting of a pack besides source, root, tag and base."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from ..executors.options import RunOptions
from ..executors.tasks import ExecutorSpec as ExecutorSpec
from ..options import options_class
from ..progress.bar import DEFAULT_HEARTBEAT_S

__all__ = [
    "ExecutorSpec",
    "PackOptions",
]


@options_class
@dataclass(frozen=True)
class PackOptions(RunOptions):
    """How to pack: partitioning, scope, recipe, skip policy and execution.

    Parameters
    ----------
    workers, executor, progress
        How it runs (:class:`~shardlake.RunOptions`: one build per partition; by default the CPU
        count of processes; ``"ray"`` is this process's Ray instance, else a local one).
    mp_context
        Multiprocessing start method for ``"process"`` (default ``forkserver`` where available).
    partition_depth, partition_regex
        The partition rule: the first ``depth`` directories of a frame's path, or the first
        match of a regular expression. Default: the base version's rule, else depth 1.
    path_list
        Pack only these frames: a path-list file (text or JSON) or a sequence of paths.
    strip_prefix
        Prefix removed from absolute entries of ``path_list``.
    partitions
        Pack only these partition paths.
    include, exclude
        Glob patterns (relative paths) of files to consider / ignore during discovery.
    strict
        Refuse files that are neither frames nor frame sidecars instead of ignoring them.
    shard_size, level, seed
        The recipe: target shard bytes, zstd level, in-partition shuffle seed (default: the
        base version's recipe).
    keep_skipped
        Pack frames whose sidecar says ``is_skipped`` (dropped by default).
    require_sidecars
        Refuse frames without a sidecar.
    replace_all
        Rebuild every partition even where the base could be reused.
    source_namespace
        The identity of the source for incremental packs (default: its absolute path).
    allow_foreign
        Publish the first version into a location that already holds objects shardlake did not
        write (refused by default; gc leaves such objects alone either way).
    heartbeat_s
        With ``progress``: seconds without progress before a heartbeat line.
    poll_s
        How often the pack checks on its partition builds (seconds).
    """

    mp_context: str | None = None
    partition_depth: int | None = None
    partition_regex: str | None = None
    path_list: str | os.PathLike[str] | Sequence[str] | None = None
    strip_prefix: str | None = None
    partitions: Sequence[str] | None = None
    include: Sequence[str] = ()
    exclude: Sequence[str] = ()
    strict: bool = False
    shard_size: int | None = None
    level: int | None = None
    seed: int | None = None
    keep_skipped: bool = False
    require_sidecars: bool = False
    replace_all: bool = False
    source_namespace: str | None = None
    allow_foreign: bool = False
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    poll_s: float = 1.0
