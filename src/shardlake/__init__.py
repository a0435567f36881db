"""shardlake: versioned, verifiable, cloud-portable shard datasets.

Start with :func:`shardlake.open`::

    import shardlake

    root = shardlake.open("s3://bucket/dataset")
    root.versions()
    sample = root.dataset("v1").get(key)
"""

from .dataset import Dataset
from .errors import (
    ConflictError,
    FormatError,
    IntegrityError,
    NotFoundError,
    SelectionError,
    ShardlakeError,
    SourceError,
    StoreError,
    UsageError,
    VersionNotFoundError,
)
from .keysets import Keyset
from .pack import PackOptions, PackReport
from .root import Root, VersionInfo, open
from .selection import Selection
from .store import Store, open_store

__version__ = "0.1.0"

__all__ = [
    "ConflictError",
    "Dataset",
    "FormatError",
    "IntegrityError",
    "Keyset",
    "NotFoundError",
    "PackOptions",
    "PackReport",
    "Root",
    "Selection",
    "SelectionError",
    "ShardlakeError",
    "SourceError",
    "Store",
    "StoreError",
    "UsageError",
    "VersionInfo",
    "VersionNotFoundError",
    "__version__",
    "open",
    "open_store",
]
