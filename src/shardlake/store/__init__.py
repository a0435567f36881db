"""One storage layer for every backend: local disk, NFS, S3, GCS and memory via fsspec."""

from .backends import Leftover
from .core import ObjectInfo, Store, open_store
from .keys import check_key, join_key
from .retry import NO_RETRY, RetryPolicy

__all__ = [
    "Leftover",
    "NO_RETRY",
    "ObjectInfo",
    "RetryPolicy",
    "Store",
    "check_key",
    "join_key",
    "open_store",
]
