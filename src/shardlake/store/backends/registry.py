"""Which backend serves which protocol, and :func:`register_backend` for a user's own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import InvalidURLError, UsageError
from ..endpoint import check_endpoint
from ..retry import RetryPolicy
from .azure import AzureBackend
from .base import Backend, BucketBackend
from .gcs import GCSBackend
from .http import HTTPBackend, HTTPSBackend
from .local import LocalBackend
from .memory import MemoryBackend
from .options import READ_CLIENT_OPTION, check_storage_options
from .s3 import S3Backend

if TYPE_CHECKING:
    from ..config import StoreConfig

__all__ = [
    "check_protocol",
    "make_backend",
    "register_backend",
]

_BACKENDS: dict[str, type[Backend]] = {
    "file": LocalBackend,
    "local": LocalBackend,
    "memory": MemoryBackend,
    "s3": S3Backend,
    "s3a": S3Backend,
    "gs": GCSBackend,
    "gcs": GCSBackend,
    "az": AzureBackend,
    "abfs": AzureBackend,
    "abfss": AzureBackend,
    "http": HTTPBackend,
    "https": HTTPSBackend,
}

_EXTRAS = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "az": "azure",
    "abfs": "azure",
    "abfss": "azure",
    "http": "http",
    "https": "http",
}

# The backends shipped here build their filesystem with the protocol's fsspec class.
_BUILTIN: frozenset[type[Backend]] = frozenset({*_BACKENDS.values(), Backend})


def register_backend(protocol: str, backend_class: type[Backend]) -> None:
    """Serve ``protocol`` URLs with ``backend_class`` (a :class:`Backend` subclass).

    The backend builds its filesystem in :meth:`Backend.make_filesystem` (by default
    ``fsspec.filesystem(protocol, **storage_options)``, so a filesystem registered with
    ``fsspec.register_implementation`` works as is) and overrides the primitives its filesystem
    cannot do atomically.  Prove it with :mod:`shardlake.testing.conformance`.
    """
    if not isinstance(protocol, str) or not protocol.isidentifier():
        raise UsageError(f"register_backend: invalid protocol {protocol!r}")
    if not (isinstance(backend_class, type) and issubclass(backend_class, Backend)):
        raise UsageError(
            f"register_backend: {backend_class!r} is not a subclass of shardlake.store.Backend"
        )
    _BACKENDS[protocol] = backend_class


def check_protocol(protocol: str) -> None:
    """Raise :class:`InvalidURLError` for a protocol neither shardlake nor fsspec knows."""
    from fsspec.registry import known_implementations, registry

    if (
        protocol not in _BACKENDS
        and protocol not in known_implementations
        and protocol not in registry
    ):
        raise InvalidURLError(
            f"unknown store protocol {protocol!r}: use an absolute path, file://, memory://, "
            "s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, az://CONTAINER/PREFIX or (read-only) "
            "https://HOST/PATH"
        )


def make_backend(config: StoreConfig, root: str, policy: RetryPolicy) -> Backend:
    """The backend for ``config.protocol`` with a filesystem built from its options."""
    protocol = config.protocol
    check_protocol(protocol)
    check_endpoint(config.endpoint)
    cls = _BACKENDS.get(protocol, Backend)
    storage_options = dict(config.fs_options)
    if cls in _BUILTIN:  # a registered backend's make_filesystem may take options of its own
        check_storage_options(protocol, storage_options)
    fast_config = _fast_read_config(config)
    try:
        fs = cls.make_filesystem(protocol, storage_options, policy)
    except ImportError as exc:
        extra = _EXTRAS.get(protocol)
        hint = f"pip install 'shardlake[{extra}]'" if extra else "install its fsspec package"
        raise UsageError(f"store protocol {protocol!r} needs a missing package: {hint}") from exc
    except TypeError as exc:
        # An unknown storage option; name it without echoing any values.
        raise UsageError(
            f"invalid storage_options for {protocol!r} (keys: {', '.join(sorted(storage_options))}): "
            f"{exc}"
        ) from None
    backend = cls(fs, root, policy)
    if isinstance(backend, BucketBackend):
        from . import obstore

        if isinstance(fast_config, dict):
            backend.fast_reads = obstore.ObstoreReads(protocol, fast_config, policy.request_timeout)
        elif fast_config is not None:  # said at the first read obstore would have served
            backend.fast_reads_unavailable = (protocol, fast_config)
    return backend


def _fast_read_config(config: StoreConfig) -> dict[str, Any] | str | None:
    """obstore's store keywords when reads go through obstore; else why not where obstore was
    the default but cannot serve (a fall-back), or None.

    ``read_client`` unset: obstore where it is installed and the options map onto it (S3, GCS,
    Azure), else the fsspec client. ``"obstore"``: obstore, or a clear error where it cannot
    serve. ``"fsspec"`` (or the protocol's fsspec client by name): the fsspec client."""
    from . import obstore

    read_client, protocol = config.read_client, config.protocol
    if read_client not in (None, obstore.OBSTORE) or protocol not in obstore.FSSPEC_CLIENTS:
        return None  # StoreConfig.parse refused "obstore" for a protocol it cannot read
    option = f"storage option {READ_CLIENT_OPTION}={read_client!r}"
    if not obstore.obstore_installed():
        if read_client == obstore.OBSTORE:
            raise UsageError(
                f"{option}: the obstore package is not installed (pip install obstore)"
            )
        return None
    found = obstore.obstore_config_for(protocol, dict(config.fs_options), config.endpoint)
    if isinstance(found, dict):
        return found
    if read_client == obstore.OBSTORE:
        raise UsageError(
            f"{option}: obstore cannot sign for {protocol}:// with these storage options "
            f"(keys: {', '.join(sorted(config.fs_options))}): {found}; use read_client='fsspec'"
        )
    return found
