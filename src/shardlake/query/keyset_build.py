"""Making keysets: the samples of a version selected by ``where``, ``keys`` or a key-list file
(the query half of :mod:`shardlake.meta.keysets`, which stores and reads them)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..errors import ConflictError, SelectionError, SourceError
from ..format.layout import check_name, keyset_key
from ..meta.keysets import SHOW_MAX, Keyset, load_keyset, publish_keyset, read_key_list
from ..source import pathlists
from ..store import Store, open_store
from .dataset import Dataset, open_dataset


def keys_from_file(
    ds: Dataset, path: str, *, strip_prefix: str | None = None
) -> pathlists.KeyMapping:
    """The keys a local key-list file names in version ``ds`` (``-``: stdin).

    Absolute entries map to keys by ``strip_prefix`` or, without one, by the version's source
    namespace (the packed source's path), so a training list of absolute paths needs nothing
    more."""
    namespace = None if strip_prefix is not None else ds.version.record.source_namespace
    return read_key_list(path, strip_prefix=strip_prefix, source=namespace)


def match_keys(
    ds: Dataset,
    keys: Sequence[str],
    unmapped: Sequence[str] = (),
    *,
    allow_unmatched: int | None = None,
    local_paths: Mapping[str, str] | None = None,
) -> pa.Table:
    """The manifest rows (``key``, ``partition``) of ``keys`` in ``ds``.

    Every entry that matches no key (plus ``unmapped`` ones) counts as unmatched; unless
    ``allow_unmatched`` equals that count exactly, :class:`SelectionError` reports the count
    and the first 20, naming those that are ``is_skipped`` frames (known from the sidecar beside
    the listed file, ``local_paths``) and how many frames the version left out as skipped.
    """
    selection = ds.select(keys=keys)
    unmatched = list(unmapped) + selection.missing()
    if len(unmatched) != (allow_unmatched or 0):
        raise SelectionError(
            _unmatched_message(ds, unmatched, allow_unmatched, local_paths or {}),
            options=("allow_unmatched",),
        )
    return selection.rows(["key", "partition"], allow_missing=None)


def _unmatched_message(
    ds: Dataset, unmatched: list[str], allow: int | None, local_paths: Mapping[str, str]
) -> str:
    from ..source.sidecar import skipped_note

    skipped = {k for k in unmatched if k in local_paths and _is_skipped_frame(local_paths[k])}
    shown = ", ".join(
        repr(k) + (" (skipped frame)" if k in skipped else "") for k in unmatched[:SHOW_MAX]
    )
    what = (
        f"{len(unmatched)} entr{'y' if len(unmatched) == 1 else 'ies'} match no key in "
        f"version {ds.version.tag!r}"
    )
    notes = []
    if skipped:
        notes.append(f"{len(skipped)} of them are is_skipped frames")
    left_out = skipped_note(ds.version.record)
    if left_out:
        notes.append(left_out + ", or allow exactly that many unmatched entries")
    if allow is not None:
        notes.append(f"allow_unmatched is {allow}")
    if notes:
        what += " (" + "; ".join(notes) + ")"
    return what + (f": {shown}" if shown else "")


def _is_skipped_frame(npz_path: str) -> bool:
    """Whether the sidecar beside a listed local ``.npz`` says ``is_skipped`` (False if none)."""
    from ..source.sidecar import is_skipped, read_sidecar

    sidecar = npz_path[: -len(pathlists.NPZ)] + ".json"
    if not os.path.isfile(sidecar):
        return False
    try:
        return is_skipped(read_sidecar(sidecar))
    except SourceError:
        return False


def create_keyset(
    url: str | Store,
    name: str,
    *,
    version: str = "latest",
    where: str | None = None,
    keys: Sequence[str] | None = None,
    key_file: str | None = None,
    strip_prefix: str | None = None,
    unmapped: Sequence[str] = (),
    allow_unmatched: int | None = None,
    storage_options: dict[str, Any] | None = None,
    local_paths: Mapping[str, str] | None = None,
) -> Keyset:
    """Select samples of ``version`` by ``where``, ``keys`` or ``key_file`` and publish keyset
    ``name``.

    Exactly one of the three (``key_file``: see :func:`keys_from_file`). Refused with
    :class:`ConflictError` if the name is taken (keysets are immutable); nothing is written on
    any error. ``local_paths`` (key -> listed local npz) lets an unmatched key be named as an
    ``is_skipped`` frame.
    """
    check_name("keyset", name)
    if sum(x is not None for x in (where, keys, key_file)) != 1:
        raise SelectionError(
            "give exactly one of where, keys and key_file", options=("where", "keys", "key_file")
        )
    if allow_unmatched is not None and allow_unmatched < 0:
        raise SelectionError("allow_unmatched must be >= 0", options=("allow_unmatched",))
    store = open_store(url, storage_options)
    key = keyset_key(name)
    if store.exists(key):
        raise ConflictError(
            f"{store.key_url(key)}: keyset {name!r} already exists; keysets are immutable"
        )
    ds = open_dataset(store, version)
    if key_file is not None:
        listed = keys_from_file(ds, key_file, strip_prefix=strip_prefix)
        keys, unmapped, local_paths = listed.keys, listed.unmapped, listed.local_paths
    if where is not None:
        rows = ds.select(where=where).rows(["key", "partition"])
        recipe: dict[str, Any] = {"where": where}
    else:
        keys = keys or []
        rows = match_keys(
            ds, keys, unmapped, allow_unmatched=allow_unmatched, local_paths=local_paths
        )
        recipe = {"keys": len(keys), "unmatched": len(unmapped) + len(keys) - rows.num_rows}
    return publish_keyset(store, name, rows, ds.version, recipe)


@dataclass(frozen=True)
class DisjointReport:
    a: str
    b: str
    overlap: int
    examples: list[str]
    same_version: bool

    @property
    def disjoint(self) -> bool:
        return self.overlap == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "disjoint": self.disjoint,
            "overlap": self.overlap,
            "examples": self.examples,
            "same_version": self.same_version,
        }


def keyset_overlap(
    url: str | Store, a: str, b: str, storage_options: dict[str, Any] | None = None
) -> DisjointReport:
    """Compare two keysets' keys; ``overlap`` counts keys in both (first 20 as examples)."""
    store = open_store(url, storage_options)
    ka, kb = load_keyset(store, a), load_keyset(store, b)
    both = sorted(set(ka.keys).intersection(kb.keys))
    return DisjointReport(a, b, len(both), both[:SHOW_MAX], ka.version_hash == kb.version_hash)
