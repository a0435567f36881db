"""The one door for "another store": :data:`StoreLike` and :func:`as_store`, which
``shardlake.open``, ``check_store``, ``Root.export``/``verify``, the loader (``ShardDataset``,
``MixMember``, ``train_valid``) and the tools take a store through.

Apart from ``root/__init__.py`` (``Root``) so that the loader can use it without importing the
operations behind ``Root`` (``Dataset.to_torch`` imports the loader)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Union

from ..errors import UsageError
from ..store import Store, open_store
from ..store.url import location

if TYPE_CHECKING:
    from . import Root

__all__ = [
    "HoldsStore",
    "StoreLike",
    "as_store",
    "store_like",
]


class HoldsStore:
    """What holds an opened store (:class:`~shardlake.Root`): the door takes its ``store``."""

    store: Store


StoreLike = Union[str, os.PathLike[str], Store, "Root"]
"""What every argument naming another store takes: a URL or path, an opened store or a root."""


def store_like(
    x: StoreLike,
    storage_options: Mapping[str, Any] | None = None,
    *,
    name: str = "url",
    option: str = "storage_options",
) -> str | Store:
    """``x`` checked without opening it: an opened :class:`~shardlake.Store` (a
    :class:`Root`'s own), or a URL (a local path made absolute; a blank one is refused naming
    ``name``). Storage options given with an already-opened store or root are refused (a
    :class:`~shardlake.errors.UsageError` naming ``option``): they would be ignored."""
    if isinstance(x, HoldsStore):
        x = x.store
    if isinstance(x, Store):
        if storage_options:
            raise UsageError(
                f"{name}: storage options go with a URL; {option} were given with the opened "
                f"store {x.url}, which has its own",
                options=(option,),
            )
        return x
    return location(x, name)


def as_store(
    x: StoreLike,
    storage_options: Mapping[str, Any] | None = None,
    *,
    name: str = "url",
    option: str = "storage_options",
) -> Store:
    """``x`` as an opened store: the one door through which a URL (with ``storage_options``),
    an opened :class:`~shardlake.Store` or a :class:`Root` becomes a store (the operations
    below the facade take no URL). Storage options given with an already-opened store or root
    are refused: they would be ignored. ``name``: the argument, ``option``: the argument
    holding the storage options, for messages (:func:`store_like`)."""
    target = store_like(x, storage_options, name=name, option=option)
    if isinstance(target, Store):
        return target
    return open_store(target, dict(storage_options) if storage_options else None)
