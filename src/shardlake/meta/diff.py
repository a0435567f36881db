"""What changed between two versions (``shardlake diff``), read from their catalogs.

Partitions are compared in the two partitions tables; catalog rows are read only for partitions
added, removed or whose manifest differs (another ``data_rev``, ``meta_rev``, or the same
revision with samples removed by ``remove``). Then one rule classifies, partition and sample
alike: a sample is **changed** when its payload bytes differ (``size``, ``crc32``, ``raw_size``;
not the source file's ``source_sha256``), **meta-changed** when only its sidecar differs; a
partition is **data-changed** when it gained, lost or changed a sample, **meta-changed** when
only sidecars differ, else unchanged. Two versions sharing one partitions table cost no row read
at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..format.documents import PartitionEntry
from ..format.layout import natural_key
from ..store import Store
from .catalog import load_catalog
from .commits import read_state
from .versions import StoredVersion, load_version

__all__ = [
    "VersionDiff",
    "compare_versions",
    "diff_tags",
]

# The per-sample columns that identify its payload bytes: a sample is "changed" when they
# differ. Not source_sha256: the same arrays from another file (a writer's canonical npz, a
# re-saved npz) are the same payload.
_PAYLOAD_COLUMNS = ["key", "partition", "size", "crc32", "raw_size"]
# Where the payload lies: differs when a partition is rebuilt, whatever changed. Every other
# column comes from the sidecar (``has_sidecar`` included).
_PLACE_COLUMNS = {"shard", "member", "offset", "size", "source_sha256"}


@dataclass(frozen=True)
class VersionDiff:
    """What changed from version ``from_tag`` to ``to_tag``.

    Partitions are named by path; ``data_changed``: a sample added, removed (``remove``
    included) or changed in it; ``meta_changed``: only sidecars differ. Samples ``changed``: the
    same key with different payload bytes (``size``, ``crc32``, ``raw_size``; not the source
    file); ``meta_changed``: the same payload bytes, a different sidecar. The key lists are
    filled only when asked for (``samples=True``).
    """

    from_tag: str
    from_hash: str
    to_tag: str
    to_hash: str
    added: list[str]
    removed: list[str]
    data_changed: list[str]
    meta_changed: list[str]
    unchanged: int
    samples_added: int
    samples_removed: int
    samples_changed: int
    added_keys: list[str] | None = None
    removed_keys: list[str] | None = None
    changed_keys: list[str] | None = None
    samples_meta_changed: int = 0
    meta_changed_keys: list[str] | None = None

    @property
    def identical(self) -> bool:
        return not (self.added or self.removed or self.data_changed or self.meta_changed)

    def to_json(self) -> dict[str, Any]:
        samples: dict[str, Any] = {
            "added": self.samples_added,
            "removed": self.samples_removed,
            "changed": self.samples_changed,
            "meta_changed": self.samples_meta_changed,
        }
        if self.added_keys is not None:
            samples["added_keys"] = self.added_keys
            samples["removed_keys"] = self.removed_keys
            samples["changed_keys"] = self.changed_keys
            samples["meta_changed_keys"] = self.meta_changed_keys
        return {
            "from": {"tag": self.from_tag, "hash": self.from_hash},
            "to": {"tag": self.to_tag, "hash": self.to_hash},
            "partitions": {
                "added": self.added,
                "removed": self.removed,
                "data_changed": self.data_changed,
                "meta_changed": self.meta_changed,
                "unchanged": self.unchanged,
            },
            "samples": samples,
        }


@dataclass
class Comparison:
    """The full comparison (what :class:`VersionDiff` and keyset rebase are made from)."""

    added: list[PartitionEntry] = field(default_factory=list)
    removed: list[PartitionEntry] = field(default_factory=list)
    data_changed: list[tuple[PartitionEntry, PartitionEntry]] = field(default_factory=list)
    meta_changed: list[tuple[PartitionEntry, PartitionEntry]] = field(default_factory=list)
    unchanged: int = 0
    added_keys: set[str] = field(default_factory=set)
    removed_keys: set[str] = field(default_factory=set)
    changed_keys: set[str] = field(default_factory=set)
    # the same payload, another sidecar (filled with ``meta=True`` only)
    meta_changed_keys: set[str] = field(default_factory=set)
    # key -> partition id in the newer version, for the keys of the partitions rows were read of
    new_partition_of: dict[str, str] = field(default_factory=dict)


def _payloads(table: pa.Table | None) -> dict[str, tuple[str, Any]]:
    """key -> (partition, payload identity) of catalog rows."""
    if table is None:
        return {}
    cols = {
        name: table.column(name).to_pylist()
        for name in _PAYLOAD_COLUMNS
        if name in table.column_names
    }
    n = table.num_rows
    keys, parts = cols["key"], cols["partition"]
    size = cols.get("size", [None] * n)
    crc = cols.get("crc32", [None] * n)
    raw = cols.get("raw_size", [None] * n)
    return {keys[i]: (parts[i], (size[i], crc[i], raw[i])) for i in range(n)}


def compare_versions(
    store: Store, a: StoredVersion, b: StoredVersion, *, meta: bool = False
) -> Comparison:
    """Compare ``a`` (older) with ``b``: partition entries, then rows of the differing ones
    (with ``meta``, every column of the partitions whose manifests differ, for
    ``meta_changed_keys`` and to tell a sidecar change from none)."""
    out = Comparison()
    ref_a, ref_b = a.header.catalog, b.header.catalog
    if (
        ref_a is not None
        and ref_b is not None
        and ref_a.partitions.sha256 == ref_b.partitions.sha256
    ):
        out.unchanged = a.partition_count  # one partitions table: nothing differs
        return out
    old = {e.id: e for e in a.entries}
    new = {e.id: e for e in b.entries}
    pairs: list[tuple[PartitionEntry, PartitionEntry]] = []
    for pid, entry in new.items():
        before = old.get(pid)
        if before is None:
            out.added.append(entry)
        elif _same_rows(before, entry):
            out.unchanged += 1
        else:
            pairs.append((before, entry))
    out.removed = [e for pid, e in old.items() if pid not in new]
    old_pids = [e.id for e in out.removed] + [o.id for o, _ in pairs]
    new_pids = [e.id for e in out.added] + [n.id for _, n in pairs]
    # Rows are read once per version: every column with ``meta`` (payloads and sidecars come
    # from the same read), else only the payload columns.
    before_table = _table(store, a, old_pids, meta)
    after_table = _table(store, b, new_pids, meta)
    before_rows, after_rows = _payloads(before_table), _payloads(after_table)
    out.new_partition_of = {k: part for k, (part, _) in after_rows.items()}
    out.added_keys = set(after_rows) - set(before_rows)
    out.removed_keys = set(before_rows) - set(after_rows)
    out.changed_keys = {
        k for k, (_, pay) in after_rows.items() if k in before_rows and before_rows[k][1] != pay
    }
    # A partition's data changed when its keys or their payloads differ (a key moved to
    # another partition changes both).
    was, now = _grouped(before_rows), _grouped(after_rows)
    touched = {n.id for o, n in pairs if was.get(o.id, {}) != now.get(n.id, {})}
    if meta:
        # every partition rows were read of: a key may have moved between partitions (a
        # writer without a base, another partition rule) with its sidecar changed
        before_meta, after_meta = _sidecars(before_table), _sidecars(after_table)
        out.meta_changed_keys = {
            k
            for k, row in after_meta.items()
            if k in before_meta and k not in out.changed_keys and not _same(before_meta[k], row)
        }
        sidecars = {after_rows[k][0] for k in out.meta_changed_keys}
    else:
        sidecars = {n.id for o, n in pairs if o.meta_rev != n.meta_rev}
    for before, entry in pairs:
        if entry.id in touched:
            out.data_changed.append((before, entry))
        elif entry.id in sidecars:
            out.meta_changed.append((before, entry))
        else:
            out.unchanged += 1  # another revision of the same payloads and sidecars
    return out


def _grouped(rows: dict[str, tuple[str, Any]]) -> dict[str, dict[str, Any]]:
    """partition id -> {key: payload identity}."""
    out: dict[str, dict[str, Any]] = {}
    for key, (part, pay) in rows.items():
        out.setdefault(part, {})[key] = pay
    return out


def _same_rows(a: PartitionEntry, b: PartitionEntry) -> bool:
    """Whether two entries name the same manifest (so the same rows): no row read needed."""
    return a.manifest == b.manifest and (
        a.manifest_sha256 == b.manifest_sha256 or not (a.manifest_sha256 and b.manifest_sha256)
    )


def _sidecars(table: pa.Table | None) -> dict[str, dict[str, Any]]:
    """key -> its sidecar columns, of catalog rows read with every column."""
    if table is None:
        return {}
    skip = {*_PAYLOAD_COLUMNS, *_PLACE_COLUMNS}
    names = [c for c in table.column_names if c not in skip]
    return {str(row.pop("key")): row for row in table.select(["key", *names]).to_pylist()}


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal sidecar rows: a column only one version has counts as null in the other; NaN
    equals NaN."""
    for name in a.keys() | b.keys():
        x, y = a.get(name), b.get(name)
        if x != y and not (x != x and y != y):  # NaN != NaN
            return False
    return True


