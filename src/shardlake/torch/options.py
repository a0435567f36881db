"""The loader's settings as one object: :class:`LoaderOptions` (keywords of ``ShardDataset``)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError, build_options, options_class
from ..read.options import ReadOptions
from .plan import DEFAULT_MAX_PAD_FRACTION, DEFAULT_SHUFFLE_BUFFER

__all__ = [
    "ENGINES",
    "LoaderOptions",
    "check_engine",
]

ENGINES = ("threads", "processes")
DEFAULT_ENGINE = "threads"  # measured faster on this project's machines (docs/loader.md)
ENGINE_ENV = "SHARDLAKE_LOADER_ENGINE"  # the default engine of this process and its children


def check_engine(engine: str, name: str) -> str:
    if engine not in ENGINES:
        raise UsageError(f"{name}={engine!r}: choose one of {', '.join(repr(e) for e in ENGINES)}")
    return engine


@options_class
@dataclass(frozen=True)
class LoaderOptions:
    """Every setting of a :class:`~shardlake.torch.ShardDataset` besides what to read.

    ``ShardDataset(url, batch_size=32, options=LoaderOptions(seed=1))`` and
    ``ShardDataset(url, batch_size=32, seed=1)`` are the same; keywords override ``options``.

    Parameters
    ----------
    epoch_size
        Samples per epoch over all sources (mixing; default: all selected samples).
    seed, shuffle, exact
        The plan: shuffle seed; shuffle (default: unless ``exact``); ``exact`` yields every
        sample exactly once in order (evaluation), with padding marked.
    rank, world_size
        DDP rank and world size (default: from ``torch.distributed`` or the environment).
    num_workers
        Slots per rank: the plan's reading streams, each a DataLoader worker process
        (``engine="processes"``) or a stream of the thread engine (``engine="threads"``). The
        same ``num_workers`` gives the same batches on either engine.
    engine
        Who builds the batches of :meth:`~shardlake.torch.ShardDataset.loader` and of plain
        iteration: ``"threads"`` (a thread pool in this process) or ``"processes"``
        (DataLoader worker processes; better when a ``transform`` does heavy Python work).
        Default: the environment variable ``SHARDLAKE_LOADER_ENGINE``, else ``"threads"``.
    transform, include_key, include_index, meta_columns, drop_keys
        What a sample holds: a per-sample callable; its key; its table index; manifest
        columns to add; array names to leave out.
    max_pad_fraction
        Largest share of padded samples a rank may get before the plan is refused.
    chunk_size, interleave, shuffle_buffer
        Plan shape: samples per read chunk (default: about ``read_options.request_bytes`` of
        payload), runs open at once per worker (default: 32, the lanes of plan shape 2),
        shuffle-buffer samples.
    read_options
        I/O knobs (:class:`~shardlake.read.options.ReadOptions`).
    cache_dir, cache_bytes
        A local epoch cache (payloads fetched once are read from disk in later epochs).
    """

    epoch_size: int | None = None
    seed: int = 0
    shuffle: bool | None = None
    exact: bool = False
    rank: int | None = None
    world_size: int | None = None
    num_workers: int = 2
    engine: str | None = None
    transform: Callable[[dict[str, Any]], Any] | None = None
    include_key: bool = False
    include_index: bool = False
    meta_columns: Sequence[str] = ()
    drop_keys: Sequence[str] = ("version",)
    max_pad_fraction: float = DEFAULT_MAX_PAD_FRACTION
    chunk_size: int | None = None
    interleave: int | None = None
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER
    read_options: ReadOptions = field(default_factory=ReadOptions)
    cache_dir: str | os.PathLike[str] | None = None
    cache_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.engine is not None:
            check_engine(self.engine, "engine")

    @property
    def resolved_engine(self) -> str:
        """``engine``, or the default: ``$SHARDLAKE_LOADER_ENGINE``, else ``"threads"``."""
        if self.engine is not None:
            return self.engine
        return check_engine(os.environ.get(ENGINE_ENV) or DEFAULT_ENGINE, ENGINE_ENV)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def build(
        cls, options: LoaderOptions | None, keywords: Mapping[str, Any], *, where: str
    ) -> LoaderOptions:
        """``options`` (default: all defaults) with ``keywords`` replacing single fields, by
        the routine every options object shares (:func:`shardlake.errors.build_options`): an
        unknown keyword fails here, at construction, naming the nearest valid one."""
        return build_options(cls, options, keywords, where)
