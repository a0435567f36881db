"""``remove``: publish a new version without some partitions or samples.

Dropping partitions only edits the version document. Dropping samples from a partition writes a
new manifest revision next to the existing shards (the rows that stay keep their shard, member,
offset and size) - never new shards. Other versions are untouched; the removed bytes stay until
no version references them and ``gc`` runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .. import sql
from ..dataset import Dataset
from ..errors import AlreadyExistsError, NotFoundError, SelectionError, UsageError
from ..format.layout import manifest_key, short_hash
from ..format.manifest import ManifestMeta, read_entry_manifest, read_manifest, write_manifest
from ..pack.sidecar import skipped_note
from ..store import Store, open_store
from ..versions import Version, check_new_tag, load_version, publish_version, read_state

_DOC_FIELDS_SET_BY_PUBLISH = ("format", "format_version", "tag", "samples", "created_at")
SHOW_MAX = 20


def _new_manifest(
    store: Store, entry: dict[str, Any], keep: pa.Table, meta: ManifestMeta, removed: list[str]
) -> dict[str, Any]:
    """Write the manifest revision holding ``keep`` and return the updated version entry."""
    # The revision names its parent and exactly what was removed, so the same removal on the
    # same revision is the same object (a re-run after a conflict reuses it).
    # The "r" prefix sorts removal revisions after pack's hex revisions in a revision directory,
    # where pack's reuse path looks for the full manifest first.
    manifest_rev = "r" + short_hash("remove", meta.manifest_rev, *sorted(removed), length=23)
    key = manifest_key(entry["id"], entry["data_rev"], manifest_rev)
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
    out = dict(entry)
    out["manifest_rev"] = manifest_rev
    out["manifest"] = key
    out["samples"] = keep.num_rows
    out["payload_bytes"] = int(pc.sum(keep.column("size")).as_py() or 0)
    return out


def remove(
    url: str | Store,
    tag: str,
    *,
    base: str = "latest",
    partitions: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    where: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> tuple[Version, dict[str, int]]:
    """Publish ``tag``: ``base`` without ``partitions``, ``keys`` or the rows matching ``where``.

    Returns the new version and counts (``partitions_removed``, ``samples_removed``,
    ``manifests_written``). Unknown partitions or keys are refused before anything is written;
    a version that would be empty is refused; a racing writer yields :class:`ConflictError`.
    """
    chosen = [x is not None for x in (partitions, keys, where)]
    if sum(chosen) != 1:
        raise UsageError("give exactly one of --partition, --keys and --where")
    store = open_store(url, storage_options)
    state = read_state(store)  # the base of the commit; a racing commit makes the publish fail
    check_new_tag(state, tag, store)
    base_version = load_version(store, base, state)
    ds = Dataset(store, base_version)
    entries = {e["id"]: e for e in base_version.partitions}
    dropped_parts: set[str] = set()
    removed_by_part: dict[str, list[str]] = {}

    if partitions is not None:
        unknown = [p for p in partitions if p not in entries]
        if unknown:
            raise NotFoundError(
                f"{store.url}: version {base_version.tag!r} has no partition(s) "
                + ", ".join(repr(p) for p in unknown[:SHOW_MAX])
            )
        dropped_parts = set(partitions)
    else:
        table = ds.manifests(columns=None if where is not None else ["key", "partition"])
        if where is not None:
            hit = sql.select(table, where, columns=["key", "partition"])
        else:
            wanted = list(dict.fromkeys(keys or []))
            present = pc.is_in(table.column("key"), value_set=pa.array(wanted, pa.string()))
            hit = table.filter(present).select(["key", "partition"])
            if hit.num_rows != len(wanted):
                found = set(hit.column("key").to_pylist())
                unknown = [k for k in wanted if k not in found]
                note = skipped_note(base_version.doc)
                raise NotFoundError(
                    f"{store.url}: version {base_version.tag!r} has no sample(s) "
                    + ", ".join(repr(k) for k in unknown[:SHOW_MAX])
                    + (f" (and {len(unknown) - SHOW_MAX} more)" if len(unknown) > SHOW_MAX else "")
                    + (f" ({note})" if note else "")
                )
        if hit.num_rows == 0:
            raise SelectionError("the selection matches no sample; nothing to remove")
        for key, pid in zip(
            hit.column("key").to_pylist(), hit.column("partition").to_pylist(), strict=True
        ):
            removed_by_part.setdefault(pid, []).append(key)

    new_entries: list[dict[str, Any]] = []
    samples_removed = 0
    manifests_written = 0
    for pid, entry in entries.items():
        if pid in dropped_parts:
            samples_removed += int(entry["samples"])
            continue
        removed = removed_by_part.get(pid)
        if not removed:
            new_entries.append(entry)
            continue
        table, meta = read_entry_manifest(store, entry)
        mask = pc.invert(pc.is_in(table.column("key"), value_set=pa.array(removed, pa.string())))
        keep = table.filter(mask)
        samples_removed += table.num_rows - keep.num_rows
        if keep.num_rows == 0:
            dropped_parts.add(pid)  # every sample removed: the partition goes
            continue
        new_entries.append(_new_manifest(store, entry, keep, meta, removed))
        manifests_written += 1
    if not new_entries:
        raise SelectionError(f"removing that would leave version {tag!r} empty; nothing published")

    body = {k: v for k, v in base_version.doc.items() if k not in _DOC_FIELDS_SET_BY_PUBLISH}
    body["partitions"] = new_entries
    body["base"] = base_version.tag
    body["derived"] = {
        "op": "remove",
        "from": base_version.tag,
        "partitions_removed": len(dropped_parts),
        "samples_removed": samples_removed,
    }
    version = publish_version(store, tag, body, state)
    counts = {
        "partitions_removed": len(dropped_parts),
        "samples_removed": samples_removed,
        "manifests_written": manifests_written,
    }
    return version, counts