def _table(
    store: Store, version: StoredVersion, pids: Sequence[str], every_column: bool
) -> pa.Table | None:
    """The catalog rows of ``pids`` (None: no partition asked for, nothing read)."""
    if not pids:
        return None
    return load_catalog(store, version).rows(None if every_column else _PAYLOAD_COLUMNS, pids)


def diff_tags(store: Store, a: str, b: str, *, samples: bool = False) -> VersionDiff:
    """:func:`diff_versions` of the live versions tagged ``a`` and ``b`` (one state read)."""
    state = read_state(store)
    return diff_versions(
        store, load_version(store, a, state), load_version(store, b, state), samples=samples
    )


def diff_versions(
    store: Store, a: StoredVersion, b: StoredVersion, *, samples: bool = False
) -> VersionDiff:
    """:class:`VersionDiff` of ``a`` -> ``b`` (key lists, sorted, with ``samples``)."""
    c = compare_versions(store, a, b, meta=True)

    def paths(entries: Sequence[PartitionEntry]) -> list[str]:
        return sorted((e.path for e in entries), key=natural_key)

    return VersionDiff(
        from_tag=a.tag,
        from_hash=a.hash,
        to_tag=b.tag,
        to_hash=b.hash,
        added=paths(c.added),
        removed=paths(c.removed),
        data_changed=paths([n for _, n in c.data_changed]),
        meta_changed=paths([n for _, n in c.meta_changed]),
        unchanged=c.unchanged,
        samples_added=len(c.added_keys),
        samples_removed=len(c.removed_keys),
        samples_changed=len(c.changed_keys),
        added_keys=sorted(c.added_keys) if samples else None,
        removed_keys=sorted(c.removed_keys) if samples else None,
        changed_keys=sorted(c.changed_keys) if samples else None,
        samples_meta_changed=len(c.meta_changed_keys),
        meta_changed_keys=sorted(c.meta_changed_keys) if samples else None,
    )
