"""Probe that a store really enforces create-if-absent before anything is published there."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from ..errors import AlreadyExistsError

if TYPE_CHECKING:
    from .core import Store

PROBE_PREFIX = "_shardlake/probe"


def probe_create_if_absent(store: Store) -> bool:
    """Create a fresh probe key twice; True if the second create is refused."""
    key = f"{PROBE_PREFIX}/{uuid.uuid4().hex}"
    store.create(key, b"first")
    try:
        try:
            store.create(key, b"second")
        except AlreadyExistsError:
            return store.read(key) == b"first"
        return False
    finally:
        store.delete(key)
