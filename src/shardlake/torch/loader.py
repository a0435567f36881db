"""``ShardLoader``: the training loop's loader. It owns a :class:`~shardlake.torch.plan_types.Cursor`,
batches inside the DataLoader workers, resumes exactly (torch.distributed.checkpoint's
``Stateful``) and keeps DDP ranks in step (:mod:`shardlake.torch.ddp`)."""

from __future__ import annotations

import gc
import json
import traceback
import weakref
from collections.abc import Iterator
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..errors import PlanError, UsageError
from .collate import BUFFER_KEY, BufferPool, LocalBufferPool
from .ddp import RankSync, distributed
from .options import check_engine
from .plan_types import Cursor, Layout, Leg
from .threads import Budget, ThreadBatches, batch_buffers, default_threads

if TYPE_CHECKING:
    from .dataset import ShardDataset  # which builds this loader (ShardDataset.loader)

__all__ = [
    "ShardLoader",
    "pack_batch",
    "unpack_batch",
]

STATE_FORMAT = "shardlake.loader-state/1"
POOL_SIZE = 8  # reusable shared batch buffers per worker (prefetched + held by the user)
# DataLoader options the thread engine takes (multiprocessing_context: harmless, ignored).
THREAD_ENGINE_OPTIONS = frozenset(
    {"pin_memory", "prefetch_factor", "timeout", "multiprocessing_context"}
)


class _BatchStream(IterableDataset[Any]):
    """What each DataLoader worker runs: its slot's batches from the cursor on."""

    def __init__(
        self, ds: ShardDataset, layout: Layout, cursor: Cursor, flags: torch.Tensor | None
    ) -> None:
        super().__init__()
        self.ds = ds
        self.layout = layout
        self.cursor = cursor
        self.flags = flags

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        pool = None
        if self.flags is not None and info is not None:
            pool = BufferPool(self.flags, worker * POOL_SIZE, POOL_SIZE)
        for batch in self.ds.iter_slot_batches(self.layout, worker, self.cursor, pool):
            yield pack_batch(batch) if info is not None else batch


def _identity(batch: Any) -> Any:
    return batch


PACKED_KEY = "__shardlake_packed__"  # one tensor over a batch's shared allocation, and its views
ViewSpec = tuple[str, torch.dtype, tuple[int, ...], tuple[int, ...], int]


def pack_batch(batch: Any) -> Any:
    """The batch with its tensors that share one allocation replaced by that allocation.

    Each tensor a worker hands over costs a file descriptor passed over a socket (torch's
    ``file_descriptor`` sharing); a batch's fields all view one shared allocation
    (:func:`~shardlake.torch.collate.new_batch_tensors`), so one tensor plus the views' shapes
    is enough. :func:`unpack_batch` rebuilds the views in the main process.
    """
    if not isinstance(batch, dict):
        return batch
    tensors = [(k, v) for k, v in batch.items() if isinstance(v, torch.Tensor)]
    if len(tensors) < 2:
        return batch
    storage = tensors[0][1].untyped_storage()
    shared = [(k, t) for k, t in tensors if t.untyped_storage().data_ptr() == storage.data_ptr()]
    if len(shared) < 2:
        return batch
    whole = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
    specs: list[ViewSpec] = [
        (k, t.dtype, tuple(t.shape), tuple(t.stride()), int(t.storage_offset())) for k, t in shared
    ]
    names = {k for k, _ in shared}
    out = {k: v for k, v in batch.items() if k not in names}
    out[PACKED_KEY] = (whole, specs, list(batch))
    return out


def unpack_batch(batch: Any) -> Any:
    """Undo :func:`pack_batch`: the views again, in the batch's original key order."""
    if not isinstance(batch, dict) or PACKED_KEY not in batch:
        return batch
    whole, specs, order = batch.pop(PACKED_KEY)
    storage = whole.untyped_storage()
    views = {
        name: torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)
        for name, dtype, shape, stride, offset in specs
    }
    return {k: views[k] if k in views else batch[k] for k in order}


