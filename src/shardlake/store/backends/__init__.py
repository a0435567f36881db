"""Per-backend atomic primitives under :class:`shardlake.store.Store`, one module per backend.

Each backend states how it achieves create-if-absent, atomic overwrite and visible-when-complete
streaming writes, and declares its facts (protocols, extra, bucket rule, credential hint,
endpoint and obstore configuration); ``docs/storage.md`` explains the guarantees. The backend
modules are imported on first use (:mod:`.registry`).
"""

from typing import TYPE_CHECKING, Any

from .base import Backend, BucketBackend, Leftover, is_already_exists, is_unsatisfiable_range
from .registry import backend_class, check_protocol, register_backend

if TYPE_CHECKING:
    from .azure import AzureBackend
    from .gcs import GCSBackend
    from .local import LocalBackend
    from .memory import MemoryBackend
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
    "backend_class",
    "check_protocol",
    "is_already_exists",
    "is_unsatisfiable_range",
    "register_backend",
]

_LAZY = {
    "AzureBackend": "azure",
    "GCSBackend": "gcs",
    "LocalBackend": "local",
    "MemoryBackend": "memory",
    "S3Backend": "s3",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
