"""Catalog objects by digest: read (through the node-local cache inside :func:`node_catalog_cache`)
and create, and the partitions table a format-2 version record references.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from ..errors import AlreadyExistsError, FormatError, IntegrityError, KeyNotFoundError
from ..format.catalog import ObjectRef, decode_partitions, sha256_hex
from ..progress.bar import plural
from ..read.catalog_cache import CatalogCache, catalog_cache
from ..read.verified import RefusedObjectError, read_verified
from ..store import Store

__all__ = [
    "_cache",
    "node_catalog_cache",
    "read_object",
    "read_partitions",
    "write_object",
]


_node_cache: contextvars.ContextVar[bool] = contextvars.ContextVar("node_cache", default=False)


@contextlib.contextmanager
def node_catalog_cache() -> Iterator[None]:
    """Within it, this thread's catalog reads go through the node-local catalog cache
    (:mod:`shardlake.read.catalog_cache`, as the environment configures it). The loader opens
    its sources so; verify, scrub and the other tools never do: they must read the store's
    own copy."""
    token = _node_cache.set(True)
    try:
        yield
    finally:
        _node_cache.reset(token)


def _cache() -> CatalogCache | None:
    return catalog_cache() if _node_cache.get() else None


def read_object(store: Store, ref: ObjectRef, where: str) -> bytes:
    """One catalog object: inside :func:`node_catalog_cache`, from the node-local cache when it
    holds a copy that checks out; else by one GET, checked against its digest (re-read once on
    a mismatch: a transport flip; a second mismatch is refused), and published to the cache."""
    cache = _cache()
    if cache is None:
        return _read_from_store(store, ref, where)
    return cache.fetch(ref.sha256, ref.size, lambda: _read_from_store(store, ref, where))


def _read_from_store(store: Store, ref: ObjectRef, where: str) -> bytes:
    url = store.key_url(ref.key)

    def check(data: bytes) -> bytes:
        try:
            ref.check(data, url)
        except IntegrityError as exc:
            raise FormatError(str(exc)) from exc  # read_verified re-reads a FormatError
        return data

    try:
        return read_verified(store, ref.key, check)[0]
    except KeyNotFoundError as exc:
        raise FormatError(f"{url}: {where}: catalog object missing") from exc
    except RefusedObjectError as exc:
        raise IntegrityError(str(exc)) from exc


def write_object(store: Store, key_of: Any, data: bytes, rows: int) -> ObjectRef:
    """Create a content-addressed object (an identical one already there is fine)."""
    digest = sha256_hex(data)
    ref = ObjectRef(key_of(digest), digest, len(data), rows)
    # Same key, same digest: the same bytes (and readers check the digest).
    with contextlib.suppress(AlreadyExistsError):
        store.create(ref.key, data)
    return ref


def read_partitions(store: Store, ref: ObjectRef, where: str) -> list[dict[str, Any]]:
    entries = decode_partitions(read_object(store, ref, where), store.key_url(ref.key))
    if len(entries) != ref.rows:
        raise FormatError(
            f"{store.key_url(ref.key)}: partitions table holds {plural(len(entries), 'row')}, its "
            f"reference says {ref.rows}"
        )
    return entries
