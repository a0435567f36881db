"""Which backend serves which protocol, and :func:`register_backend` for a user's own."""

from __future__ import annotations

from typing import Any

from ...errors import InvalidURLError, UsageError
from ..retry import RetryPolicy
from .azure import AzureBackend
from .base import Backend
from .gcs import GCSBackend
from .local import LocalBackend
from .memory import MemoryBackend
from .s3 import S3Backend

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
}

_EXTRAS = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "az": "azure",
    "abfs": "azure",
    "abfss": "azure",
}


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
            "s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or az://CONTAINER/PREFIX"
        )


def make_backend(
    protocol: str, root: str, storage_options: dict[str, Any], policy: RetryPolicy
) -> Backend:
    """The backend for ``protocol`` with a filesystem built from ``storage_options``."""
    check_protocol(protocol)
    from .obstore import READ_CLIENT_OPTION, READ_CLIENTS, ObstoreReads, default_read_client

    storage_options = dict(storage_options)
    read_client = storage_options.pop(READ_CLIENT_OPTION, None)
    if read_client is None:
        read_client = default_read_client(protocol)
    if read_client not in READ_CLIENTS or (read_client != "s3fs" and protocol not in ("s3", "s3a")):
        raise UsageError(
            f"storage option {READ_CLIENT_OPTION}={read_client!r}: use 'obstore' (the default "
            "on s3:// where obstore is installed) or 's3fs'; 'obstore' is for s3:// only"
        )
    cls = _BACKENDS.get(protocol, Backend)
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
    if read_client == "obstore" and isinstance(backend, S3Backend):
        backend.fast_reads = ObstoreReads(storage_options, policy.request_timeout)
    return backend
