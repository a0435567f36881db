"""One slot's batches: the reads in plan order, then the per-batch decode and collate."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .collate import BatchBuilder, BatchJob, collate_samples
from .reader import Payload, SlotReader

if TYPE_CHECKING:
    from .dataset import ShardDataset


__all__ = [
    "INDEX_KEY",
    "VALID_KEY",
    "SlotBatches",
    "OutputOptions",
]

VALID_KEY = "__valid__"  # bool per sample: False marks the padding of an exact pass
INDEX_KEY = "__index__"  # int64 per sample: its row in ``ds.table`` (see ``ShardDataset.keys_of``)


@dataclass(frozen=True)
class OutputOptions:
    """Per-sample output options (what a batch holds besides the stored arrays)."""

    transform: Callable[[dict[str, Any]], Any] | None
    include_key: bool
    include_index: bool
    meta_columns: tuple[str, ...]
    drop_keys: tuple[str, ...]


class SlotBatches:
    """One slot's batches: the reads (iteration, one thread) and the per-batch work
    (:meth:`build`, safe to run on several threads at once: one decompressor per thread)."""

    def __init__(
        self,
        ds: ShardDataset,
        reader: SlotReader,
        valid: np.ndarray[Any, Any],
        builder: BatchBuilder,
    ) -> None:
        self.ds = ds
        self.reader = reader
        self.valid = valid
        self.builder = builder
        self.decoder = ds._decoder(reader)
        self.batch_size = builder.batch_size
        self._done = 0

    def __iter__(self) -> Iterator[tuple[list[tuple[int, Payload]], np.ndarray[Any, Any]]]:
        """Per batch, its ``(row, payload)`` items and their validity (as the plan marks them)."""
        pending: list[tuple[int, Payload]] = []
        for item in self.reader:
            pending.append(item)
            if len(pending) < self.batch_size:
                continue
            ok = self.valid[self._done : self._done + len(pending)]
            self._done += len(pending)
            yield pending, ok
            pending = []
        if pending:  # order "torch": DataLoader's short last batch (drop_last=False)
            yield pending, self.valid[self._done : self._done + len(pending)]
            self._done += len(pending)

    def build(self, work: tuple[list[tuple[int, Payload]], np.ndarray[Any, Any]]) -> Any:
        """The collated batch of one unit of work."""
        job = self.job(work)
        if job is None:
            pending, ok = work
            ds, decoder = self.ds, self.decoder
            samples = [ds._sample(decoder, r, p, v) for (r, p), v in zip(pending, ok, strict=True)]
            return collate_samples(samples)
        job.fill(0, len(work[0]))
        return job.finish()

    def job(self, work: tuple[list[tuple[int, Payload]], np.ndarray[Any, Any]]) -> BatchJob | None:
        """One unit of work as a batch to build in parts (see :class:`BatchJob`); None with a
        ``transform``, whose samples :meth:`build` collates one by one."""
        pending, ok = work
        ds = self.ds
        if ds.out.transform is not None:
            return None
        rows = [r for r, _ in pending]
        extras: dict[str, Any] = {}
        if ds.out.include_index:
            extras[INDEX_KEY] = torch.tensor(rows, dtype=torch.int64)
        if ds.exact:
            # A copy: `ok` may view a read-only mapped plan (torch warns on those).
            extras[VALID_KEY] = torch.from_numpy(np.array(ok, dtype=np.bool_))
        return self.builder.job(
            self.decoder,
            pending,
            [ds.table.keys[r] for r in rows] if ds.out.include_key else None,
            {c: [values[r] for r in rows] for c, values in ds.meta.items()},
            extras,
        )
