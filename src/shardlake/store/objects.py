"""Objects named by URLs: a URL naming one object, or a folder of them, opened as stores."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import SourceError
from .core import Store, open_store

__all__ = ["open_objects"]


def open_objects(
    urls: Sequence[str],
    storage_options: dict[str, Any] | None,
    *,
    suffixes: tuple[str, ...],
) -> list[tuple[str, Store, str]]:
    """``(url, store, key)`` of every object the URLs name: a URL ending in one of
    ``suffixes`` is one object; any other is a folder, whose objects with those suffixes are
    taken in name order (a folder holding none is a :class:`SourceError` naming it)."""
    out: list[tuple[str, Store, str]] = []
    for url in urls:
        if url.endswith(suffixes):
            parent, _, name = url.rstrip("/").rpartition("/")
            out.append((url, open_store(parent or "/", storage_options), name))
            continue
        store = open_store(url, storage_options)
        names = sorted(k for k in store.list("") if k.endswith(suffixes))
        if not names:
            raise SourceError(f"{url}: no {suffixes[0]} files here")
        out.extend((store.key_url(k), store, k) for k in names)
    return out
