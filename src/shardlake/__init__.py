"""shardlake: versioned, verifiable, cloud-portable shard datasets.

Start with :func:`shardlake.open`::

    import shardlake

    root = shardlake.open("s3://bucket/dataset")
    root.versions()
    sample = root.dataset("v1").get(key)
"""

from typing import TYPE_CHECKING, Any

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
from .store import Store, open_store

if TYPE_CHECKING:
    from .lifecycle.export import ExportReport, NpzExportReport
    from .lifecycle.verify import VerifyOptions, VerifyReport
    from .meta.keysets import Keyset
    from .pack import PackOptions, PackReport, inspect_source
    from .pack.writer import WriteOptions, Writer
    from .query.dataset import Dataset
    from .query.selection import Selection
    from .root import Root, VersionInfo, open
    from .store.check import StoreReport, check_store

# Imported on first use: ``import shardlake`` stays cheap (no pyarrow compute, DuckDB or pack
# machinery until a root is opened), which every CLI call and worker process pays.
_LAZY = {
    "Dataset": "query.dataset",
    "ExportReport": "lifecycle.export",
    "NpzExportReport": "lifecycle.export",
    "VerifyOptions": "lifecycle.verify",
    "VerifyReport": "lifecycle.verify",
    "inspect_source": "pack",
    "Keyset": "meta.keysets",
    "PackOptions": "pack",
    "PackReport": "pack",
    "Root": "root",
    "Selection": "query.selection",
    "StoreReport": "store.check",
    "VersionInfo": "root",
    "WriteOptions": "pack.writer",
    "Writer": "pack.writer",
    "check_store": "store.check",
    "open": "root",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardlake' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"

__all__ = [
    "ConflictError",
    "Dataset",
    "ExportReport",
    "FormatError",
    "IntegrityError",
    "Keyset",
    "NotFoundError",
    "NpzExportReport",
    "PackOptions",
    "PackReport",
    "Root",
    "Selection",
    "SelectionError",
    "ShardlakeError",
    "SourceError",
    "Store",
    "StoreError",
    "StoreReport",
    "UsageError",
    "VerifyOptions",
    "VerifyReport",
    "VersionInfo",
    "VersionNotFoundError",
    "WriteOptions",
    "Writer",
    "__version__",
    "check_store",
    "inspect_source",
    "open",
    "open_store",
]
