"""Per-backend atomic primitives under :class:`shardlake.store.Store`, one module per backend.

Each backend states how it achieves create-if-absent, atomic overwrite and visible-when-complete
streaming writes; ``docs/storage.md`` explains the guarantees.
"""

from .azure import AzureBackend
from .base import Backend, BucketBackend, Leftover, is_already_exists, is_unsatisfiable_range
from .gcs import GCSBackend
from .local import LocalBackend
from .memory import MemoryBackend
from .registry import check_protocol, make_backend, register_backend
from .s3 import S3Backend

__all__ = [
    "AzureBackend",
    "Backend",
    "BucketBackend",
    "GCSBackend",
    "Leftover",
    "LocalBackend",
    "MemoryBackend",
    "S3Backend",
    "check_protocol",
    "is_already_exists",
    "is_unsatisfiable_range",
    "make_backend",
    "register_backend",
]
