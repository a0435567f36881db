"""One storage layer for every backend: local disk, NFS, S3, GCS and memory via fsspec."""

from .backends import Backend, Leftover, register_backend
from .backends.obstore import ReadClientWarning
from .core import ObjectInfo, Store, open_store
from .keys import check_key, join_key
from .layers import Request, RequestCounter, StoreLayer
from .retry import NO_RETRY, RetryPolicy

__all__ = [
    "Backend",
    "Leftover",
    "NO_RETRY",
    "ObjectInfo",
    "ReadClientWarning",
    "Request",
    "RequestCounter",
    "RetryPolicy",
    "Store",
    "StoreLayer",
    "check_key",
    "join_key",
    "open_store",
    "register_backend",
]
