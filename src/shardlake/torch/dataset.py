"""``ShardDataset`` and its loader: deterministic, resumable, verified DDP streaming.

``ShardDataset`` is an ``IterableDataset`` of samples (a plain ``DataLoader`` works); its
:meth:`~ShardDataset.loader` returns a :class:`ShardLoader` that batches inside the workers,
decoding straight into shared-memory batch tensors, and adds exact mid-epoch resume
(``state_dict``/``load_state_dict``), rank agreement checks and DDP-safe error propagation.
See :mod:`shardlake.torch.plan` for the order and the resume design.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
import torch.distributed as dist
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .. import errors as _errors
from ..dataset import open_dataset
from ..errors import PlanError, SelectionError, ShardlakeError, UsageError
from ..read.cache import DEFAULT_CACHE_BYTES, EpochCache
from ..store import Store
from .collate import (
    BUFFER_KEY,
    BatchBuilder,
    BufferPool,
    PayloadDecoder,
    collate_samples,
    make_sample,
)
from .plan import (
    DEFAULT_INTERLEAVE,
    DEFAULT_MAX_PAD_FRACTION,
    DEFAULT_SHUFFLE_BUFFER,
    Layout,
    Leg,
    LegPlan,
    PlanParams,
    Rows,
    plan_epoch,
    selection_digest,
)
from .reader import ReadOptions, RowTable, SlotReader, request_chunk_size, selection_members

_CORE = ["key", "partition", "shard", "offset", "size", "raw_size", "crc32"]
STATE_FORMAT = "shardlake.loader-state/1"
POOL_SIZE = 8  # reusable shared batch buffers per worker (prefetched + held by the user)


def _dist_info() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class ShardDataset(IterableDataset[dict[str, Any]]):
    """Samples of a selection of one dataset version, in the plan's order for this rank.

    Selection: ``keyset`` (a keyset name, bound to the version), ``where`` (one SQL boolean
    expression over the manifest columns) or ``keys`` (an iterable of sample keys); none selects
    everything. ``batch_size`` is the per-rank batch size the plan is built for (pass the same
    to a plain ``DataLoader``). Iterating yields this rank's samples of the current epoch from
    its current position (see :class:`ShardLoader` for resume).

    Reads: ``read_options`` (:class:`~shardlake.torch.reader.ReadOptions`) sets the request size
    (the plan's ``chunk_size`` defaults to about ``request_bytes`` of payload) and the fetches in
    flight. ``cache_dir`` keeps fetched payloads in a node-local epoch cache of at most
    ``cache_bytes`` (default 64 GiB) for later epochs (:mod:`shardlake.read.cache`).
    """

    def __init__(
        self,
        url: str | Store,
        version: str = "latest",
        *,
        batch_size: int,
        keyset: str | None = None,
        where: str | None = None,
        keys: Sequence[str] | None = None,
        seed: int = 0,
        shuffle: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        num_workers: int = 2,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        include_key: bool = False,
        meta_columns: Sequence[str] = (),
        drop_keys: Sequence[str] = ("version",),
        storage_options: dict[str, Any] | None = None,
        max_pad_fraction: float = DEFAULT_MAX_PAD_FRACTION,
        chunk_size: int | None = None,
        interleave: int = DEFAULT_INTERLEAVE,
        shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
        read_options: ReadOptions | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int | None = None,
    ) -> None:
        super().__init__()
        if sum(x is not None for x in (keyset, where, keys)) > 1:
            raise SelectionError("pass at most one of keyset=, where= and keys=")
        d_rank, d_world = _dist_info()
        self.rank = d_rank if rank is None else rank
        self.world_size = d_world if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise PlanError(f"rank {self.rank} is outside world_size {self.world_size}")
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.transform = transform
        self.include_key = include_key
        self.meta_columns = tuple(meta_columns)
        self.drop_keys = tuple(drop_keys)
        self.read_options = read_options or ReadOptions()
        self.cache_dir, self.cache_bytes = cache_dir, cache_bytes
        if cache_dir is not None:
            # Validated here (clear error in the main process); opened per process in _slot.
            EpochCache(cache_dir, DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes)
        self._cache: EpochCache | None = None

        ds = open_dataset(url, version, storage_options)
        self.store: Store = ds.store
        self.version_tag = ds.version.tag
        self.version_hash = ds.version.hash
        self.selection_desc: dict[str, Any] = {"all": True}
        table = ds.manifests(columns=None if where else [*_CORE, *self.meta_columns])
        missing = [c for c in self.meta_columns if c not in table.column_names]
        if missing:
            raise SelectionError(
                f"unknown meta_columns {', '.join(missing)}; manifest columns: "
                f"{', '.join(table.column_names)}"
            )
        if where is not None:
            from ..sql import select

            table = select(table, where)
            self.selection_desc = {"where": where}
        elif keyset is not None or keys is not None:
            if keyset is not None:
                from ..keysets import load_keyset

                ks = load_keyset(self.store, keyset)
                ks.check_version(ds.version)
                wanted, self.selection_desc = ks.keys, {"keyset": keyset}
            else:
                wanted, self.selection_desc = list(keys or ()), {"keys": len(keys or ())}
            mask = pc.is_in(table.column("key"), value_set=pa.array(wanted, pa.string()))
            table = table.filter(mask)
            if table.num_rows != len(set(wanted)):
                raise SelectionError(
                    f"{len(set(wanted)) - table.num_rows} selected key(s) are not in version "
                    f"{self.version_tag!r}"
                )
        self._init_table(ds, table)
        self.params = PlanParams(
            version_hash=self.version_hash,
            selection_digest=self.selection_digest,
            seed=seed,
            shuffle=shuffle,
            max_pad_fraction=max_pad_fraction,
            chunk_size=chunk_size or request_chunk_size(self.table, self.read_options),
            interleave=interleave,
            shuffle_buffer=shuffle_buffer,
        )
        # The cursor: epoch, finished legs (layout changes) and steps consumed in this leg.
        self.epoch = 0
        self.legs: tuple[Leg, ...] = ()
        self.start_step = 0
        self._plan_cache: tuple[Any, LegPlan] | None = None
        self._store_pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_plan_cache"] = None  # recomputed in the worker; cheaper than pickling it
        state["_cache"] = None  # opened afresh in each worker
        return state

    def _init_table(self, ds: Any, table: pa.Table) -> None:
        keys = table.column("key").to_pylist()
        pids = table.column("partition").to_pylist()
        shards = table.column("shard").to_numpy()
        pairs: dict[tuple[str, int], int] = {}
        shard_idx = np.empty(len(keys), dtype=np.int64)
        for i, (pid, s) in enumerate(zip(pids, shards.tolist(), strict=False)):
            shard_idx[i] = pairs.setdefault((pid, s), len(pairs))
        shard_keys = [ds.shard_key(pid, s) for pid, s in pairs]
        part_names = sorted(set(pids))
        part_index = {p: i for i, p in enumerate(part_names)}
        self.partition_names = part_names
        self.partition_of = np.array([part_index[p] for p in pids], dtype=np.int64)
        self.table = RowTable(
            shard=shard_idx,
            offset=table.column("offset").to_numpy().astype(np.int64),
            size=table.column("size").to_numpy().astype(np.int64),
            raw_size=table.column("raw_size").to_numpy().astype(np.int64),
            crc32=table.column("crc32").to_numpy().astype(np.int64),
            keys=keys,
            shard_keys=shard_keys,
        )
        self.meta = {c: table.column(c).to_pylist() for c in self.meta_columns}
        self.selection_digest = selection_digest(keys)
        if not keys:
            raise SelectionError(f"the selection is empty in version {self.version_tag!r}")

    # --- plan ------------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Samples this rank yields per epoch (whole batches, replays included)."""
        return self.plan(self.layout(self.num_workers)).steps * self.batch_size

    def layout(self, num_workers: int) -> Layout:
        return Layout(self.world_size, num_workers, self.batch_size)

    def plan(self, layout: Layout) -> LegPlan:
        """The plan of the current leg of the current epoch under ``layout`` (cached)."""
        cache_key = (self.epoch, layout, self.legs)
        if self._plan_cache is None or self._plan_cache[0] != cache_key:
            rows = Rows(self.table.shard, self.table.offset)
            self._plan_cache = (
                cache_key,
                plan_epoch(rows, self.params, self.epoch, layout, self.legs),
            )
        return self._plan_cache[1]

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning (on every rank)."""
        self.epoch, self.legs, self.start_step = int(epoch), (), 0

    def run_record(self) -> dict[str, Any]:
        """What to save next to a checkpoint to know exactly which data trained it."""
        from .. import __version__

        return {
            "shardlake_version": __version__,
            "torch_version": torch.__version__,
            "store": self.store.url,
            "version_tag": self.version_tag,
            "version_hash": self.version_hash,
            "selection": self.selection_desc,
            "selection_digest": self.selection_digest,
            "samples": len(self.table),
            "plan": {
                **{k: v for k, v in asdict(self.params).items()},
                "world_size": self.world_size,
                "batch_size": self.batch_size,
                "num_workers": self.num_workers,
            },
        }

    # --- slots ---------------------------------------------------------------------------------

    def _slot(
        self, layout: Layout, worker: int, start_step: int
    ) -> tuple[np.ndarray, np.ndarray, SlotReader]:
        """The reader of DataLoader worker ``worker`` when the epoch resumes at ``start_step``.

        A DataLoader polls worker 0 first, so after a resume at step ``s`` worker ``i`` serves
        the plan's worker ``(s + i) % W`` (steps ``s + i``, ``s + i + W``, ...).
        """
        plan = self.plan(layout)
        worker = (worker + start_step) % layout.slots_per_rank
        if self._store_pid != os.getpid():
            # In a forked worker the inherited filesystem object may hold the parent's event
            # loop or connections; a pickle round trip re-creates it for this process.
            self.store = pickle.loads(pickle.dumps(self.store))
            self._store_pid = os.getpid()
        slot = plan.slot(self.rank, worker)
        skip = len(range(worker, min(start_step, plan.steps), layout.slots_per_rank))
        begin = skip * layout.batch_size
        emit = plan.slot_rows[slot][begin:]
        chunk = plan.slot_emit_chunk[slot][begin:]
        reader = SlotReader(
            self.store,
            self.table,
            plan.slot_chunks[slot],
            emit,
            chunk,
            self.read_options,
            cache=self._epoch_cache(),
        )
        return emit, chunk, reader

    def _epoch_cache(self) -> EpochCache | None:
        if self.cache_dir is None:
            return None
        if self._cache is None:
            budget = DEFAULT_CACHE_BYTES if self.cache_bytes is None else self.cache_bytes
            self._cache = EpochCache(self.cache_dir, budget)
            self._cache.want(selection_members(self.table))
        return self._cache

    def _decoder(self, reader: SlotReader) -> PayloadDecoder:
        return PayloadDecoder(reader.refetch, reader.where)

    def _sample(self, decoder: PayloadDecoder, row: int, payload: bytes | memoryview) -> Any:
        sample = make_sample(
            decoder.arrays(row, payload),
            self.drop_keys,
            self.table.keys[row] if self.include_key else None,
            {c: values[row] for c, values in self.meta.items()},
        )
        return self.transform(sample) if self.transform is not None else sample

    def iter_slot_samples(self, layout: Layout, worker: int, start_step: int) -> Iterator[Any]:
        _, _, reader = self._slot(layout, worker, start_step)
        decoder = self._decoder(reader)
        for row, payload in reader:
            yield self._sample(decoder, row, payload)

    def iter_slot_batches(
        self,
        layout: Layout,
        worker: int,
        start_step: int,
        pool: BufferPool | None = None,
    ) -> Iterator[Any]:
        """Collated batches of one slot, decoded straight into (shared) batch tensors."""
        _, _, reader = self._slot(layout, worker, start_step)
        decoder = self._decoder(reader)
        builder = BatchBuilder(layout.batch_size, self.drop_keys, pool=pool)
        pending: list[tuple[int, bytes | memoryview]] = []
        for item in reader:
            pending.append(item)
            if len(pending) < layout.batch_size:
                continue
            rows = [r for r, _ in pending]
            if self.transform is not None:
                yield collate_samples([self._sample(decoder, r, p) for r, p in pending])
            else:
                yield builder.build(
                    decoder,
                    pending,
                    [self.table.keys[r] for r in rows] if self.include_key else None,
                    {c: [values[r] for r in rows] for c, values in self.meta.items()},
                )
            pending = []

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (0, 0) if info is None else (info.id, info.num_workers)
        yield from self.iter_slot_samples(self.layout(workers), worker, self.start_step)

    def loader(self, **options: Any) -> ShardLoader:
        """The loader to train with (see :class:`ShardLoader` for ``options``)."""
        return ShardLoader(self, **options)


class _BatchStream(IterableDataset[Any]):
    """What each DataLoader worker runs: its slot's batches from ``start_step`` on."""

    def __init__(
        self, ds: ShardDataset, layout: Layout, start_step: int, flags: torch.Tensor | None
    ) -> None:
        super().__init__()
        self.ds = ds
        self.layout = layout
        self.start_step = start_step
        self.flags = flags

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        pool = None
        if self.flags is not None and info is not None:
            pool = BufferPool(self.flags, worker * POOL_SIZE, POOL_SIZE)
        yield from self.ds.iter_slot_batches(self.layout, worker, self.start_step, pool)


def _identity(batch: Any) -> Any:
    return batch


class ShardLoader:
    """Iterating yields this rank's collated batches of the current epoch, from its cursor.

    ``num_workers`` defaults to the dataset's; other options go to ``DataLoader``
    (``pin_memory``, ``prefetch_factor``, ``multiprocessing_context``, ``timeout``). After a
    complete pass the loader moves to the next epoch; ``set_epoch`` starts any epoch afresh.

    With ``torch.distributed`` initialised, every rank must iterate its loader in step: before
    the first batch the ranks check they resolved the same version hash, selection and cursor,
    and after every step they agree (one tiny all-reduce on a gloo group) whether any rank
    failed, so an error on one rank stops all of them with the same error instead of leaving the
    others waiting in a collective. ``sync=False`` turns this off.

    Resume: :meth:`state_dict` counts every batch the loader has yielded as consumed; a loader
    given that state by :meth:`load_state_dict` (any world size, workers or batch size) yields
    exactly the rest of the epoch and reads nothing of the consumed part.

    Batch tensors live in shared-memory buffers the workers recycle once no tensor or view of
    the batch is alive in this process any more (so a batch you keep is never overwritten);
    ``reuse_buffers=False`` allocates fresh shared memory for every batch instead (slower).
    """

    def __init__(
        self,
        ds: ShardDataset,
        *,
        num_workers: int | None = None,
        sync: bool = True,
        reuse_buffers: bool = True,
        **options: Any,
    ) -> None:
        if options.get("persistent_workers"):
            # Workers are started per pass with the pass's cursor baked in; persistent ones
            # would replay the first pass's position.
            raise UsageError(
                "ShardLoader starts workers per pass; persistent_workers=True is not supported"
            )
        if options.get("batch_size") is not None:
            raise UsageError("the loader batches in the workers; set batch_size on ShardDataset")
        self.ds = ds
        self.reuse_buffers = reuse_buffers
        self.num_workers = ds.num_workers if num_workers is None else num_workers
        self.options = options
        self.sync = sync
        self._group: Any = None
        self._checked = False

    # --- cursor ------------------------------------------------------------------------------

    @property
    def layout(self) -> Layout:
        return self.ds.layout(self.num_workers)

    def __len__(self) -> int:
        """Steps left in the current epoch."""
        return max(0, self.ds.plan(self.layout).steps - self.ds.start_step)

    def set_epoch(self, epoch: int) -> None:
        self.ds.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self.ds.epoch

    def state_dict(self) -> dict[str, Any]:
        """The cursor (global steps consumed so far); save it with the model checkpoint."""
        ds = self.ds
        return {
            "format": STATE_FORMAT,
            "version_hash": ds.version_hash,
            "selection_digest": ds.selection_digest,
            "seed": ds.params.seed,
            "epoch": ds.epoch,
            "legs": [leg.to_json() for leg in ds.legs],
            "layout": asdict(self.layout),
            "step": ds.start_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly after the consumed batches of ``state`` (any world size/workers)."""
        ds = self.ds
        if state.get("format") != STATE_FORMAT:
            raise PlanError(f"not a shardlake loader state (format {state.get('format')!r})")
        for name in ("version_hash", "selection_digest", "seed"):
            mine = (
                ds.version_hash
                if name == "version_hash"
                else (ds.selection_digest if name == "selection_digest" else ds.params.seed)
            )
            if state[name] != mine:
                raise PlanError(
                    f"loader state was saved with {name} {state[name]!r}, this loader has "
                    f"{mine!r}; resume with the same version, selection and seed"
                )
        legs = tuple(Leg.from_json(doc) for doc in state["legs"])
        saved = Leg.from_json({**state["layout"], "steps": state["step"]})
        ds.epoch = int(state["epoch"])
        if saved.layout == self.layout:
            ds.legs, ds.start_step = legs, saved.steps
        else:
            # Another layout: a new leg over what the earlier legs did not consume.
            ds.legs, ds.start_step = (*legs, saved), 0
        ds._plan_cache = None

    def run_record(self) -> dict[str, Any]:
        record = self.ds.run_record()
        record["plan"]["num_workers"] = self.num_workers
        return record

    # --- DDP agreement ---------------------------------------------------------------------------

    def _distributed(self) -> bool:
        return (
            self.sync
            and dist.is_available()
            and dist.is_initialized()
            and dist.get_world_size() > 1
        )

    def _ensure_group(self) -> Any:
        if self._group is None:
            # Our CPU flags need gloo; a NCCL default group gets a gloo side group (created once,
            # by every rank at the same point: the first iteration).
            self._group = (
                dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
            )
        return self._group

    def _check_ranks(self) -> None:
        group = self._ensure_group()
        mine = (
            self.ds.version_hash,
            self.ds.selection_digest,
            self.ds.params.seed,
            self.ds.epoch,
            self.ds.start_step,
            tuple(tuple(sorted(leg.to_json().items())) for leg in self.ds.legs),
            self.ds.batch_size,
        )
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine, group=group)
        if any(g != gathered[0] for g in gathered):
            first = gathered[0]
            bad = [i for i, g in enumerate(gathered) if g != first]
            raise PlanError(
                f"ranks disagree on version/selection/cursor: rank 0 has {first}, ranks {bad} "
                f"differ (rank {bad[0]}: {gathered[bad[0]]}); every rank must open the same "
                "version and selection and load the same loader state"
            )

    def _agree(self, error: BaseException | None, ended: bool) -> None:
        """All ranks learn whether any failed (or ran out early) and raise the same error."""
        group = self._ensure_group()
        flags = torch.tensor([1 if error is not None else 0, 1 if ended else 0], dtype=torch.int64)
        dist.all_reduce(flags, group=group)
        failed, ended_count = int(flags[0]), int(flags[1])
        world = dist.get_world_size()
        if failed:
            info = (type(error).__name__, str(error)) if error is not None else None
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, info, group=group)
            rank = next(i for i, g in enumerate(gathered) if g is not None)
            name, message = gathered[rank]
            cls = getattr(_errors, name, None)
            if not (isinstance(cls, type) and issubclass(cls, ShardlakeError)):
                cls = RuntimeError
            raise cls(f"rank {rank}: {name}: {message}") from error
        if 0 < ended_count < world:
            raise PlanError(
                f"{ended_count} of {world} ranks ran out of batches before the others; ranks "
                "must use the same version, selection, batch_size and loader state"
            )

    # --- iteration -------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        ds = self.ds
        distributed = self._distributed()
        if distributed and not self._checked:
            self._check_ranks()
            self._checked = True
        layout = self.layout
        # Buffer release flags shared with the workers (see collate.BufferPool).
        flags = None
        if self.num_workers > 0 and self.reuse_buffers:
            flags = torch.zeros(self.num_workers * POOL_SIZE, dtype=torch.int32).share_memory_()
        held: list[tuple[StorageWeakRef, int]] = []
        stream = _BatchStream(ds, layout, ds.start_step, flags)
        options = dict(self.options)
        if self.num_workers > 0:
            options.setdefault("prefetch_factor", 2)
        loader = DataLoader(
            stream,
            batch_size=None,
            num_workers=self.num_workers,
            collate_fn=_identity,
            **options,
        )
        it = iter(loader)
        try:
            while True:
                error: BaseException | None = None
                ended = False
                batch: Any = None
                try:
                    batch = next(it)
                except StopIteration:
                    ended = True
                except Exception as exc:  # noqa: BLE001 - shared with the other ranks below
                    error = exc
                if distributed:
                    self._agree(error, ended)
                elif error is not None:
                    raise error
                if ended:
                    break
                if flags is not None:
                    # Hand buffers whose batches are gone back to their workers.
                    alive = []
                    for ref, index in held:
                        if ref.expired():
                            flags[index] = 0
                        else:
                            alive.append((ref, index))
                    held = alive
                    index = batch.pop(BUFFER_KEY, -1) if isinstance(batch, dict) else -1
                    if index >= 0:
                        storage = next(
                            v for v in batch.values() if isinstance(v, torch.Tensor)
                        ).untyped_storage()
                        held.append((StorageWeakRef(storage), index))
                ds.start_step += 1
                yield batch
                batch = None  # drop our reference, so only the user's keeps the buffer
        finally:
            del it
        # A complete pass: the next iteration is the next epoch.
        ds.set_epoch(ds.epoch + 1)


def train_valid(
    url: str | Store,
    version: str = "latest",
    *,
    batch_size: int,
    valid_keyset: str | None = None,
    valid_where: str | None = None,
    valid_keys: Sequence[str] | None = None,
    train_keyset: str | None = None,
    train_where: str | None = None,
    valid_batch_size: int | None = None,
    **options: Any,
) -> tuple[ShardDataset, ShardDataset]:
    """A (train, valid) pair of datasets over one version.

    The validation set is given by ``valid_keyset``/``valid_where``/``valid_keys`` and is not
    shuffled; the training set is ``train_keyset``/``train_where`` or else everything else.
    The two are checked to be disjoint and to resolve the same version.
    """
    valid = ShardDataset(
        url,
        version,
        batch_size=valid_batch_size or batch_size,
        keyset=valid_keyset,
        where=valid_where,
        keys=valid_keys,
        shuffle=False,
        **options,
    )
    train_sel: dict[str, Any] = {"keyset": train_keyset, "where": train_where}
    if train_keyset is None and train_where is None:
        everything = ShardDataset(url, valid.version_tag, batch_size=batch_size, **options)
        held_out = set(valid.table.keys)
        train_sel = {"keys": [k for k in everything.table.keys if k not in held_out]}
    train = ShardDataset(url, valid.version_tag, batch_size=batch_size, **train_sel, **options)
    if train.version_hash != valid.version_hash:
        raise SelectionError("train and valid resolved different versions; pass a version tag")
    overlap = set(train.table.keys) & set(valid.table.keys)
    if overlap:
        raise SelectionError(
            f"train and valid selections share {len(overlap)} key(s), e.g. {sorted(overlap)[:3]}"
        )
    return train, valid
