"""``Root.write_bag``: a version written by a Dask cluster, published by the driver.

The records of a ``dask.bag.Bag`` are ``(key, arrays, meta)``. Each worker checks, encodes and
verifies its records (:func:`~shardlake.pack.writer.encode_record`, the writer's own step), the
bag is grouped by partition (a Dask shuffle of the compressed payloads), and one task per
partition builds its revision with pack's :func:`~shardlake.pack.build.build_revision`, writing
shards and manifest straight to the store. Only the small :class:`BuildResult` of each partition
comes back to the driver, which publishes one version, and only once every partition built and
verified; a failed build task is retried by Dask (``retries``), and a build that still fails
publishes nothing (finished revisions are reused by the next run, or left for gc).

Only the build tasks carry ``retries`` (a Dask annotation): their input is the grouped, materialised
records. A retried task that reads a lazy bag iterator would resume it where the failed attempt
stopped and silently lose records (Dask bag passes partitions as iterators); the encode step
therefore fails the whole write instead (its errors are about the data: a retry cannot help).

A partition task holds that partition's compressed payloads in memory (the grouped records).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import IntegrityError, ObjectsGoneError, SourceError, UsageError
from ..format.layout import DATA_DIR, partition_id
from ..meta.leases import Lease, gone_error
from ..source.tree import PartitionRule
from ..store import Store
from .build import BuildResult, EncodedSample, Recipe, RevisionSource, build_revision
from .packer import PackReport
from .writer import (
    EncodedRecord,
    WriteOptions,
    WriteSettings,
    encode_record,
    publish_written,
    resolve_write_settings,
)

__all__ = ["DEFAULT_RETRIES", "write_bag"]

DEFAULT_RETRIES = 2


def _encode_partition(
    records: Iterable[Any], level: int, keep_skipped: bool, rule: PartitionRule | None = None
) -> list[EncodedRecord]:
    return [_encode(record, level, keep_skipped, rule) for record in records]


def _encode(
    record: Any, level: int, keep_skipped: bool, rule: PartitionRule | None
) -> EncodedRecord:
    if not isinstance(record, (tuple, list)) or len(record) != 3:
        raise SourceError(
            f"write_bag: a record must be (key, arrays, meta), not {type(record).__name__}"
            + (f" of {len(record)}" if isinstance(record, (tuple, list)) else "")
        )
    key, arrays, meta = record
    return encode_record(key, arrays, meta, None, level, keep_skipped, rule=rule)


def _partition(record: EncodedRecord) -> str:
    return record.partition


def _build_group(
    group: tuple[str, Iterable[EncodedRecord]], store: Store, recipe: Recipe
) -> BuildResult:
    path, records = group
    included: list[tuple[str, str]] = []
    sidecars: dict[str, dict[str, Any] | None] = {}
    payloads: dict[str, tuple[bytes, int]] = {}
    seen: set[str] = set()
    skipped = 0
    for record in records:
        if record.key in seen:
            raise SourceError(f"sample {record.key!r}: duplicate key in the bag")
        seen.add(record.key)
        if record.payload is None:
            skipped += 1
            continue
        included.append((record.key, record.sha256))
        sidecars[record.key] = record.sidecar
        payloads[record.key] = (record.payload, record.raw_size)

    def encoded(order: list[str]) -> Iterator[EncodedSample]:
        for key in order:
            payload, raw_size = payloads.pop(key)
            yield EncodedSample(key, payload, raw_size)

    source = RevisionSource(partition_id(path), path, included, sidecars, skipped)
    return build_revision(store, recipe, source, encoded, where=f"partition {path}")


def write_bag(
    store: Store,
    bag: Any,
    tag: str,
    *,
    base: str | None = None,
    options: WriteOptions | None = None,
    retries: int = DEFAULT_RETRIES,
) -> PackReport:
    """Build every partition of ``bag`` on its Dask scheduler, then publish ``tag`` here."""
    try:
        import dask.bag as db
    except ImportError as exc:  # pragma: no cover - the dask extra is missing
        raise UsageError("write_bag needs dask: pip install 'shardlake[dask]'") from exc
    if not isinstance(bag, db.Bag):
        raise UsageError(f"write_bag takes a dask.bag.Bag, not {type(bag).__name__}")
    started = time.monotonic()
    opts = options or WriteOptions()
    settings = resolve_write_settings(store, tag, base, opts)
    recipe = settings.recipe
    from dask.base import annotate

    encoded = bag.map_partitions(
        _encode_partition, level=recipe.level, keep_skipped=opts.keep_skipped, rule=settings.rule
    )
    groups = encoded.groupby(_partition)
    with annotate(retries=retries):
        builds = groups.map(_build_group, store=store, recipe=recipe)
    # The driver cannot know the partitions before the bag is computed: its lease covers all
    # of data/ while the cluster builds (gc collects other data garbage after it).
    with Lease(store, "write_bag", tag=tag, covers=[f"{DATA_DIR}/"]) as lease:
        return _build_and_publish(store, tag, builds, settings, opts, started, lease)


def _build_and_publish(
    store: Store,
    tag: str,
    builds: Any,
    settings: WriteSettings,
    opts: WriteOptions,
    started: float,
    lease: Lease,
) -> PackReport:
    try:
        results: list[BuildResult] = list(builds.compute(optimize_graph=False))
    except ObjectsGoneError as exc:  # a build's objects were removed under it
        raise gone_error(store, exc.missing, since_seq=settings.state.seq, lease=lease) from exc
    if not results:
        raise SourceError(
            f"write_bag {tag!r}: the bag is empty (an empty write); nothing was published"
        )
    for result in results:
        entry = result.entry
        if len(entry.shards) == 0 and entry.samples:
            raise IntegrityError(f"partition {entry.path!r}: built without shards")
    return publish_written(
        store,
        tag,
        settings,
        results,
        keep_skipped=opts.keep_skipped,
        skipped=sum(r.skipped for r in results),
        started=started,
        lease=lease,
    )