class ShardLoader:
    """Iterating yields this rank's collated batches of the current epoch, from its cursor.

    ``num_workers`` defaults to the dataset's; other options go to ``DataLoader``
    (``pin_memory``, ``prefetch_factor``, ``multiprocessing_context``, ``timeout``). After a
    complete pass the loader moves to the next epoch. ``set_epoch(e)`` (call it every epoch, as
    with ``DistributedSampler``) starts epoch ``e`` afresh unless the loader already stands in
    epoch ``e`` (e.g. just resumed into it), so a resumed loop keeps its position.

    With ``torch.distributed`` initialised, every rank must iterate its loader in step: before
    the first batch the ranks check they resolved the same version hash, selection and cursor,
    and after every step they agree (one tiny all-reduce on a gloo group) whether any rank
    failed, so an error on one rank stops all of them with the same error instead of leaving the
    others waiting in a collective. ``sync=False`` turns this off.

    Resume: :meth:`state_dict` counts every batch the loader has yielded as consumed; a loader
    given that state by :meth:`load_state_dict` (any world size, workers or batch size) yields
    exactly the rest of the epoch and reads nothing of the consumed part. The loader is a
    ``torch.distributed.checkpoint.stateful.Stateful``: ``dcp.save({"loader": loader})`` works.

    Batch tensors live in shared-memory buffers the workers recycle once no tensor or view of
    the batch is alive in this process any more (so a batch you keep is never overwritten);
    ``reuse_buffers=False`` allocates fresh shared memory for every batch instead (slower).

    ``engine`` (default: the dataset's, see :class:`~shardlake.torch.LoaderOptions`) chooses
    who builds the batches: ``"threads"`` builds them on ``threads`` threads of this process
    (default: one per core) straight into plain or, with ``pin_memory=True``, pinned buffers
    recycled the same way; of the DataLoader options it uses ``pin_memory``,
    ``prefetch_factor`` (batches ahead per slot) and ``timeout``, and ignores
    ``multiprocessing_context``. ``"processes"`` is a DataLoader with a worker process per slot.
    Both yield the same batches.

    The next epoch's prefetch (``prefetch_next_epoch=True``, the default; thread engine):
    once every batch of a pass is read and handed to the builders, the loader starts the next
    epoch's pass (its plan, reads and first batches, within the same bound of batches in
    flight), which the next ``iter()`` takes over if it starts there: after a complete pass,
    or ``set_epoch`` / ``load_state_dict`` to the epoch that follows it. Anything else drops
    it. The batches are the same with or without it. With a ``transform`` it reads ahead but
    builds nothing before ``iter()``. :meth:`close` drops it (so does garbage collection).
    """

    def __init__(
        self,
        ds: ShardDataset,
        *,
        num_workers: int | None = None,
        sync: bool = True,
        reuse_buffers: bool = True,
        engine: str | None = None,
        threads: int | None = None,
        prefetch_next_epoch: bool = True,
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
        self.engine = ds.engine if engine is None else check_engine(engine, "engine")
        if self.engine == "threads":
            unknown = sorted(set(options) - THREAD_ENGINE_OPTIONS)
            if unknown:
                raise UsageError(
                    f"engine='threads' runs no worker processes: {', '.join(unknown)} "
                    "applies to engine='processes' only"
                )
        if threads is not None and threads < 1:
            raise UsageError(f"threads={threads}: need at least 1")
        self.threads = default_threads() if threads is None else threads
        self.ds = ds
        self.reuse_buffers = reuse_buffers
        self.num_workers = ds.num_workers if num_workers is None else num_workers
        self.options = options
        self.sync = sync
        self.cursor = ds.cursor
        self._ranks = RankSync()
        self._checked = False
        self._buffers: LocalBufferPool | None = None  # the thread engine's batch buffers
        self.prefetch_next_epoch = prefetch_next_epoch
        self._next = _NextPass()  # the next epoch's pass, started during this one's tail
        weakref.finalize(self, self._next.drop)  # its threads stop with the loader

    # --- cursor ------------------------------------------------------------------------------

    @property
    def layout(self) -> Layout:
        return self.ds.layout(self.num_workers)

    def __len__(self) -> int:
        """Steps left in the current epoch."""
        self._next.share_plan(self._pass_key())  # a prefetch's plan, not a second planning
        return max(0, self.ds.plan(self.layout, self.cursor).steps - self.cursor.step)

    def set_epoch(self, epoch: int) -> None:
        """Go to epoch ``epoch`` (from its start, unless the loader is already in it)."""
        if int(epoch) != self.cursor.epoch:
            self.cursor = Cursor(int(epoch))
            self._next.keep_if(self._pass_key())

    @property
    def epoch(self) -> int:
        return self.cursor.epoch

    def state_dict(self) -> dict[str, Any]:
        """The cursor (global steps consumed so far); save it with the model checkpoint."""
        ds, cursor = self.ds, self.cursor
        return {
            "format": STATE_FORMAT,
            "version_hash": ds.version_hash,
            "selection_digest": ds.selection_digest,
            "seed": ds.params.seed,
            "plan_shape": ds.params.shape,
            "epoch": cursor.epoch,
            # A JSON string: a flat value that torch.distributed.checkpoint stores as is.
            "legs": json.dumps([leg.to_json() for leg in cursor.legs]),
            "layout": asdict(self.layout),
            "step": cursor.step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly after the consumed batches of ``state`` (any world size/workers)."""
        if state.get("format") != STATE_FORMAT:
            raise PlanError(f"not a shardlake loader state (format {state.get('format')!r})")
        self.ds.check_identity(state)
        self.ds.adopt_plan_shape(state)
        docs = json.loads(state["legs"]) if isinstance(state["legs"], str) else state["legs"]
        legs = tuple(Leg.from_json(doc) for doc in docs)
        saved = Leg.from_json({**state["layout"], "steps": int(state["step"])})
        epoch = int(state["epoch"])
        if saved.layout == self.layout:
            self.cursor = Cursor(epoch, legs, saved.steps)
        else:
            # Another layout: a new leg over what the earlier legs did not consume.
            self.cursor = Cursor(epoch, (*legs, saved), 0)
        self._next.keep_if(self._pass_key())

    def close(self) -> None:
        """Stop the next epoch's prefetch, if one runs (its threads, its batches); the loader
        stays usable. Garbage collection of the loader does the same."""
        self._next.drop()

    def run_record(self) -> dict[str, Any]:
        record = self.ds.run_record()
        record["plan"]["num_workers"] = self.num_workers
        return record

    # --- iteration -------------------------------------------------------------------------------

    def _check_ranks(self) -> None:
        c = self.cursor
        self._ranks.check_same(
            (
                self.ds.version_hash,
                self.ds.selection_digest,
                self.ds.params.seed,
                c.epoch,
                c.step,
                tuple(tuple(sorted(leg.to_json().items())) for leg in c.legs),
                self.ds.batch_size,
            )
        )

    def _ahead(self) -> int:
        """The thread engine's batches in flight (being built or waiting to be taken)."""
        factor = int(self.options.get("prefetch_factor") or 2)
        return max(factor * self.layout.slots_per_rank, 2 * self.threads)

    def _pass_key(self, cursor: Cursor | None = None) -> tuple[Any, ...]:
        """What a thread-engine pass's batches depend on (a prefetched pass is used only when
        the pass asked for has the same)."""
        cursor = self.cursor if cursor is None else cursor
        return (cursor, self.layout, self.ds.params, self.threads, self._ahead())

    def _thread_pass(
        self, cursor: Cursor, *, budget: Budget | None = None, gated: bool = False
    ) -> ThreadBatches:
        opts = self.options
        if self._buffers is None:  # kept from pass to pass (see batch_buffers)
            pin = bool(opts.get("pin_memory", False))
            self._buffers = batch_buffers(self.threads, self._ahead(), pin, self.reuse_buffers)
        return ThreadBatches(
            self.ds,
            self.layout,
            cursor,
            threads=self.threads,
            ahead=self._ahead(),
            pool=self._buffers,
            timeout=opts.get("timeout"),
            budget=budget,
            gated=gated,
            keep_plan=budget is None,  # a prefetch leaves this epoch's plan cached
        )

    def _prefetch(self, current: ThreadBatches) -> None:
        """Start the next epoch's pass during ``current``'s tail (its reads are done)."""
        following = Cursor(self.cursor.epoch + 1)
        gated = self.ds.out.transform is not None  # it may read what the loop sets per epoch
        spec = self._thread_pass(following, budget=current.budget, gated=gated)
        self._next.put(self._pass_key(following), spec)

    def _batches(
        self, seeds: torch.Generator
    ) -> tuple[Iterator[Any], torch.Tensor | None, ThreadBatches | None]:
        """The engine's batch iterator for this pass, the process engine's buffer flags, and
        the thread engine's pass."""
        if self.engine == "threads":
            threads = self._next.take(self._pass_key())
            if threads is None:
                threads = self._thread_pass(self.cursor)
            else:
                threads.keep_plan()
            return iter(threads), None, threads
        # Buffer release flags shared with the workers (see collate.BufferPool).
        flags = None
        if self.num_workers > 0 and self.reuse_buffers:
            flags = torch.zeros(self.num_workers * POOL_SIZE, dtype=torch.int32).share_memory_()
        stream = _BatchStream(self.ds, self.layout, self.cursor, flags)
        options = dict(self.options)
        if self.num_workers > 0:
            options.setdefault("prefetch_factor", 2)
        loader = DataLoader(
            stream,
            batch_size=None,
            num_workers=self.num_workers,
            collate_fn=_identity,
            generator=seeds,  # its workers' base seed: the draw __iter__ made (not a second)
            **options,
        )
        return _start_workers(loader), flags, None

    def __iter__(self) -> Iterator[Any]:
        """One pass (an epoch, or its rest). Like a ``DataLoader``'s iterator, it draws once
        from torch's global generator when made (whichever engine): a training moved from
        ``DataLoader`` + ``DistributedSampler`` keeps its random stream (dropout masks,
        augmentations)."""
        # DataLoader's _BaseDataLoaderIter draws its workers' base seed so; the process engine's
        # DataLoader draws the same value again from a copy of the state taken before.
        seeds = torch.Generator()
        seeds.set_state(torch.default_generator.get_state())
        torch.empty((), dtype=torch.int64).random_()
        return self._iterate(seeds)

    def _iterate(self, seeds: torch.Generator) -> Iterator[Any]:
        synced = self.sync and distributed()
        if synced and not self._checked:
            self._check_ranks()
            self._checked = True
        held: list[tuple[StorageWeakRef, int]] = []
        it, flags, current = self._batches(seeds)
        prefetch = current is not None and self.prefetch_next_epoch
        completed = False
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
                    # The finished frames it came through (the engine's, or DataLoader's, whose
                    # reraise keeps the error in a local) would hold it, their traceback and
                    # so this loader in a cycle: drop their locals, keep the traceback.
                    traceback.clear_frames(exc.__traceback__)
                    error = exc
                if synced:
                    self._ranks.agree(error, ended)
                elif error is not None:
                    raise error
                if prefetch and current is not None and (ended or current.fed.is_set()):
                    prefetch = False
                    self._prefetch(current)
                if ended:
                    completed = True
                    break
                batch = unpack_batch(batch)
                if flags is not None:
                    held = _release(held, flags, batch)
                self.cursor = replace(self.cursor, step=self.cursor.step + 1)
                yield batch
                batch = None  # drop our reference, so only the user's keeps the buffer
        finally:
            # The error's traceback holds this frame (and so the loader): this frame must not
            # hold the error, or only the collector frees them (at worst at interpreter exit).
            error = batch = None
            if not completed:  # the pass stopped early: the epoch after it is not next
                self._next.drop()
            # Join the workers now, before an error leaves the loader: left to the iterator's
            # __del__ at interpreter shutdown, the join races teardown and a rank can exit 1.
            shutdown = getattr(it, "_shutdown_workers", None) or getattr(it, "close", None)
            if shutdown is not None:
                shutdown()
            del it
        # A complete pass: the next iteration is the next epoch.
        self.cursor = Cursor(self.cursor.epoch + 1)


class _NextPass:
    """The next epoch's thread-engine pass, started during the current one's tail, and what
    it was started for (see :meth:`ShardLoader._pass_key`). Holds no reference to the loader,
    so that the loader's finalizer can stop it."""

    def __init__(self) -> None:
        self.key: tuple[Any, ...] | None = None
        self.batches: ThreadBatches | None = None

    def put(self, key: tuple[Any, ...], batches: ThreadBatches) -> None:
        self.drop()
        batches.start()
        self.key, self.batches = key, batches

    def take(self, key: tuple[Any, ...]) -> ThreadBatches | None:
        """The pass if it was started for ``key`` (then no longer held here); else None."""
        batches = self.batches if self.key == key else None
        if batches is None or batches.failed():
            self.drop()
            batches = None
        self.key = self.batches = None
        return batches

    def share_plan(self, key: tuple[Any, ...]) -> None:
        """The dataset's cached plan becomes the prefetch's, if it was started for ``key``."""
        if self.key == key and self.batches is not None:
            self.batches.keep_plan(wait=True)

    def keep_if(self, key: tuple[Any, ...]) -> None:
        if self.key != key:
            self.drop()

    def drop(self) -> None:
        batches, self.key, self.batches = self.batches, None, None
        if batches is not None:
            batches.close()


def _start_workers(loader: DataLoader[Any]) -> Iterator[Any]:
    """``iter(loader)``, with the parent's objects frozen while the workers are forked.

    A forked worker's garbage collector would otherwise walk (and so copy-on-write) every page
    of the parent's objects; frozen objects are left alone in the children. The parent
    unfreezes at once, so its own collection is unchanged.
    """
    if loader.num_workers == 0:
        return iter(loader)
    gc.freeze()
    try:
        return iter(loader)
    finally:
        gc.unfreeze()


def _release(
    held: list[tuple[StorageWeakRef, int]], flags: torch.Tensor, batch: Any
) -> list[tuple[StorageWeakRef, int]]:
    """Hand buffers whose batches are gone back to their workers; track ``batch``'s buffer."""
    alive = []
    for ref, index in held:
        if ref.expired():
            flags[index] = 0
        else:
            alive.append((ref, index))
    index = batch.pop(BUFFER_KEY, -1) if isinstance(batch, dict) else -1
    if index >= 0:
        storage = next(v for v in batch.values() if isinstance(v, torch.Tensor)).untyped_storage()
        alive.append((StorageWeakRef(storage), index))
    return alive
