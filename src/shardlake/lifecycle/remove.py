"""``remove``: publish a new version without some partitions or samples.

Dropping partitions only edits the version document. Dropping samples from a partition writes a
new manifest revision next to the existing shards (the rows that stay keep their shard, member,
offset and size) - never new shards. Other versions are untouched; the removed bytes stay until
no version references them and ``gc`` runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import SHOW_MAX, AlreadyExistsError, NotFoundError, SelectionError, UsageError
from ..format.documents import PartitionEntry
from ..format.layout import DATA_DIR, check_name, manifest_key, short_hash
from ..format.manifest import ManifestMeta, write_manifest
from ..meta.commits import read_state
from ..meta.gcwait import commit_beside_gc
from ..meta.leases import Lease
from ..meta.publish import VersionBody, check_tag_free, publish_version
from ..meta.rootmarker import ensure_root
from ..meta.state import RootState
from ..meta.versions import StoredVersion, load_version
from ..options import options_class
from ..progress.bar import plural
from ..query.dataset import Dataset
from ..read.manifests import read_entry_manifest, read_manifest
from ..source.sidecar import skipped_note
from ..store import Store

__all__ = [
    "RemoveOptions",
    "RemoveReport",
    "remove",
]


def _new_manifest(
    store: Store, entry: PartitionEntry, keep: pa.Table, meta: ManifestMeta, removed: list[str]
) -> PartitionEntry:
    """Write the manifest revision holding ``keep`` and return the updated version entry."""
    # The revision names its parent and exactly what was removed, so the same removal on the
    # same revision is the same object (a re-run after a conflict reuses it).
    # The "r" prefix sorts removal revisions after pack's hex revisions in a revision directory,
    # where pack's reuse path looks for the full manifest first.
    manifest_rev = "r" + short_hash("remove", meta.manifest_rev, *sorted(removed), length=23)
    key = manifest_key(entry.id, entry.data_rev, manifest_rev)
    new_meta = ManifestMeta(
        meta.partition_id,
        meta.partition_path,
        meta.data_rev,
        meta.meta_rev,
        manifest_rev,
        meta.recipe,
        meta.format_version,
    )
    keep = keep.replace_schema_metadata(None)
    try:
        store.create(key, write_manifest(keep, new_meta))
    except AlreadyExistsError:
        table, existing = read_manifest(store, key)
        if existing.manifest_rev != manifest_rev or table.num_rows != keep.num_rows:
            raise
    return replace(
        entry,
        manifest_rev=manifest_rev,
        manifest=key,
        samples=keep.num_rows,
        payload_bytes=int(pc.sum(keep.column("size")).as_py() or 0),
    )


class RemoveReport(NamedTuple):
    """What :func:`remove` published: the new version and what it left out."""

    version: StoredVersion
    counts: dict[str, int]  # partitions_removed, samples_removed, manifests_written

    def to_json(self) -> dict[str, Any]:
        v = self.version
        return {"tag": v.tag, "version": v.hash, "samples": v.samples, **self.counts}

    def summary(self) -> str:
        v, c = self.version, self.counts
        return (
            f"published {v.tag} ({v.hash}): {plural(v.samples, 'sample')}; removed "
            f"{plural(c['samples_removed'], 'sample')}, {plural(c['partitions_removed'], 'partition')}; "
            f"{plural(c['manifests_written'], 'new manifest revision')}, no new shards"
        )


@options_class
@dataclass(frozen=True)
class RemoveOptions:
    """What ``remove`` leaves out of the new version: exactly one of ``partitions``, ``keys``,
    ``where`` and ``key_file``.

    Parameters
    ----------
    base
        The version the new one is made from (a tag or ``latest``).
    partitions
        Partitions to drop, each by id or by path.
    keys
        Sample keys to drop.
    where
        Drop the samples matching this SQL expression over the manifest columns.
    key_file
        A local key list naming the samples to drop (text, or a JSON list of keys or ``.npz``
        paths; ``-`` is stdin).
    strip_prefix
        Maps absolute paths of ``key_file`` to keys (default: the base's source namespace).
    """

    base: str = "latest"
    partitions: Sequence[str] | None = None
    keys: Sequence[str] | None = None
    where: str | None = None
    key_file: str | None = None
    strip_prefix: str | None = None


def remove(store: Store, tag: str, options: RemoveOptions) -> RemoveReport:
    """Publish ``tag``: the base version without some partitions or samples
    (:class:`RemoveOptions`). Returns the new version and counts (``partitions_removed``,
    ``samples_removed``, ``manifests_written``). Unknown partitions or keys are refused before
    anything is written; a version that would be empty is refused; a racing writer yields
    :class:`ConflictError`."""
    base, partitions, keys = options.base, options.partitions, options.keys
    where, key_file, strip_prefix = options.where, options.key_file, options.strip_prefix
    chosen = [x is not None for x in (partitions, keys, where, key_file)]
    if sum(chosen) != 1:
        raise UsageError(
            "remove takes exactly one of partitions, keys, key_file and where",
            options=("partitions", "keys", "key_file", "where"),
        )
    check_name("tag", tag)  # remove's door: the tag's one name check
    state = read_state(store)  # the base of the commit; a racing commit makes the publish fail
    check_tag_free(state, tag, store)
    base_version = load_version(store, base, state)
    # Once, before any manifest is written: the marker read, create-if-absent proven (after
    # the base loaded, so a wrong location is refused as no root, not made one).
    ensure_root(store)
    ds = Dataset(store, base_version)
    entries = {e.id: e for e in base_version.entries}
    dropped_parts: set[str] = set()
    removed_by_part: dict[str, list[str]] = {}
    if key_file is not None:
        keys = _keys_of_file(ds, key_file, strip_prefix)
    if partitions is not None:
        # by id or by path, as pack's --partition and diff's listing name them
        by_path = {e.path: e.id for e in base_version.entries}
        unknown = [p for p in partitions if p not in entries and p not in by_path]
        if unknown:
            raise NotFoundError(
                f"{store.url}: version {base_version.tag!r} has no partition(s) "
                + ", ".join(repr(p) for p in unknown[:SHOW_MAX])
                + " (neither an id nor a path of its partitions)"
            )
        dropped_parts = {p if p in entries else by_path[p] for p in partitions}
    else:
        hit = _selected_rows(ds, keys, where)
        for key, pid in zip(
            hit.column("key").to_pylist(), hit.column("partition").to_pylist(), strict=True
        ):
            removed_by_part.setdefault(pid, []).append(key)
    return _publish_without(
        store, state, tag, base_version, entries, dropped_parts, removed_by_part
    )


def _keys_of_file(ds: Dataset, key_file: str, strip_prefix: str | None) -> list[str]:
    listed = ds.keys_from_file(key_file, strip_prefix=strip_prefix)
    if listed.unmapped:
        prefix = strip_prefix or ds.version.record.source_namespace
        raise NotFoundError(
            f"{len(listed.unmapped)} entr{'y' if len(listed.unmapped) == 1 else 'ies'} of "
            f"{key_file} do not start with {prefix}: "
            + ", ".join(repr(e) for e in listed.unmapped[:SHOW_MAX]),
            options=("strip_prefix",),
        )
    return listed.keys


def _selected_rows(ds: Dataset, keys: Sequence[str] | None, where: str | None) -> pa.Table:
    """The (key, partition) rows to remove; unknown keys are refused, naming them."""
    selection = ds.select(keys=keys, where=where)
    unknown = selection.missing()
    if unknown:
        note = skipped_note(ds.version.record)
        raise NotFoundError(
            f"{ds.store.url}: version {ds.version.tag!r} has no sample(s) "
            + ", ".join(repr(k) for k in unknown[:SHOW_MAX])
            + (f" (and {len(unknown) - SHOW_MAX} more)" if len(unknown) > SHOW_MAX else "")
            + (f" ({note})" if note else "")
        )
    return selection.rows(["key", "partition"])


def _publish_without(
    store: Store,
    state: RootState,
    tag: str,
    base_version: StoredVersion,
    entries: dict[str, PartitionEntry],
    dropped_parts: set[str],
    removed_by_part: dict[str, list[str]],
) -> RemoveReport:
    """Write the new manifest revisions and publish ``tag`` over ``state``, under a lease: gc
    keeps the manifests this run writes, its version record and catalog objects."""
    covers = [f"{DATA_DIR}/{pid}/" for pid in removed_by_part] + [f"versions/{tag}/", "catalog/"]
    with Lease(store, "remove", tag=tag, covers=covers):
        new_entries: list[PartitionEntry] = []
        samples_removed = 0
        manifests_written = 0
        for pid, entry in entries.items():
            if pid in dropped_parts:
                samples_removed += entry.samples
                continue
            removed = removed_by_part.get(pid)
            if not removed:
                new_entries.append(entry)
                continue
            table, meta = read_entry_manifest(store, entry)
            keys = pa.array(removed, pa.string())
            keep = table.filter(pc.invert(pc.is_in(table.column("key"), value_set=keys)))
            samples_removed += table.num_rows - keep.num_rows
            if keep.num_rows == 0:
                dropped_parts.add(pid)  # every sample removed: the partition goes
                continue
            new_entries.append(_new_manifest(store, entry, keep, meta, removed))
            manifests_written += 1
        if not new_entries:
            raise SelectionError(
                f"removing that would leave version {tag!r} empty; nothing published"
            )
        body = VersionBody.successor(
            base_version.header_doc,
            tag=tag,
            base=base_version.tag,
            partitions=new_entries,
            derived={
                "op": "remove",
                "from": base_version.tag,
                "partitions_removed": len(dropped_parts),
                "samples_removed": samples_removed,
            },
        )
        version = commit_beside_gc(
            store,
            state,
            lambda current: publish_version(store, body, current, operation="remove"),
            what="nothing was published by this run - re-run it",
        )
    counts = {
        "partitions_removed": len(dropped_parts),
        "samples_removed": samples_removed,
        "manifests_written": manifests_written,
    }
    return RemoveReport(version, counts)
