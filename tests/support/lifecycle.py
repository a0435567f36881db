"""Shared helpers for the dataset/lifecycle tests: pack a tiny corpus into any store location."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import shardlake
from shardlake import Store
from shardlake.testing.fixtures import StoreLocation

SMALL_SHARD = 40_000  # several shards per partition even for tiny frames


def pack_small(location: StoreLocation, src: Path, tag: str = "v1", **options: Any) -> Store:
    """Pack ``src`` into ``location`` in-process with small shards; return the opened store."""
    shardlake.open(location.url, **location.storage_options).pack(
        str(src), tag=tag, workers=1, executor="inline", shard_size=SMALL_SHARD, **options
    )
    return location.open()
