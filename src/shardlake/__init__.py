"""shardlake: versioned, verifiable, cloud-portable shard datasets."""

from .errors import ShardlakeError
from .store import Store, open_store

__version__ = "0.1.0"

__all__ = ["ShardlakeError", "Store", "__version__", "open_store"]
