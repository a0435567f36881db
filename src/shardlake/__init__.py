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
    VersionRedactedError,
)

if TYPE_CHECKING:
    from .executors.options import RunOptions
    from .lifecycle.export import ExportOptions, ExportReport, NpzExportReport
    from .lifecycle.forget import ForgetReport
    from .lifecycle.forget_check import ForgetCheckReport
    from .lifecycle.forget_plan import ForgetOptions
    from .lifecycle.gc import GcOptions, GcReport
    from .lifecycle.prune import PruneReport
    from .lifecycle.remove import RemoveOptions, RemoveReport
    from .lifecycle.scrub import ScrubOptions, ScrubReport
    from .lifecycle.verify import OffsetsOptions, OffsetsReport, VerifyOptions, VerifyReport
    from .meta.keysets import Keyset
    from .meta.versions import Version
    from .pack import PackOptions, PackReport, inspect_source
    from .pack.writer import RaggedFieldWarning, Writer
    from .pack.written import WriteOptions
    from .query.dataset import Dataset
    from .query.selection import Selection
    from .root import Keysets, Root, StoreLike, as_store, check_store, open
    from .store import RetryPolicy, Store, open_store
    from .store.check import StoreReport

# Imported on first use: ``import shardlake`` stays cheap (no fsspec, pyarrow, DuckDB or pack
# machinery until a root is opened), which every CLI call and worker process pays; the CLI
# takes Ctrl-C from its first moment (``cli.run``) only after this package is imported.
_LAZY = {
    "Dataset": "query.dataset",
    "ExportOptions": "lifecycle.export",
    "ExportReport": "lifecycle.export",
    "ForgetCheckReport": "lifecycle.forget_check",
    "ForgetOptions": "lifecycle.forget_plan",
    "ForgetReport": "lifecycle.forget",
    "GcOptions": "lifecycle.gc",
    "GcReport": "lifecycle.gc",
    "NpzExportReport": "lifecycle.export",
    "OffsetsOptions": "lifecycle.verify",
    "OffsetsReport": "lifecycle.verify",
    "PruneReport": "lifecycle.prune",
    "RemoveOptions": "lifecycle.remove",
    "RemoveReport": "lifecycle.remove",
    "ScrubOptions": "lifecycle.scrub",
    "ScrubReport": "lifecycle.scrub",
    "VerifyOptions": "lifecycle.verify",
    "VerifyReport": "lifecycle.verify",
    "inspect_source": "pack",
    "Keyset": "meta.keysets",
    "Keysets": "root",
    "PackOptions": "pack",
    "PackReport": "pack",
    "RaggedFieldWarning": "pack.writer",
    "RetryPolicy": "store",
    "Root": "root",
    "RunOptions": "executors.options",
    "Selection": "query.selection",
    "Store": "store",
    "StoreReport": "store.check",
    "Version": "meta.versions",
    "WriteOptions": "pack.written",
    "Writer": "pack.writer",
    "check_store": "root",
    "StoreLike": "root",
    "as_store": "root",
    "open": "root",
    "open_store": "store",
}


def __getattr__(name: str) -> Any:
    if name == "VersionInfo":  # the old name of Version, kept for one release
        import warnings

        warnings.warn(
            "shardlake.VersionInfo is deprecated: use shardlake.Version",
            DeprecationWarning,
            stacklevel=2,
        )
        name = "Version"
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
    "ExportOptions",
    "ExportReport",
    "ForgetCheckReport",
    "ForgetOptions",
    "ForgetReport",
    "FormatError",
    "GcOptions",
    "GcReport",
    "IntegrityError",
    "Keyset",
    "Keysets",
    "NotFoundError",
    "NpzExportReport",
    "OffsetsOptions",
    "OffsetsReport",
    "PackOptions",
    "PackReport",
    "Root",
    "RunOptions",
    "PruneReport",
    "RemoveOptions",
    "RemoveReport",
    "RaggedFieldWarning",
    "RetryPolicy",
    "ScrubOptions",
    "ScrubReport",
    "Selection",
    "SelectionError",
    "ShardlakeError",
    "SourceError",
    "Store",
    "StoreError",
    "StoreLike",
    "StoreReport",
    "UsageError",
    "VerifyOptions",
    "VerifyReport",
    "Version",
    "VersionNotFoundError",
    "VersionRedactedError",
    "WriteOptions",
    "Writer",
    "__version__",
    "as_store",
    "check_store",
    "inspect_source",
    "open",
    "open_store",
]
