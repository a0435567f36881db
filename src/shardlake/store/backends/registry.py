"""Which backend serves which protocol, and :func:`register_backend` for a user's own.

The shipped backends are listed as ``"module:Class"`` strings and imported on first use, as
fsspec's ``known_implementations``; each class declares its own facts (``Backend.protocols``,
its install extra, bucket rule, credential hint, endpoint and obstore configuration), and the
protocol table is built from them. A new backend is its own module here plus one line in
:data:`BUILTIN_BACKENDS` (docs/architecture.md, "Add a backend").
"""

from __future__ import annotations

import functools
import importlib
import threading

from ...errors import InvalidURLError, UsageError
from .base import Backend

__all__ = [
    "BUILTIN_BACKENDS",
    "WRITABLE_STORES",
    "backend_class",
    "builtin_backends",
    "check_protocol",
    "is_builtin",
    "path_protocol",
    "register_backend",
]

# The backends shipped with shardlake, "module:Class" in this package; the first serves plain
# absolute paths (its first protocol).
BUILTIN_BACKENDS = (
    "local:LocalBackend",
    "memory:MemoryBackend",
    "s3:S3Backend",
    "gcs:GCSBackend",
    "azure:AzureBackend",
    "http:HTTPBackend",
    "http:HTTPSBackend",
)
# Where a root is stored and written (for messages refusing a write elsewhere).
WRITABLE_STORES = "a local path, s3://, gs://, az://"

_registered: dict[str, type[Backend]] = {}  # register_backend's, over the shipped ones
_lock = threading.Lock()


@functools.cache
def builtin_backends() -> tuple[type[Backend], ...]:
    """The shipped backend classes, imported now (once)."""
    found: list[type[Backend]] = []
    for entry in BUILTIN_BACKENDS:
        module, _, name = entry.partition(":")
        cls = getattr(importlib.import_module(f"{__package__}.{module}"), name)
        if not (isinstance(cls, type) and issubclass(cls, Backend) and cls.protocols):
            raise TypeError(f"{entry}: not a Backend declaring its protocols")
        found.append(cls)
    return tuple(found)


@functools.cache
def _builtin_table() -> dict[str, type[Backend]]:
    table: dict[str, type[Backend]] = {}
    for cls in builtin_backends():
        for protocol in cls.protocols:
            if protocol in table:
                raise TypeError(f"protocol {protocol!r}: {table[protocol]} and {cls}")
            table[protocol] = cls
    return table


def backend_class(protocol: str) -> type[Backend]:
    """The backend serving ``protocol``: a registered one, a shipped one, else the generic
    fsspec :class:`Backend`."""
    found = _registered.get(protocol) or _builtin_table().get(protocol)
    return found or Backend


def is_builtin(cls: type[Backend]) -> bool:
    """Whether ``cls`` is shipped here (it builds its filesystem with the fsspec class)."""
    return cls is Backend or cls in builtin_backends()


def path_protocol() -> str:
    """The protocol of a plain absolute path."""
    return builtin_backends()[0].protocols[0]


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
    with _lock:
        _registered[protocol] = backend_class


def check_protocol(protocol: str) -> None:
    """Raise :class:`InvalidURLError` for a protocol neither shardlake nor fsspec knows."""
    from fsspec.registry import known_implementations, registry

    if (
        protocol not in _registered
        and protocol not in _builtin_table()
        and protocol not in known_implementations
        and protocol not in registry
    ):
        raise InvalidURLError(
            f"unknown store protocol {protocol!r}: use an absolute path, file://, memory://, "
            "s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, az://CONTAINER/PREFIX or (read-only) "
            "https://HOST/PATH"
        )
