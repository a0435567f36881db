"""What a forget touches: its options, the keys it selects, and the live versions and keysets
that hold them (every version's reach, computed before anything is written).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import SHOW_MAX, NotFoundError, SelectionError, UsageError
from ..executors.options import RunOptions
from ..format.layout import shard_key
from ..meta.catalog import load_catalog
from ..meta.keysets import Keyset, list_keysets, read_key_list
from ..meta.state import RootState
from ..meta.versions import StoredVersion, load_version_by_hash
from ..options import options_class
from ..query.dataset import Dataset
from ..store import Store
from .forget_shards import _member_keys, _new_data_rev

__all__ = [
    "UNREACHABLE",
    "ForgetOptions",
    "_Plan",
    "_check_options",
    "_plan",
]


# What a forget cannot erase: printed with every forget and in docs/runbook.md.
UNREACHABLE = (
    "exports and copies of this root made before the forget (shardlake export, clones, syncs)",
    "other nodes' epoch caches and catalog caches until they next open this root",
    "backups, bucket object versioning and soft-delete of the store",
    "loaders and processes that already read the samples into memory",
)


@options_class
@dataclass(frozen=True)
class ForgetOptions(RunOptions):
    """What ``forget`` erases: exactly one of ``keys``, ``key_file`` and ``where``; and why.

    Parameters
    ----------
    keys
        Sample keys to forget.
    key_file
        A local key list (text, or a JSON list of keys or ``.npz`` paths; ``-`` is stdin).
    where
        Forget the samples matching this SQL expression in any retained version.
    reason
        Why (an erasure request's reference, a licence withdrawal): recorded in the commit log
        and the receipt verbatim, so it must hold no personal data. Required.
    dry_run
        Only list the affected versions, keysets, counts and bytes to rewrite.
    strip_prefix
        Maps absolute paths of ``key_file`` to keys (default: the latest version's namespace).
    workers, executor, progress
        How it runs (:class:`~shardlake.RunOptions`: one rewrite task per shard, 4 threads by default).
    retries
        How often a commit lost to a racing writer is redone on top of it.
    """

    keys: Sequence[str] | None = None
    key_file: str | None = None
    where: str | None = None
    reason: str = ""
    dry_run: bool = False
    strip_prefix: str | None = None
    retries: int = 5


# --- planning --------------------------------------------------------------------------------


@dataclass
class _Retained:
    version: StoredVersion
    live: bool
    listed: pa.Table = field(repr=False)  # key, partition, shard of forgotten keys it lists


@dataclass
class _Plan:
    forgotten: set[str]
    unmatched: list[str]
    retained: list[_Retained]
    # old shard key -> (new shard key, forgotten keys it holds)
    shards: dict[str, tuple[str, set[str]]]
    shard_sizes: dict[str, int]
    affected: list[_Retained]
    keysets: list[Keyset]


def _retained(store: Store, state: RootState, keysets: Sequence[Keyset]) -> list[_Retained]:
    """Live versions in publish order, then pruned ones keysets are bound to."""
    out = [(load_version_by_hash(store, tag, h), True) for tag, h in state.versions.items()]
    live = set(state.versions.values())
    pinned = sorted(
        {(k.version_tag, k.version_hash) for k in keysets if k.version_hash not in live}
    )
    out += [(load_version_by_hash(store, tag, h), False) for tag, h in pinned]
    return [_Retained(v, is_live, pa.table({})) for v, is_live in out]


def _selected_keys(
    store: Store, retained: Sequence[_Retained], options: ForgetOptions
) -> list[str]:
    if options.where is not None:
        keys: dict[str, None] = {}
        for r in retained:
            try:
                rows = (
                    Dataset(store, r.version)
                    .select(where=options.where)
                    .rows(["key"], allow_missing=None)
                )
            except SelectionError as exc:
                if "is empty" in str(exc):
                    continue
                raise
            keys.update(dict.fromkeys(rows.column("key").to_pylist()))
        return list(keys)
    if options.key_file is not None:
        namespace = None
        if options.strip_prefix is None and retained:
            namespace = retained[-1].version.record.source_namespace
        listed = read_key_list(
            options.key_file, strip_prefix=options.strip_prefix, source=namespace
        )
        if listed.unmapped:
            raise NotFoundError(
                f"{len(listed.unmapped)} entr{'y' if len(listed.unmapped) == 1 else 'ies'} of "
                f"{options.key_file} map to no key: "
                + ", ".join(repr(e) for e in listed.unmapped[:SHOW_MAX]),
                options=("strip_prefix",),
            )
        return list(dict.fromkeys(listed.keys))
    return list(dict.fromkeys(options.keys or ()))


def _plan(store: Store, state: RootState, options: ForgetOptions) -> _Plan:
    keysets = list_keysets(store)
    retained = _retained(store, state, keysets)
    selected = _selected_keys(store, retained, options)
    wanted = pa.array(selected, pa.string())
    found: set[str] = set()
    # old shard key -> forgotten keys it holds (by the manifests that list them)
    holds: dict[str, set[str]] = {}
    listed_count: dict[str, set[str]] = {}  # shard key -> keys some retained version lists there
    members: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for r in retained:
        rows = load_catalog(store, r.version).rows(["key", "partition", "shard"])
        hit = rows.filter(pc.is_in(rows.column("key"), value_set=wanted))
        r.listed = hit
        by_id = {e.id: e for e in r.version.entries}
        for key, pid, shard in zip(
            hit.column("key").to_pylist(),
            hit.column("partition").to_pylist(),
            hit.column("shard").to_pylist(),
            strict=True,
        ):
            found.add(key)
            holds.setdefault(by_id[pid].shards[shard].key, set()).add(key)
        for entry in r.version.entries:
            for s in entry.shards:
                members[s.key] = s.members
                sizes[s.key] = s.size
        # Shards with members no version lists (left by remove) are read below.
        if any(sum(s.members for s in e.shards) > e.samples for e in r.version.entries):
            for key, pid, shard in zip(
                rows.column("key").to_pylist(),
                rows.column("partition").to_pylist(),
                rows.column("shard").to_pylist(),
                strict=True,
            ):
                listed_count.setdefault(by_id[pid].shards[shard].key, set()).add(key)
    # A shard with more members than the retained versions list there (remove leaves them)
    # may hold a selected key no manifest names: its member names are read.
    selected_set = set(selected)
    scanned: set[str] = set()
    for r in retained:
        for entry in r.version.entries:
            if sum(s.members for s in entry.shards) <= entry.samples:
                continue
            for s in entry.shards:
                if s.key in holds or s.key in scanned:
                    continue
                scanned.add(s.key)
                if len(listed_count.get(s.key, ())) >= s.members:
                    continue
                for key in _member_keys(store, s.key):
                    if key in selected_set:
                        holds.setdefault(s.key, set()).add(key)
                        found.add(key)
    unmatched = [k for k in selected if k not in found]
    shards: dict[str, tuple[str, set[str]]] = {}
    affected = []
    for r in retained:
        touched = False
        for entry in r.version.entries:
            if not any(s.key in holds for s in entry.shards):
                continue
            touched = True
            new_rev = _new_data_rev(entry, holds)
            for index, s in enumerate(entry.shards):
                if s.key in holds and s.key not in shards:
                    shards[s.key] = (shard_key(entry.id, new_rev, index), holds[s.key])
        if touched:
            affected.append(r)
    return _Plan(found, unmatched, retained, shards, sizes, affected, keysets)


# --- the operation ---------------------------------------------------------------------------


def _check_options(options: ForgetOptions) -> None:
    chosen = [x is not None for x in (options.keys, options.key_file, options.where)]
    if sum(chosen) != 1:
        raise UsageError(
            "forget takes exactly one of keys, key_file and where",
            options=("keys", "key_file", "where"),
        )
    if not options.reason.strip():
        raise UsageError(
            "forget needs a reason (recorded in the commit log and the receipt; no personal data)",
            options=("reason",),
        )
    options.worker_count()  # refuses a count below 1 before anything is read
