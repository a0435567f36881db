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
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import IntegrityError, ShardlakeError, SourceError, UsageError
from ..format.layout import partition_id
from ..read.ray_executor import join_ray, task_error
from ..store import Store
from .build import BuildResult, EncodedSample, Recipe, RevisionSource, build_revision
from .packer import PackReport
from .writer import (
    EncodedRecord,
    WriteOptions,
    encode_record,
    publish_written,
    resolve_write_settings,
)

__all__ = ["write_ray"]

_RESERVED = ("key", "meta")


def _encode_row(row: dict[str, Any], level: int, keep_skipped: bool) -> dict[str, Any]:
    if "key" not in row:
        raise SourceError(f"write_ray: a row needs a 'key' column (columns: {sorted(row)})")
    arrays = {
        name: np.asarray(value)
        for name, value in row.items()
        if name not in _RESERVED and value is not None
    }
    record = encode_record(row["key"], arrays, row.get("meta"), None, level, keep_skipped)
    return {"partition": record.partition, "record": pickle.dumps(record)}


def _build_partition(batch: dict[str, Any], store: Store, recipe: Recipe) -> dict[str, Any]:
    records: list[EncodedRecord] = [pickle.loads(blob) for blob in batch["record"]]
    path = records[0].partition
    included: list[tuple[str, str]] = []
    sidecars: dict[str, dict[str, Any] | None] = {}
    payloads: dict[str, tuple[bytes, int]] = {}
    skipped = 0
    for record in sorted(records, key=lambda r: r.key):
        if record.key in sidecars or record.key in payloads:
            raise SourceError(f"sample {record.key!r}: duplicate key in the dataset")
        sidecars[record.key] = record.sidecar
        if record.payload is None:
            skipped += 1
            continue
        included.append((record.key, record.sha256))
        payloads[record.key] = (record.payload, record.raw_size)

    def encoded(order: list[str]) -> Iterator[EncodedSample]:
        for key in order:
            payload, raw_size = payloads.pop(key)
            yield EncodedSample(key, payload, raw_size)

    source = RevisionSource(partition_id(path), path, included, sidecars, skipped)
    result = build_revision(store, recipe, source, encoded, where=f"partition {path}")
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
        functools.partial(_encode_row, level=recipe.level, keep_skipped=opts.keep_skipped)
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
    try:
        rows = built.take_all()
    except Exception as exc:
        cause = task_error(exc)
        if isinstance(cause, ShardlakeError):
            raise cause from None
        raise
    results: list[BuildResult] = [pickle.loads(row["result"]) for row in rows]
    if not results:
        raise SourceError(
            f"write_ray {tag!r}: the dataset is empty (an empty write); nothing was published"
        )
    for result in results:
        if len(result.entry.shards) == 0 and result.entry.samples:
            raise IntegrityError(f"partition {result.entry.path!r}: built without shards")
    return publish_written(
        store,
        tag,
        settings,
        results,
        keep_skipped=opts.keep_skipped,
        skipped=sum(r.skipped for r in results),
        started=started,
    )
