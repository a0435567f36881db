"""``Root.write_bag``: a version written by a Dask cluster, published by the driver.

The records of a ``dask.bag.Bag`` are ``(key, arrays, meta)``. Each worker checks, encodes and
verifies its records (:func:`~shardlake.pack.writer.encode_record`, the writer's own step), the
bag is grouped by partition (a Dask shuffle of the compressed payloads), and one task per
partition builds its revision with pack's :func:`~shardlake.pack.build.build_revision`, writing
shards and manifest straight to the store. Only the small :class:`BuildResult` of each partition
comes back to the driver, which publishes one version, and only once every partition built and
verified; a build task failed by the store is retried by Dask (``retries``), and a build that
still fails publishes nothing (finished revisions are reused by the next run, or left for gc).
A build refusing its input (a duplicate key) is not retried: the task returns the error
(:class:`~shardlake.pack.cluster.Refused`) and the driver raises it, once.

Only the build tasks carry ``retries`` (a Dask annotation): their input is the grouped, materialised
records. A retried task that reads a lazy bag iterator would resume it where the failed attempt
stopped and silently lose records (Dask bag passes partitions as iterators); the encode step
therefore fails the whole write instead (its errors are about the data: a retry cannot help).

A partition task holds that partition's compressed payloads in memory (the grouped records).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from ..errors import SourceError, UsageError
from ..format.layout import DATA_DIR
from ..meta.leases import Lease
from ..progress.bar import Progress
from ..source.tree import PartitionRule
from ..store import Store
from .cluster import build_group_or_refuse, publish_builds
from .packer import PackReport
from .samples import EncodedRecord, encode_record
from .written import WriteOptions, resolve_write_settings

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


def _compute(builds: Any, what: str, progress: bool | None) -> list[Any]:
    """``builds.compute()``; on a distributed cluster, with progress as bag partitions finish
    (each holds the builds of some partition groups). Other schedulers: one line at the end."""
    try:
        from distributed import as_completed, default_client

        client = default_client()
    except (ImportError, ValueError):  # no distributed client: a local scheduler
        with Progress(None, what, unit="partitions", enabled=progress) as bar:
            done: list[Any] = builds.compute(optimize_graph=False)
            bar.update(len(done))
        return done
    futures = client.compute(builds.to_delayed(optimize_graph=False))
    bar = Progress(len(futures), what, unit="bag partitions", enabled=progress)
    with bar:
        for _ in as_completed(futures):
            bar.update(1)
    return [result for future in futures for result in future.result()]


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
        # A deterministic error comes back as a value: retries are for transient faults.
        builds = groups.map(build_group_or_refuse, store=store, recipe=recipe, what="the bag")
    # The driver cannot know the partitions before the bag is computed: its lease covers all
    # of data/ while the cluster builds (gc collects other data garbage after it).
    with Lease(store, "write_bag", tag=tag, covers=[f"{DATA_DIR}/"]) as lease:
        return publish_builds(
            store,
            tag,
            lambda: _compute(builds, f"write_bag {tag}: build", opts.progress),
            settings,
            opts,
            started,
            lease,
            empty="the bag is empty",
        )
