"""The loader's settings as one object: :class:`LoaderOptions` (keywords of ``ShardDataset``)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from ..options import build_options, options_class
from ..read.options import ReadOptions
from .plan_types import DEFAULT_MAX_PAD_FRACTION, DEFAULT_SHUFFLE_BUFFER, ORDERS

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
        Share of the epoch replayed to fill the last step above which the loader warns
        (any size still plans, as ``DistributedSampler`` pads any size).
    drop_last
        Drop the remainder that does not fill a step on every rank instead of replaying
        samples, as ``DistributedSampler`` + ``DataLoader(drop_last=True)`` do: no sample is
        seen twice in an epoch (shuffled, which ones sit out changes every epoch). Not with
        ``exact`` (which yields every sample). With ``order="torch"``: DataLoader's
        ``drop_last``.
    order
        ``"shardlake"`` (default): the plan's fast order (shard runs, lanes, bounded shuffle).
        ``"torch"``: exactly the order of ``DataLoader(batch_size, drop_last)`` over
        ``DistributedSampler(shuffle, seed, drop_last=sampler_drop_last)`` and the selection's
        key order, epoch by epoch, on any world size; one ranged read per sample, for proving
        a switch from such a script bit for bit, not for speed (docs/migration.md).
    sampler_drop_last
        ``order="torch"`` only: ``DistributedSampler``'s ``drop_last``.
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
    drop_last: bool = False
    order: str = "shardlake"
    sampler_drop_last: bool = False
    chunk_size: int | None = None
    interleave: int | None = None
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER
    read_options: ReadOptions = field(default_factory=ReadOptions)
    cache_dir: str | os.PathLike[str] | None = None
    cache_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.engine is not None:
            check_engine(self.engine, "engine")
        if self.order not in ORDERS:
            raise UsageError(
                f"order={self.order!r}: choose one of {', '.join(repr(o) for o in ORDERS)}"
            )
        if self.exact and self.drop_last:
            raise UsageError(
                "exact=True yields every sample once and drop_last=True drops some: choose one"
            )
        if self.sampler_drop_last and self.order != "torch":
            raise UsageError("sampler_drop_last applies to order='torch' only; use drop_last")

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
        the routine every options object shares (:func:`shardlake.options.build_options`): an
        unknown keyword fails here, at construction, naming the nearest valid one."""
        return build_options(cls, options, keywords, where)
