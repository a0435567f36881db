"""Node-local caches meeting a root after a ``forget``: they drop what they hold of the
versions it redacted (catalog objects and derived values of those versions, epoch-cache entries
of the shards it deleted), once per forget and cache directory.

Called when a loader opens a root, with the version hashes it opened. Each cache directory
remembers, per root, the hashes it last met the root at (``met-<digest of the URL>``): a cache
that never met the root holds nothing of it and only records the meeting; one that met it at
the same hashes needs nothing (the start-up stays free of extra requests); otherwise one
listing of ``receipts/`` finds the forgets (a root that cannot be listed, over HTTP, is
skipped). The forgets applied are kept in ``applied-forgets`` (one id a line).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import FormatError, StoreError
from ..store import Store
from .cache import DEFAULT_CACHE_BYTES, EpochCache
from .catalog_cache import CatalogCache, catalog_cache
from .receipts import list_receipt_ids, read_receipt, receipt_committed

__all__ = ["APPLIED", "drop_forgotten", "drop_forgotten_caches"]

APPLIED = "applied-forgets"


def _applied(root: Path) -> set[str]:
    try:
        return set((root / APPLIED).read_text().split())
    except OSError:
        return set()


def _mark(root: Path, forget_id: str) -> None:
    with contextlib.suppress(OSError), open(root / APPLIED, "a") as fh:
        fh.write(forget_id + "\n")


def _met(root: Path, url: str, seen: str | None = None) -> str | None:
    """The hashes this cache last met root ``url`` at; with ``seen``: record those."""
    path = root / ("met-" + hashlib.sha256(url.encode()).hexdigest()[:24])
    if seen is None:
        try:
            return path.read_text()
        except OSError:
            return None
    with contextlib.suppress(OSError):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(seen)
        tmp.replace(path)
    return seen


def drop_forgotten(
    store: Store,
    catalog: CatalogCache | None,
    epoch: EpochCache | None,
    versions: Iterable[str] = (),
) -> list[str]:
    """Apply every committed forget of ``store`` not yet applied to these caches (met at the
    version hashes ``versions``); the forget ids applied now."""
    seen = ",".join(sorted(set(versions)))
    caches: list[Any] = []
    for cache in (catalog, epoch):
        if cache is None:
            continue
        with contextlib.suppress(OSError):
            cache.root.mkdir(parents=True, exist_ok=True)
        last = _met(cache.root, store.url)
        _met(cache.root, store.url, seen)
        if last is not None and last != seen:
            caches.append(cache)  # met before at other versions: a forget may have come since
    if not caches:
        return []
    try:
        ids = list_receipt_ids(store)
    except (StoreError, FormatError, NotImplementedError):
        return []  # a root that cannot be listed (HTTP): its readers keep no stale state here
    done: list[str] = []
    receipts: dict[str, dict[str, Any] | None] = {}
    for cache in caches:
        applied = _applied(cache.root)
        for forget_id in ids:
            if forget_id in applied:
                continue
            if forget_id not in receipts:
                try:
                    found = read_receipt(store, forget_id)
                    receipts[forget_id] = found if receipt_committed(store, found) else None
                except (StoreError, FormatError):
                    receipts[forget_id] = None
            doc = receipts[forget_id]
            if doc is None:
                continue  # not committed (yet): looked at again next time
            superseded = [str(k) for k in doc.get("superseded", ())]
            if isinstance(cache, CatalogCache):
                shas = [
                    k.rsplit("/", 1)[-1].split(".", 1)[0]
                    for k in superseded
                    if k.startswith("catalog/")
                ]
                cache.drop(shas, [str(v["old"]) for v in doc.get("versions", ())])
            else:
                cache.drop_shards([k for k in superseded if k.endswith(".tar")])
            _mark(cache.root, forget_id)
            if forget_id not in done:
                done.append(forget_id)
    return done


def drop_forgotten_caches(
    stores: Iterable[Any], cache_dir: str | os.PathLike[str] | None, versions: Iterable[str]
) -> None:
    """What a loader does as it opens its roots: this node's catalog cache and the epoch cache
    in ``cache_dir`` drop what they hold of versions a forget redacted (one listing of each
    root's receipts, :func:`drop_forgotten`)."""
    epoch = None if cache_dir is None else EpochCache(cache_dir, DEFAULT_CACHE_BYTES)
    catalog = catalog_cache()
    hashes = list(versions)
    for store in stores:
        if isinstance(store, Store):
            drop_forgotten(store, catalog, epoch, hashes)
