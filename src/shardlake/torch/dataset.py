"""``ShardDataset``: the samples of one or several sources, in the plan's order for this rank.

``ShardDataset`` is an ``IterableDataset`` of samples (a plain ``DataLoader`` and torchdata's
``StatefulDataLoader`` work); its :meth:`~ShardDataset.loader` returns a
:class:`~shardlake.torch.loader.ShardLoader` that batches inside the workers. The order is
:mod:`shardlake.torch.plan`'s; the sources and their row table are
:mod:`shardlake.torch.sources`'.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..errors import PlanError, UsageError
from ..read.cache import DEFAULT_CACHE_BYTES, EpochCache
from ..read.forget_caches import drop_forgotten_caches
from ..root.door import StoreLike, store_like
from ..store import Store
from .batches import INDEX_KEY, VALID_KEY, OutputOptions, SlotBatches
from .checkpoint import check_state, plain, saved_plan_shape
from .collate import BatchBuilder, BufferPool, PayloadDecoder, make_sample
from .compact import compact_plan, rank_plan, rank_plan3, sampled_mean
from .ddp import rank_and_world
from .heap import trim_heap
from .options import LoaderOptions
from .plan import SHAPE1_INTERLEAVE, plan_epoch
from .plan_batches import plan_torch_leg
from .plan_types import (
    DEFAULT_INTERLEAVE,
    MIN_SLOT_RUNS,
    PLAN_SHAPE,
    Cursor,
    Layout,
    Leg,
    LegPlan,
    PlanParams,
    ReadPlan,
    Rows,
    resolve,
)
from .reader import SlotReader, iter_ints, request_chunk_size, selection_members
from .sources import (
    MixMember,
    combine,
    epoch_counts,
    epoch_rows,
    paused_gc,
    release_set_up_memory,
    select_rows,
    selection_key_digest,
)
from .threads import default_threads, ordered_map

if TYPE_CHECKING:
    from .loader import ShardLoader


__all__ = ["ShardDataset"]


DATASET_STATE_FORMAT = "shardlake.query.dataset-state/1"


class ShardDataset(IterableDataset[dict[str, Any]]):
    """Samples of a selection of one dataset version, in the plan's order for this rank.

    Selection: ``keyset`` (a keyset name, bound to the version), ``where`` (one SQL boolean
    expression over the manifest columns) or ``keys`` (an iterable of sample keys); none selects
    everything. ``batch_size`` is the per-rank batch size the plan is built for (pass the same
    to a plain ``DataLoader``). :meth:`mix` builds one over several weighted sources.

    ``exact=True`` is evaluation mode: every selected sample exactly once per pass over all
    ranks, no minimum size; the padding that gives every rank the same number of whole batches
    is marked ``False`` in the boolean ``"__valid__"`` entry of each batch (see
    :func:`shardlake.torch.masked_sum`). ``shuffle`` defaults to ``not exact``.

    ``include_index=True`` adds ``"__index__"``, an int64 tensor of table rows, so that
    :meth:`keys_of` gives the batch's sample keys while every batch value stays a tensor
    (``include_key=True`` adds ``"__key__"``, a list of str, instead).
    """

    def __init__(
        self,
        url: StoreLike,
        version: str | None = None,
        *,
        batch_size: int,
        keyset: str | None = None,
        where: str | None = None,
        keys: Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        options: LoaderOptions | None = None,
        **overrides: Any,
    ) -> None:
        opts = LoaderOptions.build(options, overrides, where="ShardDataset")
        # A blank URL, or storage options with an opened store, named as this argument.
        store_like(url, storage_options, name="ShardDataset(url)")
        source = MixMember(
            url, version, keyset=keyset, where=where, keys=keys, storage_options=storage_options
        )
        self._configure([source], batch_size=batch_size, opts=opts)

    @classmethod
    def mix(
        cls,
        sources: Sequence[MixMember],
        *,
        batch_size: int,
        epoch_size: int | None = None,
        options: LoaderOptions | None = None,
        **overrides: Any,
    ) -> ShardDataset:
        """One dataset over several sources (roots, versions, selections; any stores).

        Each epoch takes from each source the count its ``weight`` (share of ``epoch_size``,
        default: all sources' samples together), ``repeat`` or ``choose`` asks for, chosen
        per epoch from ``seed``; the samples are interleaved by the plan like those of one
        dataset. Other options as for ``ShardDataset``.
        """
        if not sources:
            raise UsageError("ShardDataset.mix needs at least one MixMember")
        opts = LoaderOptions.build(options, overrides, where="ShardDataset.mix")
        if epoch_size is not None:
            opts = replace(opts, epoch_size=epoch_size)
        self = cls.__new__(cls)
        self._configure(list(sources), batch_size=batch_size, opts=opts)
        return self

    def _configure(self, sources: list[MixMember], *, batch_size: int, opts: LoaderOptions) -> None:
        self.options = opts
        self.engine = opts.resolved_engine  # fixed here: workers and threads see the same
        (epoch_size, seed, shuffle, exact, rank, world_size, num_workers) = (
            opts.epoch_size,
            opts.seed,
            opts.shuffle,
            opts.exact,
            opts.rank,
            opts.world_size,
            opts.num_workers,
        )
        transform, include_key, include_index = opts.transform, opts.include_key, opts.include_index
        meta_columns, drop_keys = opts.meta_columns, opts.drop_keys
        max_pad_fraction, chunk_size = opts.max_pad_fraction, opts.chunk_size
        interleave, shuffle_buffer = opts.interleave, opts.shuffle_buffer
        read_options, cache_dir, cache_bytes = opts.read_options, opts.cache_dir, opts.cache_bytes
        IterableDataset.__init__(self)
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.exact = exact
        self.out = OutputOptions(
            transform, include_key, include_index, tuple(meta_columns), tuple(drop_keys)
        )
        self.read_options = read_options
        self.cache_dir, self.cache_bytes = cache_dir, cache_bytes
        if cache_dir is not None:
            # Validated here (clear error in the main process); opened per process in _slot.
            EpochCache(cache_dir, DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes)
        self._cache: EpochCache | None = None
        self.sources = sources
        with paused_gc():  # the set-up makes few cyclic objects but many objects to scan
            self._init_table(epoch_size)
        drop_forgotten_caches(  # docs/loader.md, "Across a forget"
            getattr(self.store, "stores", None) or [self.store],
            self.cache_dir,
            [str(r["version_hash"]) for r in self.source_records],
        )
        shuffled = (not exact) if shuffle is None else shuffle
        self._plan_knobs = (chunk_size, interleave)  # None: the plan shape's default
        self.params = PlanParams(
            version_hash=self.version_hash,
            selection_digest=self.selection_digest,
            seed=seed,
            shuffle=shuffled,
            max_pad_fraction=max_pad_fraction,
            chunk_size=1,
            interleave=1,
            shuffle_buffer=shuffle_buffer,
            exact=exact,
            drop_last=opts.drop_last,
            order=opts.order,
            sampler_drop_last=opts.sampler_drop_last,
        )
        if opts.order == "torch" and (
            len(self.sources) != 1 or self.source_counts != self.source_sizes
        ):
            raise UsageError(
                "order='torch' is DistributedSampler's order over one selection; a mix has no "
                "such order (use the default order)"
            )
        self.params = self._shaped(PLAN_SHAPE)
        self.cursor = Cursor()  # where plain iteration (DataLoader, StatefulDataLoader) starts
        self._resume_samples = 0  # samples this worker already yielded (StatefulDataLoader)
        self._yielded = 0
        self._plan_cache: tuple[Any, ReadPlan] | None = None
        self._store_pid = os.getpid()
        # Planned here, once, so that forked DataLoader workers share it rather than each
        # computing (and holding) its own copy; then the set-up's garbage goes back to the OS.
        with paused_gc(), contextlib.suppress(PlanError):  # raised again where it is used
            self.plan(self.layout(self.num_workers))
        release_set_up_memory()

    def _shaped(self, shape: int) -> PlanParams:
        """The plan parameters with plan shape ``shape`` and that shape's default knobs."""
        chunk_size, interleave = self._plan_knobs
        return replace(
            self.params,
            shape=shape,
            chunk_size=chunk_size
            or request_chunk_size(
                self.table,
                self.read_options,
                shuffled=self.params.shuffle,
                shape=shape,
                mean=sampled_mean(self.table.size) if shape >= 3 else None,
            ),
            interleave=interleave or (DEFAULT_INTERLEAVE if shape >= 2 else SHAPE1_INTERLEAVE),
            # An explicit run length (chunk_size, request_bytes) is kept as asked.
            min_slot_runs=0 if chunk_size or self.read_options.request_bytes else MIN_SLOT_RUNS,
        )

    def adopt_plan_shape(self, state: dict[str, Any]) -> None:
        """Plan with the shape a saved state was made with (1 when it names none: states saved
        before plan shape 2), so that it resumes exactly the batches it would have had."""
        shape = saved_plan_shape(state)
        if shape != self.params.shape:
            self.params = self._shaped(shape)
            self._plan_cache = None

    def _init_table(self, epoch_size: int | None) -> None:
        """Resolve the sources and build the row table (the one place that reads manifests)."""
        resolved = [select_rows(s, self.out.meta_columns, cached=True) for s in self.sources]
        combined = combine(resolved, self.out.meta_columns, include_key=self.out.include_key)
        self.store: Any = combined.store
        self.table = combined.table
        self.source_of = combined.source_of
        self.partition_of = combined.partition_of
        self.partition_names = combined.partition_names
        self.meta = combined.meta
        self.source_sizes = combined.sizes
        self.source_counts = epoch_counts(self.sources, combined.sizes, epoch_size)
        self.source_records: list[dict[str, Any]] = [
            {
                "name": r.source.label,
                "store": r.store.url,
                "version_tag": r.version_tag,
                "version_hash": r.version_hash,
                "selection": r.selection,
                "selection_digest": selection_key_digest(r),
                "samples": r.rows,
                "weight": r.source.weight,
                "repeat": r.source.repeat,
                "choose": r.source.choose,
                "samples_per_epoch": count,
            }
            for r, count in zip(resolved, self.source_counts, strict=True)
        ]
        if len(resolved) == 1 and self.source_counts == self.source_sizes:
            self.version_tag = resolved[0].version_tag
            self.version_hash = resolved[0].version_hash
            self.selection_desc = resolved[0].selection
            self.selection_digest = self.source_records[0]["selection_digest"]
        else:
            text = repr(
                [
                    (d["version_hash"], d["selection_digest"], d["samples_per_epoch"])
                    for d in self.source_records
                ]
            )
            self.version_tag = "+".join(str(r.version_tag) for r in resolved)
            self.version_hash = hashlib.sha256(f"mix|{text}".encode()).hexdigest()[:32]
            self.selection_desc = {"mix": [d["name"] for d in self.source_records]}
            self.selection_digest = hashlib.sha256(text.encode()).hexdigest()[:32]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_plan_cache"] = None  # recomputed in the worker; cheaper than pickling it
        state["_cache"] = None  # opened afresh in each worker
        return state

    # --- plan ------------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Samples this rank yields per epoch (padding included): what a plain ``DataLoader``
        batches. The selection's size is :attr:`samples`."""
        plan = self.plan(self.layout(self.num_workers))
        slots = range(plan.slot(self.rank, 0), plan.slot(self.rank + 1, 0))
        return sum(len(plan.slot_rows[s]) for s in slots)

    @property
    def samples(self) -> int:
        """Distinct selected samples, over all ranks (what ``len()`` of a map-style dataset of
        the same frames is; ``len(ds)`` is this rank's share of an epoch, padding included)."""
        return len(self.table)

    @property
    def epoch(self) -> int:
        return self.cursor.epoch

    def layout(self, num_workers: int) -> Layout:
        return Layout(self.world_size, num_workers, self.batch_size)

    def epoch_map(self, epoch: int) -> np.ndarray[Any, Any] | None:
        """Table row of each epoch position (``None``: the table itself, once each)."""
        if len(self.sources) == 1 and self.source_counts == self.source_sizes:
            return None
        return epoch_rows(self.source_counts, self.source_sizes, self.params.seed, epoch)

    def plan(
        self, layout: Layout, cursor: Cursor | None = None, *, all_ranks: bool = False
    ) -> ReadPlan:
        """The plan (in table rows) of the current leg of ``cursor``'s epoch (cached).

        The cached plan keeps this rank's slots only (the others' are empty): a rank's memory
        then grows with what it reads, not with the world size. ``all_ranks=True`` computes
        the whole plan afresh (mixing reports over every rank)."""
        cursor = self.cursor if cursor is None else cursor
        if all_ranks:
            return compact_plan(self._whole_plan(layout, cursor))
        key = (cursor.epoch, layout, cursor.legs)
        cached = self._plan_cache  # read once: the next epoch's prefetch may replace it
        if cached is None or cached[0] != key:
            cached = self._plan_cache = (key, self.plan_of(layout, cursor))
        return cached[1]

    def plan_of(self, layout: Layout, cursor: Cursor) -> ReadPlan:
        """This rank's plan of ``cursor``'s leg, not cached (see ``ThreadBatches.keep_plan``)."""
        mine = range(layout.slots_per_rank * self.rank, layout.slots_per_rank * (self.rank + 1))
        return self._rank_plan(layout, cursor, mine)

    def keep_plan(self, layout: Layout, cursor: Cursor, plan: ReadPlan) -> None:
        self._plan_cache = ((cursor.epoch, layout, cursor.legs), plan)

    def _whole_plan(self, layout: Layout, cursor: Cursor) -> ReadPlan:
        mapping = self.epoch_map(cursor.epoch)
        t = self.table
        rows = (
            Rows(t.shard, t.offset)
            if mapping is None
            else Rows(t.shard[mapping], t.offset[mapping])
        )
        if self.params.order == "torch":
            return resolve(self._torch_leg(rows, layout, cursor), mapping)
        leg = plan_epoch(rows, self.params, cursor.epoch, layout, cursor.legs)
        return resolve(leg, mapping)

    def _torch_leg(self, rows: Rows, layout: Layout, cursor: Cursor) -> LegPlan:
        """Order "torch": DistributedSampler's permutation for this epoch, drawn as it draws it
        (a generator seeded ``seed + epoch``), then its padding, rank split and batching."""
        if cursor.legs:
            raise PlanError(
                "order='torch' resumes with the world size, workers and batch size it was "
                "saved with (DistributedSampler's order depends on them)"
            )
        perm = None
        if self.params.shuffle:
            g = torch.Generator()
            g.manual_seed(self.params.seed + cursor.epoch)
            perm = torch.randperm(len(rows), generator=g).numpy()
        return plan_torch_leg(rows, self.params, layout, perm)

    def _rank_plan(self, layout: Layout, cursor: Cursor, mine: range) -> ReadPlan:
        """This rank's share of the leg's plan. With the node-local catalog cache on, it is a
        derived file keyed by everything it depends on: shape 3 plans and keeps a rank's own
        slots (so a restarted rank maps them); shapes 1-2 the whole plan, which the node's
        first rank computes and writes, the others mapping their slots from it."""
        if self.params.order == "torch":  # torch's permutation: not cached
            return compact_plan(self._whole_plan(layout, cursor), keep=mine)
        from .. import __version__

        key = {
            "shardlake": __version__,
            "params": asdict(self.params),
            "layout": asdict(layout),
            "epoch": cursor.epoch,
            "legs": [leg.to_json() for leg in cursor.legs],
            "sizes": self.source_sizes,
            "counts": self.source_counts,
        }
        if self.params.shape >= 3 and self.params.shuffle:  # this rank's slots only
            plan = functools.partial(rank_plan3, self, layout, cursor, mine)
            return rank_plan(plan, {**key, "slots": [mine.start, mine.stop]}, layout, mine)
        return rank_plan(lambda: self._whole_plan(layout, cursor), key, layout, mine)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning (plain ``DataLoader`` iteration)."""
        self.cursor = Cursor(int(epoch))

    def keys_of(self, index: torch.Tensor | Sequence[int]) -> list[str]:
        """Sample keys of a batch's ``"__index__"`` (table rows)."""
        rows = index.tolist() if isinstance(index, torch.Tensor) else list(index)
        return [self.table.keys[int(r)] for r in rows]

    def sources_of(self, index: torch.Tensor | Sequence[int]) -> list[str]:
        """MixMember names of a batch's ``"__index__"``."""
        rows = index.tolist() if isinstance(index, torch.Tensor) else list(index)
        return [self.source_records[int(self.source_of[int(r)])]["name"] for r in rows]

    def run_record(self) -> dict[str, Any]:
        """What to save next to a checkpoint to know exactly which data trained it."""
        from .. import __version__

        record = {
            "shardlake_version": __version__,
            "torch_version": torch.__version__,
            "store": self.store.url,
            "version_tag": self.version_tag,
            "version_hash": self.version_hash,
            "selection": self.selection_desc,
            "selection_digest": self.selection_digest,
            "samples": len(self.table),
            "samples_per_epoch": int(sum(self.source_counts)),
            "sources": self.source_records,
            "exact": self.exact,
            "plan": {
                **{k: v for k, v in asdict(self.params).items()},
                "world_size": self.world_size,
                "batch_size": self.batch_size,
                "num_workers": self.num_workers,
            },
        }
        return cast("dict[str, Any]", plain(record))

    # --- slots ---------------------------------------------------------------------------------

    def _slot(
        self, layout: Layout, worker: int, cursor: Cursor, skip: int = 0, plan: Any = None
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], SlotReader]:
        """Worker ``worker``'s reader when the epoch resumes at ``cursor.step`` (+ ``skip``
        samples of this worker, for a ``StatefulDataLoader`` resume), by ``plan`` or the cached.

        A DataLoader polls worker 0 first, so after a resume at step ``s`` worker ``i`` serves
        the plan's worker ``(s + i) % W`` (steps ``s + i``, ``s + i + W``, ...).
        """
        plan = self.plan(layout, cursor) if plan is None else plan
        worker = (worker + cursor.step) % layout.slots_per_rank
        if self._store_pid != os.getpid():
            # In a forked worker the inherited filesystem object may hold the parent's event
            # loop or connections; a pickle round trip re-creates it for this process.
            self.store = pickle.loads(pickle.dumps(self.store))
            self._store_pid = os.getpid()
        slot = plan.slot(self.rank, worker)
        done = len(range(worker, min(cursor.step, plan.steps), layout.slots_per_rank))
        begin = done * layout.batch_size + skip
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
            lookahead=layout.batch_size,
            ends=None if plan.slot_chunk_ends is None else plan.slot_chunk_ends[slot],
            begin=begin,
        )
        trim_heap()  # the set-up's temporaries would stay in this worker's private pages
        return emit, plan.slot_valid[slot][begin:], reader

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

    def _sample(
        self, decoder: PayloadDecoder, row: int, payload: bytes | memoryview, valid: bool
    ) -> Any:
        out = self.out
        sample = make_sample(
            decoder.arrays(row, payload),
            out.drop_keys,
            self.table.keys[row] if out.include_key else None,
            {c: values[row] for c, values in self.meta.items()},
        )
        if out.transform is not None:
            sample = out.transform(sample)
        if isinstance(sample, dict):
            if out.include_index:
                sample[INDEX_KEY] = row
            if self.exact:
                sample[VALID_KEY] = valid
        return sample

    def iter_slot_samples(
        self, layout: Layout, worker: int, cursor: Cursor, skip: int = 0
    ) -> Iterator[Any]:
        _, valid, reader = self._slot(layout, worker, cursor, skip)
        decoder = self._decoder(reader)
        items = zip(reader, iter_ints(valid), strict=False)
        if self.engine == "threads" and get_worker_info() is None:
            # Plain iteration in this process (e.g. StatefulDataLoader(num_workers=0)):
            # decoded on a thread pool, a batch or two ahead, in order.
            yield from ordered_map(
                lambda item: self._sample(decoder, item[0][0], item[0][1], item[1]),
                items,
                threads=default_threads(),
                ahead=2 * layout.batch_size,
            )
            return
        for (row, payload), ok in items:
            yield self._sample(decoder, row, payload, ok)

    def iter_slot_batches(
        self, layout: Layout, worker: int, cursor: Cursor, pool: BufferPool | None = None
    ) -> Iterator[Any]:
        """Collated batches of one slot, decoded straight into (shared) batch tensors."""
        work = self.slot_work(layout, worker, cursor, pool=pool)
        for items in work:
            yield work.build(items)

    def slot_work(
        self,
        layout: Layout,
        worker: int,
        cursor: Cursor,
        *,
        pool: BufferPool | None = None,
        shared: bool | None = None,
        plan: ReadPlan | None = None,
    ) -> SlotBatches:
        """One slot's batches as units of work: iterating yields each batch's fetched
        ``(row, payload)`` items (the reads), :meth:`SlotBatches.build` turns them into the
        batch (decompression, checks, assembly). The process engine runs both in a worker;
        the thread engine builds on a thread pool."""
        _, valid, reader = self._slot(layout, worker, cursor, plan=plan)
        builder = BatchBuilder(layout.batch_size, self.out.drop_keys, shared=shared, pool=pool)
        return SlotBatches(self, reader, valid, builder)

    # --- plain iteration (DataLoader / StatefulDataLoader) -----------------------------------------

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (0, 0) if info is None else (info.id, info.num_workers)
        skip, self._resume_samples = self._resume_samples, 0
        self._yielded = skip  # samples of this slot consumed, for state_dict()
        for sample in self.iter_slot_samples(self.layout(workers), worker, self.cursor, skip):
            self._yielded += 1
            yield sample

    def state_dict(self) -> dict[str, Any]:
        """This worker's position (torchdata ``StatefulDataLoader`` calls it in each worker)."""
        state = {
            "format": DATASET_STATE_FORMAT,
            "version_hash": self.version_hash,
            "selection_digest": self.selection_digest,
            "seed": self.params.seed,
            "plan_shape": self.params.shape,
            **self.cursor.to_json(),
            "samples": self._yielded,
        }
        return cast("dict[str, Any]", plain(state))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue this worker after the samples it had yielded (same workers and batch)."""
        if state.get("format") != DATASET_STATE_FORMAT:
            raise PlanError(f"not a shardlake dataset state (format {state.get('format')!r})")
        self.check_identity(state)
        self.adopt_plan_shape(state)
        legs = tuple(Leg.from_json(doc) for doc in state["legs"])
        self.cursor = Cursor(int(state["epoch"]), legs, int(state["step"]))
        self._resume_samples = int(state["samples"])
        self._plan_cache = None

    def check_identity(self, state: dict[str, Any]) -> None:
        """Refuse a state saved for another version, selection or seed; one saved on a version
        a forget redacted continues on its successor (:func:`.checkpoint.check_state`)."""
        mine = {
            "version_hash": self.version_hash,
            "selection_digest": self.selection_digest,
            "seed": self.params.seed,
        }
        check_state(self.store if isinstance(self.store, Store) else None, state, mine)

    def loader(self, **options: Any) -> ShardLoader:
        """The loader to train with (see :class:`~shardlake.torch.ShardLoader` for options)."""
        from .loader import ShardLoader

        return ShardLoader(self, **options)
