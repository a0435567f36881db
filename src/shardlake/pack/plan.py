"""The first pack stages: settings (options + base), discover the source, plan the builds.

``resolve_settings`` checks the options, the root, the new tag and ``--base`` before any work;
``scan_source`` fingerprints the source (stat only); ``plan_builds`` decides, per partition,
reuse from the base, carry-over (outside a scoped pack), drop, or build.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import SourceError, UsageError, VersionNotFoundError
from ..format.documents import PartitionEntry, VersionRecord
from ..format.layout import check_name
from ..meta.publish import prepare_publish
from ..meta.state import RootState
from ..meta.versions import StoredVersion, load_version
from ..source.pathlists import PathEntry, source_npz_paths
from ..source.tree import PartitionRule, SourceTree, discover, read_path_list
from ..store import Store
from .build import BuildTask, Recipe
from .options import PackOptions
from .revisions import manifest_revision

__all__ = [
    "PackPlan",
    "PackSettings",
    "check_options",
    "check_recipe_options",
    "plan_builds",
    "recipe_over",
    "resolve_root",
    "resolve_settings",
    "scan_source",
]


@dataclass(frozen=True)
class PackSettings:
    """What a pack resolved before touching the source: root state, base, recipe and rule."""

    state: RootState
    base_version: StoredVersion | None
    recipe: Recipe
    base_recipe: Recipe
    rule: PartitionRule
    namespace: str
    scoped: bool  # --path-list / --partition: base partitions outside the scope carry over

    @property
    def base_record(self) -> VersionRecord | None:
        return self.base_version.record if self.base_version is not None else None

    @property
    def base_entries(self) -> tuple[PartitionEntry, ...]:
        return self.base_version.entries if self.base_version is not None else ()


@dataclass
class PackPlan:
    """Builds to run plus the version entries already decided without building."""

    tasks: list[BuildTask] = field(default_factory=list)
    entries: dict[str, PartitionEntry] = field(default_factory=dict)  # partition id -> entry
    reused: list[str] = field(default_factory=list)
    carried: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def check_options(source: str | os.PathLike[str], tag: str, opts: PackOptions) -> None:
    """Refuse bad options with one line, before opening anything (the tag's name: its one
    check on the pack path)."""
    check_name("tag", tag)
    check_recipe_options(opts.shard_size, opts.level)
    if opts.replace_all and (opts.path_list is not None or opts.partitions is not None):
        raise UsageError(
            "replace_all rebuilds every partition; it cannot be combined with a path_list or "
            "partitions",
            options=("replace_all", "path_list", "partitions"),
        )
    if not os.path.isdir(source):
        raise SourceError(f"{source}: source is not a directory")


def check_recipe_options(shard_size: int | None, level: int | None) -> None:
    """Refuse a recipe setting out of range (pack's and the writers' options)."""
    if shard_size is not None and shard_size < 1:
        raise UsageError("shard_size must be >= 1 byte", options=("shard_size",))
    if level is not None and not 1 <= level <= 22:
        raise UsageError("the zstd level must be between 1 and 22", options=("level",))


def check_apart(source: str | os.PathLike[str], store: Store) -> None:
    """Refuse a root inside its own source tree, or a source inside the root (symlinks resolved).

    Either way one pass would read what the other writes (and a root's gc scope would cover the
    source's files).
    """
    if store.protocol not in ("file", "local"):
        return  # sources are local directories; an object-store root cannot overlap one
    src = os.path.realpath(source)
    root = os.path.realpath(store.root)
    if root == src or root.startswith(src.rstrip(os.sep) + os.sep):
        raise UsageError(
            f"the root {root} is inside the source tree {src}; put the root outside the source"
        )
    if src.startswith(root.rstrip(os.sep) + os.sep):
        raise UsageError(
            f"the source {src} is inside the root {root}; put the root outside the source"
        )


def resolve_root(
    store: Store, tag: str, base: str | None, *, allow_foreign: bool
) -> tuple[RootState, StoredVersion | None]:
    """What pack and the writers check once before writing (``tag``'s name was checked at
    their door): the root (made if new), ``tag`` not taken
    (:func:`~shardlake.meta.publish.prepare_publish`), and ``base`` loaded; ``(state, base
    version or None)``."""
    state = prepare_publish(store, tag, allow_foreign=allow_foreign)
    if base is None:
        return state, None
    try:
        return state, load_version(store, base, state)
    except VersionNotFoundError as exc:
        raise VersionNotFoundError(
            f"unknown base version {base!r}: {exc}", options=("base",), hint=exc.hint
        ) from exc


def recipe_over(
    base: Recipe, level: int | None, shard_size: int | None, seed: int | None
) -> Recipe:
    """``base`` with each setting that is given in its place."""
    return Recipe(
        level=base.level if level is None else level,
        shard_size=base.shard_size if shard_size is None else shard_size,
        seed=base.seed if seed is None else seed,
    )


def resolve_settings(
    store: Store, source: str | os.PathLike[str], tag: str, base: str | None, opts: PackOptions
) -> PackSettings:
    """Root, tag and base checked; the recipe and partition rule this pack uses."""
    check_apart(source, store)
    state, base_version = resolve_root(store, tag, base, allow_foreign=opts.allow_foreign)
    base_record = base_version.record if base_version is not None else None
    base_recipe = Recipe.from_json(base_record.recipe) if base_record else Recipe()
    rule = PartitionRule.from_options(opts.partition_depth, opts.partition_regex) or (
        PartitionRule.from_json(base_record.partition_rule) if base_record else PartitionRule()
    )
    recipe = recipe_over(base_recipe, opts.level, opts.shard_size, opts.seed)
    settings = PackSettings(
        state,
        base_version,
        recipe,
        base_recipe,
        rule,
        namespace=opts.source_namespace or os.path.abspath(source),
        scoped=opts.path_list is not None or opts.partitions is not None,
    )
    if base_record is not None and not opts.replace_all:
        _check_incremental(settings, base or "", base_record)
    return settings


def _check_incremental(settings: PackSettings, base: str, base_record: VersionRecord) -> None:
    """An incremental pack needs the base's partition rule, source location (and recipe if scoped)."""
    base_rule = PartitionRule.from_json(base_record.partition_rule)
    problems = []
    if base_rule != settings.rule:
        problems.append(
            f"partition rule changed ({base_rule.describe()} -> {settings.rule.describe()})"
        )
    if base_record.source_namespace != settings.namespace:
        problems.append(
            f"source location changed ({base_record.source_namespace} -> {settings.namespace})"
        )
    if problems:
        raise UsageError(
            f"cannot pack incrementally on base version {base!r}: {'; '.join(problems)}. "
            "Rebuild every partition (replace_all), or give the base's source_namespace if the "
            "same source was only relocated",
            options=("replace_all", "source_namespace"),
        )
    if settings.scoped and settings.recipe != settings.base_recipe:
        raise UsageError(
            "a scoped pack (path_list or partitions) must use the base's recipe "
            f"{settings.base_recipe.to_json()}",
            options=("shard_size", "level", "seed"),
        )


def scan_source(
    source: str | os.PathLike[str], rule: PartitionRule, opts: PackOptions
) -> SourceTree:
    """Pass 1: discover and fingerprint the source (stat only), checked packable."""
    paths: list[str] | None
    if opts.path_list is None:
        paths = None
    elif isinstance(opts.path_list, (str, os.PathLike)):
        paths = read_path_list(opts.path_list, source, strip_prefix=opts.strip_prefix)
    else:
        listed = [PathEntry(str(p), f"path_list[{i}]") for i, p in enumerate(opts.path_list)]
        paths = source_npz_paths(listed, source, strip_prefix=opts.strip_prefix)
    tree = discover(
        source,
        rule,
        path_list=paths,
        only_partitions=opts.partitions,
        include=opts.include,
        exclude=opts.exclude,
    )
    tree.check_packable(strict=opts.strict)
    if opts.require_sidecars:
        for part in tree.partitions.values():
            missing = part.missing_sidecars
            if missing:
                raise SourceError(
                    f"{tree.root / missing[0]}: no sidecar (sidecars are required; partition "
                    f"{part.path} ({part.id}) lacks {len(missing)})",
                    options=("require_sidecars",),
                )
    return tree


def plan_builds(
    store: Store, tree: SourceTree, settings: PackSettings, opts: PackOptions
) -> PackPlan:
    """Reuse unchanged base partitions, carry or drop the rest of the base, build the others."""
    plan = PackPlan()
    base_record = settings.base_record
    base_parts: dict[str, PartitionEntry] = {}
    if not opts.replace_all:
        base_parts = {e.id: e for e in settings.base_entries}
    reusable = (
        base_record is not None
        and not opts.replace_all
        and settings.recipe == settings.base_recipe
        and base_record.keep_skipped == opts.keep_skipped
    )
    for part in tree.partitions.values():
        old = base_parts.get(part.id)
        if (
            reusable
            and old is not None
            and old.source_fingerprint == part.fingerprint()
            and _whole(old)
        ):
            plan.entries[part.id] = old
            plan.reused.append(part.path)
        else:
            task = BuildTask(store, str(tree.root), part, settings.recipe, opts.keep_skipped)
            plan.tasks.append(task)
    for pid, old in base_parts.items():
        if pid in tree.partitions:
            continue
        if settings.scoped:
            plan.entries[pid] = old
            plan.carried.append(old.path)
        else:
            plan.dropped.append(old.path)
    return plan


def _whole(entry: PartitionEntry) -> bool:
    """Whether ``entry`` holds every sample its revision was packed with (its manifest is the
    revision's own). A subset manifest (``remove``, ``forget``) is not reused on an unchanged
    fingerprint: pack mirrors the source tree, so the partition is rebuilt from its files
    (cheap: the revision's shards and full manifest are found and reused)."""
    return entry.manifest_rev == manifest_revision(entry.data_rev, entry.meta_rev)
