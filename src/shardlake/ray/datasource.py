"""``read``: a version's selection as a ``ray.data.Dataset`` (one read task per shard range)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import IntegrityError, UsageError
from ..format.codec import Decoder
from ..query.dataset import Dataset
from ..read.payloads import PayloadRef, describe, read_payloads
from ..root import Root, StoreLike, as_store
from ..store import Store

try:
    import ray.data
    from ray.data import Datasource
except ImportError as exc:  # pragma: no cover - the ray extra is missing
    raise ImportError("shardlake.ray needs Ray: pip install 'shardlake[ray]'") from exc

__all__ = ["TASK_BYTES", "read"]

# Payload bytes one read task fetches (a shard range): few requests per task, and a block that
# stays a modest share of a worker's memory.
TASK_BYTES = 64 * 2**20
_PAYLOAD_COLUMNS = ["key", "partition", "shard", "offset", "size", "crc32"]


@dataclass(frozen=True)
class ShardRange:
    """One read task: samples of one shard in offset order, and the extra columns asked for."""

    refs: tuple[PayloadRef, ...]
    extra: dict[str, list[Any]]

    @property
    def size(self) -> int:
        return sum(ref.size for ref in self.refs)


def read(
    root: StoreLike,
    version: str | None = None,
    keyset: str | None = None,
    where: str | None = None,
    columns: Sequence[str] | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    task_bytes: int = TASK_BYTES,
) -> ray.data.Dataset:
    """A version's samples as a ``ray.data.Dataset``: one row per sample.

    Parameters
    ----------
    root
        The dataset root, a :data:`~shardlake.StoreLike` (:func:`shardlake.as_store`): a URL
        or path (opened with ``storage_options``), an opened :class:`~shardlake.Store` or
        :class:`~shardlake.Root` (storage options with those are refused).
    version
        A tag (default: the version ``keyset`` is bound to, else ``latest``).
    keyset
        Read only this keyset's samples.
    where
        Read only the samples this sandboxed SQL expression over the manifest selects (with
        ``keyset``: the keyset's samples it selects).
    columns
        Manifest columns (sidecar fields and the like) to add to each row.
    task_bytes
        Payload bytes per read task (a task never spans two shards).

    Returns
    -------
    ray.data.Dataset
        Rows ``{"key": str, <array name>: ndarray, ..., <column>: value}``, arrays bit-exact. A
        payload that fails its checksum after a re-read fails the read with
        :class:`~shardlake.errors.IntegrityError` naming the shard, key and offset.
    """
    if task_bytes < 1:
        raise UsageError("task_bytes must be >= 1", options=("task_bytes",))
    opened = Root(as_store(root, storage_options, name="shardlake.ray.read(root)"))
    if opened.store.protocol == "memory":
        raise UsageError("a memory:// root cannot be read by Ray workers (other processes)")
    dataset = opened.dataset(version, keyset=keyset)
    extra = list(columns or ())
    rows = dataset.select(keyset=keyset).rows() if keyset else dataset.select().rows()
    if where is not None:
        chosen = dataset.select(where=where).rows(["key"]).column("key")
        rows = rows.filter(pc.is_in(rows.column("key"), value_set=chosen))
    unknown = [name for name in extra if name not in rows.column_names]
    if unknown:
        raise UsageError(
            f"columns {unknown}: not in the manifest of {dataset.tag!r} "
            f"(it has {sorted(rows.column_names)})",
            options=("columns",),
        )
    tasks = shard_ranges(dataset, rows, extra, task_bytes)
    dataset_out: ray.data.Dataset = ray.data.read_datasource(
        _ShardlakeDatasource(opened.store, tasks)
    )
    # A corrupt payload fails with the IntegrityError naming shard, key and offset.
    dataset_out.context.raise_original_map_exception = True
    return dataset_out


def shard_ranges(
    dataset: Dataset, rows: pa.Table, extra: Sequence[str], task_bytes: int
) -> list[ShardRange]:
    """The read tasks of ``rows``: one per run of a shard, cut at ``task_bytes``."""
    payload = rows.select(_PAYLOAD_COLUMNS).to_pylist()
    extras = {name: rows.column(name).to_pylist() for name in extra}
    order = sorted(
        range(len(payload)),
        key=lambda i: (payload[i]["partition"], payload[i]["shard"], payload[i]["offset"]),
    )
    tasks: list[ShardRange] = []
    run: list[int] = []
    size = 0
    for i in order:
        row = payload[i]
        if run and (
            (row["partition"], row["shard"])
            != (payload[run[0]]["partition"], payload[run[0]]["shard"])
            or size >= task_bytes
        ):
            tasks.append(_task(dataset, payload, extras, run))
            run, size = [], 0
        run.append(i)
        size += int(row["size"])
    if run:
        tasks.append(_task(dataset, payload, extras, run))
    return tasks


def _task(
    dataset: Dataset, payload: list[dict[str, Any]], extras: dict[str, list[Any]], run: list[int]
) -> ShardRange:
    first = payload[run[0]]
    shard = dataset.shard_key(first["partition"], int(first["shard"]))
    refs = tuple(
        PayloadRef(
            shard,
            int(payload[i]["offset"]),
            int(payload[i]["size"]),
            int(payload[i]["crc32"]),
            payload[i]["key"],
        )
        for i in run
    )
    return ShardRange(refs, {name: [values[i] for i in run] for name, values in extras.items()})


def read_range(store: Store, task: ShardRange) -> dict[str, Any]:
    """One task's rows as a column batch: coalesced ranged reads, every payload checked."""
    decoder = Decoder()
    keys: list[str] = []
    samples: list[dict[str, np.ndarray[Any, Any]]] = []
    for result in read_payloads(store, task.refs):
        where = describe(store, result.ref)
        if result.error is not None:
            raise result.error
        if result.payload is None:
            raise IntegrityError(f"{where}: {result.problem} ({result.kind})")
        keys.append(result.ref.key)
        samples.append(decoder.decode(result.payload, where))
    batch: dict[str, Any] = {"key": np.array(keys, dtype=object)}
    for name in dict.fromkeys(name for sample in samples for name in sample):
        batch[name] = _column([sample.get(name) for sample in samples])
    for name, values in task.extra.items():
        if name not in batch:
            column = np.empty(len(values), dtype=object)
            column[:] = values
            batch[name] = column
    return batch


def _column(values: list[np.ndarray[Any, Any] | None]) -> np.ndarray[Any, Any]:
    """One array field: stacked where every sample has it with one shape and dtype."""
    first = values[0]
    if first is not None and all(
        v is not None and v.shape == first.shape and v.dtype == first.dtype for v in values
    ):
        return np.stack([v for v in values if v is not None])
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


class _ShardlakeDatasource(Datasource):
    """The read tasks of one selection (built on the driver, run on Ray workers)."""

    def __init__(self, store: Store, tasks: list[ShardRange]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._store = store
        self._tasks = tasks

    def get_name(self) -> str:
        return "Shardlake"

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(task.size for task in self._tasks) * 3  # zstd: about a third of raw

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[Any]:
        from ray.data.block import BlockAccessor, BlockMetadata
        from ray.data.datasource import ReadTask

        store = self._store

        def reader(task: ShardRange) -> Any:
            def read_fn() -> Iterator[Any]:
                yield BlockAccessor.batch_to_block(read_range(store, task))

            return read_fn

        return [
            ReadTask(
                reader(task),
                BlockMetadata(
                    num_rows=len(task.refs),
                    size_bytes=task.size * 3,
                    exec_stats=None,
                    input_files=None,
                ),
                per_task_row_limit=per_task_row_limit,
            )
            for task in self._tasks
        ]
