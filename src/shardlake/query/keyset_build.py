"""Making keysets: the samples of a version selected by ``where``, ``keys`` or a key-list file
(the query half of :mod:`shardlake.meta.keysets`, which stores and reads them)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..errors import SHOW_MAX, ConflictError, SelectionError, SourceError
from ..format.layout import check_name, keyset_key
from ..meta.diff import compare_versions
from ..meta.keysets import (
    Keyset,
    is_retired,
    load_keyset,
    load_keyset_bytes,
    publish_keyset,
)
from ..meta.versions import load_version, load_version_by_hash
from ..progress.bar import plural
from ..source import pathlists
from ..store import Store
from .dataset import Dataset, resolve_version
from .selection import in_listed_order

__all__ = [
    "DisjointReport",
    "KeysetReport",
    "create_keyset",
    "keyset_overlap",
    "rebase_keyset",
]


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
    # In the list's order: a keyset keeps it (the loader's unshuffled and "torch" orders).
    return in_listed_order(
        selection.rows(["key", "partition"], allow_missing=None), selection.wanted_keys()
    )


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
    store: Store,
    name: str,
    *,
    version: str = "latest",
    where: str | None = None,
    keys: Sequence[str] | None = None,
    key_file: str | None = None,
    strip_prefix: str | None = None,
    allow_unmatched: int | None = None,
) -> Keyset:
    """Select samples of ``version`` by ``where``, ``keys`` or ``key_file`` and publish keyset
    ``name``.

    Exactly one of the three (``key_file``: see :meth:`Dataset.keys_from_file`). Refused with
    :class:`ConflictError` if the name is taken (keysets are immutable); nothing is written on
    any error. An unmatched entry of ``key_file`` that names a local npz marked
    ``is_skipped`` is named as such.
    """
    check_name("keyset", name)
    if sum(x is not None for x in (where, keys, key_file)) != 1:
        raise SelectionError(
            "give exactly one of where, keys and key_file", options=("where", "keys", "key_file")
        )
    if allow_unmatched is not None and allow_unmatched < 0:
        raise SelectionError("allow_unmatched must be >= 0", options=("allow_unmatched",))
    key = keyset_key(name)
    existing = _existing(store, name)
    ds = Dataset(store, resolve_version(store, version))
    unmapped: Sequence[str] = ()
    local_paths: Mapping[str, str] = {}
    if key_file is not None:
        listed = ds.keys_from_file(key_file, strip_prefix=strip_prefix)
        keys, unmapped, local_paths = listed.keys, listed.unmapped, listed.local_paths
    if where is not None:
        rows = ds.select(where=where).rows(["key", "partition"]).sort_by("key")
        recipe: dict[str, Any] = {"where": where}
    else:
        keys = keys or []
        rows = match_keys(
            ds, keys, unmapped, allow_unmatched=allow_unmatched, local_paths=local_paths
        )
        recipe = {"keys": len(keys), "unmatched": len(unmapped) + len(keys) - rows.num_rows}
    if existing is not None:
        if _same(existing, rows, ds.version.hash):
            return existing  # the same selection again: nothing to do
        raise ConflictError(
            f"{store.key_url(key)}: keyset {name!r} already exists with a different selection "
            f"(bound to {existing.version_tag!r}, {plural(len(existing), 'sample')}); keysets are "
            f"immutable: choose a new name, or retire it first (Root.keysets.delete)",
            hint=f"to retire it: shardlake keyset ROOT delete {name}",
        )
    return publish_keyset(store, name, rows, ds.version, recipe)


def _existing(store: Store, name: str) -> Keyset | None:
    """The live keyset ``name``; a retired one still there is removed (its delete was cut
    short), so the name can be used again."""
    try:
        keyset = load_keyset_bytes(store, name)[0]
    except FileNotFoundError:
        return None
    if is_retired(store, keyset):
        store.delete(keyset_key(name))
        return None
    return keyset


def _same(keyset: Keyset, rows: pa.Table, version_hash: str) -> bool:
    """Whether ``rows`` select what ``keyset`` holds (in any order: one made before keysets
    kept their list's order is sorted by key)."""
    if keyset.version_hash != version_hash or len(keyset) != rows.num_rows:
        return False
    ordered = rows.select(["key", "partition"]).sort_by("key")
    keys: list[str] = ordered.column("key").to_pylist()
    parts: list[str] = ordered.column("partition").to_pylist()
    held = sorted(zip(keyset.keys, keyset.partitions, strict=True))
    return list(zip(keys, parts, strict=True)) == held


@dataclass(frozen=True)
class KeysetReport:
    """What :func:`rebase_keyset` did: keyset ``name`` (from ``source``) bound to ``version``.

    ``kept``: keys the version still has (all in the new keyset); ``dropped``: keys it no
    longer has; ``changed``: kept keys whose payload bytes differ in the new version."""

    name: str
    source: str
    version: str
    version_hash: str
    kept: int
    dropped: int
    changed: int
    dropped_keys: list[str]
    changed_keys: list[str]
    rebased_from: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "version": self.version,
            "version_hash": self.version_hash,
            "kept": self.kept,
            "dropped": self.dropped,
            "changed": self.changed,
            "dropped_keys": self.dropped_keys[:SHOW_MAX],
            "changed_keys": self.changed_keys[:SHOW_MAX],
            "rebased_from": self.rebased_from,
        }


