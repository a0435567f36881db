"""The root marker (``shardlake.json``): what makes a location a shardlake root, created on the
first publish; a location holding other people's objects is refused.
"""

from __future__ import annotations

import uuid
from typing import Any

from ..errors import AlreadyExistsError, ConflictError, FormatError, KeyNotFoundError, NotFoundError
from ..format.layout import RECORD_FORMAT_VERSION, ROOT_MARKER, is_owned_key
from ..store import Store
from .state import RootState, canonical_json, parse_json, utc_now

__all__ = ["check_foreign", "ensure_root", "parse_root_marker", "read_root_marker", "require_root"]


ROOT_SCHEMA = "shardlake.root/1"


def read_root_marker(store: Store) -> dict[str, Any] | None:
    try:
        data = store.read(ROOT_MARKER)
    except KeyNotFoundError:
        return None
    return parse_root_marker(data, store.key_url(ROOT_MARKER))


def parse_root_marker(data: bytes, where: str) -> dict[str, Any]:
    """The root marker document from its bytes; refused unless it is a shardlake root marker."""
    doc = parse_json(data, where)
    if doc.get("format") != ROOT_SCHEMA:
        raise FormatError(f"{where}: not a shardlake root (format {doc.get('format')!r})")
    return doc


FOREIGN_SHOWN = 5


def check_foreign(store: Store, *, allow_foreign: bool = False) -> None:
    """Refuse a location that holds objects but no shardlake root (``allow_foreign`` proceeds).

    The first publish into a folder or bucket of other people's files is almost always a wrong
    URL; gc would leave those files alone, but they would share a prefix with the dataset.
    """
    if allow_foreign or read_root_marker(store) is not None:
        return
    foreign = [key for key in store.list("") if not is_owned_key(key)]
    if foreign:
        shown = ", ".join(foreign[:FOREIGN_SHOWN]) + (
            ", ..." if len(foreign) > FOREIGN_SHOWN else ""
        )
        raise ConflictError(
            f"{store.url} is not empty and not a shardlake root: it holds {len(foreign)} "
            f"object(s) shardlake did not write ({shown}); publish into an empty location, or "
            "allow the foreign objects (gc leaves them alone)",
            options=("allow_foreign",),
        )


def ensure_root(
    store: Store, dataset_id: str | None = None, *, allow_foreign: bool = False
) -> dict[str, Any]:
    """Create the root marker if absent (create-if-absent); return the marker in force.

    ``dataset_id`` (export) asks for a specific id; an existing root with another id is refused.
    A location holding foreign objects is refused unless ``allow_foreign`` (:func:`check_foreign`).
    """
    marker = read_root_marker(store)
    if marker is None:
        check_foreign(store, allow_foreign=allow_foreign)
    store.ensure_create_enforced()
    if marker is None:
        candidate = {
            "format": ROOT_SCHEMA,
            "format_version": RECORD_FORMAT_VERSION,
            "dataset_id": dataset_id or uuid.uuid4().hex,
            "created_at": utc_now(),
        }
        try:
            store.create(ROOT_MARKER, canonical_json(candidate))
            marker = candidate
        except AlreadyExistsError:
            marker = read_root_marker(store)
    if marker is None:
        raise FormatError(f"{store.key_url(ROOT_MARKER)}: root marker vanished")
    if dataset_id is not None and marker["dataset_id"] != dataset_id:
        raise ConflictError(
            f"{store.url} already holds a different dataset (id {marker['dataset_id']}, expected {dataset_id})"
        )
    return marker


def require_root(store: Store, state: RootState) -> None:
    """Refuse to read a location that has no commits and no root marker: a wrong URL or folder
    (:class:`NotFoundError`: no root, so no version either)."""
    if state.seq == 0 and not state.versions and read_root_marker(store) is None:
        raise NotFoundError(f"no shardlake root at {store.url}")
