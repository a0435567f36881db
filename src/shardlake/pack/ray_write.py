"""``Root.write_ray``: a version written from a Ray Dataset, published by the driver.

The rows of a ``ray.data.Dataset`` are ``{"key": str, <array name>: ndarray, ..., "meta": dict}``
(``meta`` optional). Ray workers check, encode and verify each row with the writer's own step
(:func:`~shardlake.pack.writer.encode_record`), the rows are grouped by partition, and one task per
partition builds its revision with pack's :func:`~shardlake.pack.build.build_revision`, writing
shards and manifest straight to the store. Only each partition's small
:class:`~shardlake.pack.build.BuildResult` comes back to the driver, which publishes one version,
once every partition built and verified: the bytes are those the writer makes for the same samples.
"""

from __future__ import annotations

import functools
import pickle
import time
from typing import Any

import numpy as np

from ..errors import ShardlakeError, SourceError, UsageError
from ..executors.ray_executor import join_ray, task_error
from ..format.layout import DATA_DIR
from ..meta.leases import Lease
from ..source.tree import PartitionRule
from ..store import Store
from .build import BuildResult, Recipe
from .cluster import build_group, publish_builds
from .packer import PackReport
from .samples import EncodedRecord, encode_record
from .written import WriteOptions, resolve_write_settings

__all__ = ["write_ray"]

_RESERVED = ("key", "meta")


def _encode_row(
    row: dict[str, Any], level: int, keep_skipped: bool, rule: PartitionRule | None
) -> dict[str, Any]:
    if "key" not in row:
        raise SourceError(f"write_ray: a row needs a 'key' column (columns: {sorted(row)})")
    arrays = {
        name: np.asarray(value)
        for name, value in row.items()
        if name not in _RESERVED and value is not None
    }
    record = encode_record(
        row["key"], arrays, row.get("meta"), None, level, keep_skipped, rule=rule
    )
    return {"partition": record.partition, "record": pickle.dumps(record)}


def _build_partition(batch: dict[str, Any], store: Store, recipe: Recipe) -> dict[str, Any]:
    records: list[EncodedRecord] = [pickle.loads(blob) for blob in batch["record"]]
    group = (records[0].partition, sorted(records, key=lambda r: r.key))
    result = build_group(group, store, recipe, what="the dataset")
    return {"result": np.array([pickle.dumps(result)], dtype=object)}


def write_ray(
    store: Store,
    dataset: Any,
    tag: str,
    *,
    base: str | None = None,
    options: WriteOptions | None = None,
) -> PackReport:
    """Build every partition of ``dataset`` on Ray, then publish ``tag`` here."""
    try:
        import ray
        import ray.data
    except ImportError as exc:  # pragma: no cover - the ray extra is missing
        raise UsageError("write_ray needs Ray: pip install 'shardlake[ray]'") from exc
    if not isinstance(dataset, ray.data.Dataset):
        raise UsageError(f"write_ray takes a ray.data.Dataset, not {type(dataset).__name__}")
    if store.protocol == "memory":
        raise UsageError("a memory:// root cannot be written by Ray workers (other processes)")
    started = time.monotonic()
    opts = options or WriteOptions()
    settings = resolve_write_settings(store, tag, base, opts)
    recipe = settings.recipe
    encoded = dataset.map(
        functools.partial(
            _encode_row, level=recipe.level, keep_skipped=opts.keep_skipped, rule=settings.rule
        )
    )
    join_ray("ray", None)  # as Ray Data would on first use; left running for the caller
    # One shuffle partition per cluster CPU: Ray's default (200) starts 200 aggregators.
    cpus = ray.cluster_resources().get("CPU", 1)  # type: ignore[no-untyped-call]
    shuffle = max(1, int(cpus))
    built = encoded.groupby("partition", num_partitions=shuffle).map_groups(
        functools.partial(_build_partition, store=store, recipe=recipe), batch_format="numpy"
    )
    # A bad record fails with its own error (a SourceError naming the key), not Ray's wrapper.
    built.context.raise_original_map_exception = True
    # The driver cannot know the partitions before the dataset is computed: its lease covers
    # all of data/ while the cluster builds (as write_bag's).
    with Lease(store, "write_ray", tag=tag, covers=[f"{DATA_DIR}/"]) as lease:
        return publish_builds(
            store,
            tag,
            lambda: _results(built),
            settings,
            opts,
            started,
            lease,
            empty="the dataset is empty",
        )


def _results(built: Any) -> list[BuildResult]:
    try:
        rows = built.take_all()
    except Exception as exc:
        cause = task_error(exc)
        if isinstance(cause, ShardlakeError):
            raise cause from None
        raise
    return [pickle.loads(row["result"]) for row in rows]
