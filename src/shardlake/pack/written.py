"""A write's settings and its publish: the options of ``Root.writer``, ``write_bag`` and
``import-wds``, resolved once against the root and the base, and the built partitions published
over the base (carried unless rewritten or deleted, never a key twice).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from ..errors import SourceError, UsageError
from ..format.documents import PartitionEntry
from ..format.layout import check_name
from ..meta.leases import Lease
from ..meta.publish import VersionBody
from ..meta.state import RootState
from ..meta.versions import StoredVersion
from ..options import options_class
from ..read.manifests import read_entry_manifest
from ..source.tree import PartitionRule
from ..store import Store
from .build import BuildResult, Recipe
from .packer import PackReport
from .plan import check_recipe_options, recipe_over, resolve_root
from .publish import publish
from .samples import PARENT_RULE, rule_owner

__all__ = [
    "DEFAULT_BUILD_WORKERS",
    "WriteOptions",
    "WriteSettings",
    "publish_written",
    "resolve_write_settings",
]

DEFAULT_BUILD_WORKERS = 4


@options_class
@dataclass(frozen=True)
class WriteOptions:
    """How :meth:`Root.writer <shardlake.Root.writer>` and ``write_bag`` write.

    Parameters
    ----------
    shard_size, level, seed
        The recipe (target shard bytes, zstd level, in-partition shuffle seed), as pack's.
        Default: the base version's recipe, else pack's defaults. With a base they must equal
        the base's (carried partitions were made with it).
    keep_skipped
        Keep samples whose ``meta`` says ``is_skipped: true`` (left out by default, as pack does).
    workers
        Partitions built in parallel (threads) when the writer closes.
    encode_threads
        Threads encoding and verifying samples (default 1: in :meth:`Writer.write` itself).
        Above 1, ``write`` checks the sample and returns while it is encoded: do not modify its
        arrays afterwards; an encoding error is raised by a later ``write`` or at the end, naming
        the key. Memory: at most ``2 * encode_threads`` samples in flight.
    spill_dir
        Local directory for the spill file of encoded payloads (default: the system temp dir).
        It holds the compressed samples until the writer closes. A writer starting here
        removes the spills of dead writer processes of this host.
    allow_foreign
        Publish the first version into a location holding objects shardlake did not write.
    progress
        Progress on stderr: samples written, then partitions built (``write_bag``: partition
        groups built on the cluster). None (default): only when stderr is a terminal.
    """

    shard_size: int | None = None
    level: int | None = None
    seed: int | None = None
    keep_skipped: bool = False
    workers: int | None = None
    encode_threads: int = 1
    spill_dir: str | os.PathLike[str] | None = None
    allow_foreign: bool = False
    progress: bool | None = None


@dataclass(frozen=True)
class WriteSettings:
    """Root state, base and recipe, resolved before the first sample."""

    state: RootState
    base_version: StoredVersion | None
    recipe: Recipe

    @property
    def rule(self) -> PartitionRule | None:
        """The base's partition rule, which places every key written over it; None without a
        base (a key's parent path, or ``partition=``)."""
        if self.base_version is None:
            return None
        return PartitionRule.from_json(self.base_version.record.partition_rule)


def resolve_write_settings(
    store: Store, tag: str, base: str | None, opts: WriteOptions
) -> WriteSettings:
    """Check the options, the root, the new tag and the base; the recipe to write with."""
    check_recipe_options(opts.shard_size, opts.level)
    check_name("tag", tag)  # the writers' door: the tag's one name check, before any request
    state, base_version = resolve_root(store, tag, base, allow_foreign=opts.allow_foreign)
    base_recipe = Recipe.from_json(base_version.record.recipe) if base_version else Recipe()
    recipe = recipe_over(base_recipe, opts.level, opts.shard_size, opts.seed)
    if base_version is not None and recipe != base_recipe:
        raise UsageError(
            f"writing on base {base!r} uses its recipe {base_recipe.to_json()} (its partitions "
            "are carried forward); leave shard_size, level and seed unset",
            options=("shard_size", "level", "seed"),
        )
    return WriteSettings(state, base_version, recipe)


def _ancestors(path: str) -> Iterator[str]:
    parts = path.split("/")
    for i in range(1, len(parts)):
        yield "/".join(parts[:i])


def _check_no_key_twice(
    store: Store, written: Mapping[str, PartitionEntry], carried: list[PartitionEntry]
) -> None:
    """Refuse a written key that a carried base partition also holds. Under a rule that
    describes the base it cannot happen; a base whose keys were placed by ``partition=`` may
    hold ``a/b/c`` in ``a`` while the rule now gives ``a/b``. Only partitions nested in one
    another can share keys that way, so only their manifests are read (usually none)."""
    carried_by_path = {e.path: e for e in carried}
    pairs = [(p, q) for p in written for q in _ancestors(p) if q in carried_by_path]
    pairs += [(p, q) for q in carried_by_path for p in _ancestors(q) if p in written]
    keys: dict[str, set[str]] = {}

    def keys_of(entry: PartitionEntry) -> set[str]:
        if entry.path not in keys:
            table, _meta = read_entry_manifest(store, entry)
            keys[entry.path] = set(table.column("key").to_pylist())
        return keys[entry.path]

    for p, q in pairs:
        both = keys_of(written[p]) & keys_of(carried_by_path[q])
        if both:
            key = sorted(both)[0]
            raise SourceError(
                f"sample {key!r} (and {len(both) - 1} more) written to partition {p!r} is also "
                f"in the base's partition {q!r}, which is carried: a key may be in one partition "
                f"only; rewrite or delete_partition({q!r}); nothing was published"
            )


def publish_written(
    store: Store,
    tag: str,
    settings: WriteSettings,
    results: list[BuildResult],
    *,
    deleted: set[str] | frozenset[str] = frozenset(),
    keep_skipped: bool = False,
    skipped: int = 0,
    started: float | None = None,
    lease: Lease | None = None,
) -> PackReport:
    """Publish the built partitions over the base (carried unless rewritten or deleted)."""
    base = settings.base_version
    base_entries: dict[str, PartitionEntry] = {e.path: e for e in base.entries} if base else {}
    entries: dict[str, PartitionEntry] = {}
    built: list[str] = []
    manifest_only: list[str] = []
    resumed: list[str] = []
    reused: list[str] = []
    for result in results:
        entry = result.entry
        if entry.path in entries:
            raise SourceError(f"partition {entry.path!r} was built twice")
        entries[entry.path] = entry
        old = base_entries.get(entry.path)
        if old is not None and old.manifest == entry.manifest:
            reused.append(entry.path)
        elif result.built:
            built.append(entry.path)
        elif result.manifest_written:
            manifest_only.append(entry.path)
        else:
            resumed.append(entry.path)
    rule = settings.rule
    # A base partition is replaced (or deleted) with the partition its keys belong to under
    # the base's rule, so no key is in the new version twice.
    carried = [
        p
        for p in base_entries
        if p not in entries
        and p not in deleted
        and rule_owner(p, rule) not in entries
        and rule_owner(p, rule) not in deleted
    ]
    dropped_by_rule = [
        p for p in base_entries if p not in entries and p not in deleted and p not in carried
    ]
    _check_no_key_twice(store, {p: entries[p] for p in entries}, [base_entries[p] for p in carried])
    for path in carried:
        entries[path] = base_entries[path]
    if not entries:
        raise SourceError(f"version {tag!r} would hold no partitions; nothing was published")
    record = base.record if base is not None else None
    body = VersionBody(
        tag=tag,
        base=base.tag if base is not None else None,
        partitions=tuple(entries[p] for p in sorted(entries)),
        recipe=settings.recipe.to_json(),
        partition_rule=record.partition_rule if record else PARENT_RULE.to_json(),
        source_namespace=record.source_namespace if record else None,
        keep_skipped=keep_skipped,
    )
    operation = lease.op if lease is not None else "writer"  # named in a conflict
    version = publish(store, body, settings.state, lease, operation)
    return PackReport(
        version,
        built=built,
        manifest_only=manifest_only,
        resumed=resumed,
        reused=reused,
        carried=carried,
        dropped=sorted({*deleted, *dropped_by_rule}),
        skipped_samples=skipped,
        seconds=time.monotonic() - started if started is not None else 0.0,
    )