def rebase_keyset(
    store: Store,
    name: str,
    version: str,
    *,
    new_name: str,
    strict: bool = False,
) -> KeysetReport:
    """Publish keyset ``new_name`` bound to ``version``: the keys of keyset ``name`` that
    version still has. Keyset ``name`` is never modified. ``strict``: a dropped or changed key
    fails (:class:`SelectionError`) and nothing is written.

    Reads the two versions' partitions tables and the catalog rows of the partitions that
    differ between them (:func:`shardlake.meta.diff.compare_versions`)."""
    check_name("keyset", new_name)
    source = load_keyset(store, name)
    old = load_version_by_hash(store, source.version_tag, source.version_hash)
    new = load_version(store, version)
    cmp = compare_versions(store, old, new)
    dropped = [k for k in source.keys if k in cmp.removed_keys]
    changed = [k for k in source.keys if k in cmp.changed_keys]
    if strict and (dropped or changed):
        shown = ", ".join(repr(k) for k in (dropped + changed)[:SHOW_MAX])
        raise SelectionError(
            f"keyset {name!r} in version {new.tag!r}: {plural(len(dropped), 'key')} dropped, "
            f"{len(changed)} changed, refused as strict: {shown}; rebase without strict to "
            f"carry the {plural(len(source.keys) - len(dropped), 'key')} it still has (dropped ones are "
            "left out, changed ones kept), or pick a version that has them all",
            hint=f"shardlake keyset ROOT rebase {name} --version {new.tag} --as {new_name} "
            "without --strict",
        )
    gone = set(dropped)
    keys = [k for k in source.keys if k not in gone]
    parts = [
        cmp.new_partition_of.get(k, p)
        for k, p in zip(source.keys, source.partitions, strict=True)
        if k not in gone
    ]
    rows = pa.table({"key": pa.array(keys, pa.string()), "partition": pa.array(parts, pa.string())})
    origin = f"{name}@{source.version_hash}"
    existing = _existing(store, new_name)
    if existing is not None:
        if not (_same(existing, rows, new.hash) and existing.rebased_from == origin):
            raise ConflictError(
                f"{store.key_url(keyset_key(new_name))}: keyset {new_name!r} already exists; "
                f"choose a new name, or retire it first (Root.keysets.delete)",
                hint=f"to retire it: shardlake keyset ROOT delete {new_name}",
            )
        made = existing
    else:
        recipe = {"rebased_from": origin}
        made = publish_keyset(store, new_name, rows, new, recipe, rebased_from=origin)
    return KeysetReport(
        name=made.name,
        source=name,
        version=new.tag,
        version_hash=new.hash,
        kept=len(keys),
        dropped=len(dropped),
        changed=len(changed),
        dropped_keys=dropped,
        changed_keys=changed,
        rebased_from=origin,
    )


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


def keyset_overlap(store: Store, a: str, b: str) -> DisjointReport:
    """Compare two keysets' keys; ``overlap`` counts keys in both (first 20 as examples)."""
    ka, kb = load_keyset(store, a), load_keyset(store, b)
    both = sorted(set(ka.keys).intersection(kb.keys))
    return DisjointReport(a, b, len(both), both[:SHOW_MAX], ka.version_hash == kb.version_hash)
