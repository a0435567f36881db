"""Shared helpers for the dataset/lifecycle tests: pack a tiny corpus into any store location."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import shardlake
from shardlake import Store
from shardlake.testing import synth_corpus
from shardlake.testing.fixtures import StoreLocation

SMALL_SHARD = 40_000  # several shards per partition even for tiny frames


def pack_small(location: StoreLocation, src: Path, tag: str = "v1", **options: Any) -> Store:
    """Pack ``src`` into ``location`` in-process with small shards; return the opened store."""
    shardlake.open(location.url, **location.storage_options).pack(
        str(src), tag=tag, workers=1, executor="inline", shard_size=SMALL_SHARD, **options
    )
    return location.open()


def pack_synth(
    location: StoreLocation,
    src: Path,
    partitions: int,
    frames: int,
    *,
    seed: int,
    tag: str = "v1",
    reuse_source: bool = False,
    **synth: Any,
) -> Store:
    """Synthesize ``partitions`` logs of ``frames`` frames at ``src`` (kept as it is when
    ``reuse_source`` and it exists: a second tag of the same source) and :func:`pack_small` it."""
    if not (reuse_source and src.exists()):
        synth_corpus(src, partitions, frames, seed=seed, neighbors=2, lanes=4, **synth)
    return pack_small(location, src, tag=tag)


def packed_keys(location: StoreLocation, tag: str | None = None) -> list[str]:
    """The sorted sample keys of ``tag`` (default: latest) at ``location``."""
    ds = shardlake.open(location.url, **location.storage_options).dataset(tag)
    return sorted(ds.manifests(columns=["key"]).column("key").to_pylist())
