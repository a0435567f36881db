"""Decoding payloads into samples, and straight into a batch's shared-memory tensors.

The fast path (:class:`BatchBuilder`) is why the loader beats per-sample loaders: a DataLoader
worker allocates each batch tensor once, in shared memory (as ``default_collate`` does inside
workers), and copies every decoded array into its row. The worker then hands the main process
one batch of shared tensors per step instead of ``batch_size`` pickled sample dicts.

Collated batches equal ``default_collate`` over the per-sample dicts: numeric arrays are stacked,
0-d strings become lists of ``str``, Python scalars (manifest columns) become tensors.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info

from ..errors import IntegrityError, UsageError
from ..format.codec import Decoder, TensorSpec, decode_safetensors, safetensors_layout

__all__ = [
    "BUFFER_KEY",
    "BatchBuilder",
    "BatchJob",
    "BufferPool",
    "LocalBufferPool",
    "PayloadDecoder",
    "collate_samples",
    "make_sample",
    "new_batch_tensors",
]

RefetchFn = Callable[[int], bytes]
WhereFn = Callable[[int], str]

_TORCH_DTYPE: dict[np.dtype[Any], torch.dtype] = {}


def torch_dtype(dtype: np.dtype[Any]) -> torch.dtype:
    found = _TORCH_DTYPE.get(dtype)
    if found is None:
        found = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
        _TORCH_DTYPE[dtype] = found
    return found


def _is_python_scalar_array(array: np.ndarray[Any, Any]) -> bool:
    """0-d strings are yielded as Python ``str``/``bytes`` (tensors cannot hold them)."""
    return array.ndim == 0 and array.dtype.kind in "US"


def _as_sample_value(array: np.ndarray[Any, Any]) -> Any:
    if _is_python_scalar_array(array):
        return array.item()
    if array.dtype.kind in "US":  # n-d string arrays stay numpy (default_collate refuses them too)
        return array.copy()
    # Copy out of the (read-only) decompressed buffer into memory the tensor owns.
    return torch.from_numpy(array.copy())


class PayloadDecoder:
    """zstd + safetensors decode; a bad zstd frame is re-read once through ``refetch``.

    Safe to call from several threads at once (the thread engine): a zstd decompression
    context must not be shared between threads, so each thread gets its own."""

    def __init__(self, refetch: RefetchFn, where: WhereFn) -> None:
        self._local = threading.local()
        self._refetch = refetch
        self._where = where

    @property
    def _decoder(self) -> Decoder:
        found: Decoder | None = getattr(self._local, "decoder", None)
        if found is None:
            found = self._local.decoder = Decoder()
        return found

    def raw(self, row: int, payload: bytes | memoryview) -> bytes:
        """The decompressed safetensors bytes; a bad zstd frame is re-read, then reported."""
        decoder = self._decoder
        try:
            return decoder.decompress(payload)
        except IntegrityError:
            payload = self._refetch(row)  # raises if the re-read fails its CRC-32
        try:
            return decoder.decompress(payload)
        except IntegrityError as exc:
            raise IntegrityError(f"{self._where(row)}: {exc} (on two reads)") from exc

    def where(self, row: int) -> str:
        return self._where(row)

    def layout(self, row: int, raw: bytes) -> tuple[int, tuple[TensorSpec, ...]]:
        """``(body offset, tensor specs)`` of decompressed bytes (headers are parsed once)."""
        try:
            return safetensors_layout(raw, "decoded payload")
        except IntegrityError as exc:  # the location is built only when needed
            raise IntegrityError(f"{self._where(row)}: {exc}") from exc

    def arrays_of(self, row: int, raw: bytes) -> dict[str, np.ndarray[Any, Any]]:
        try:
            return decode_safetensors(raw, "decoded payload")
        except IntegrityError as exc:
            raise IntegrityError(f"{self._where(row)}: {exc}") from exc

    def arrays(self, row: int, payload: bytes | memoryview) -> dict[str, np.ndarray[Any, Any]]:
        return self.arrays_of(row, self.raw(row, payload))


def make_sample(
    arrays: dict[str, np.ndarray[Any, Any]],
    drop_keys: Sequence[str],
    key: str | None,
    meta: dict[str, Any],
) -> dict[str, Any]:
    """One sample dict: stored names in stored order, then ``__key__`` and manifest columns."""
    sample: dict[str, Any] = {
        name: _as_sample_value(array) for name, array in arrays.items() if name not in drop_keys
    }
    if key is not None:
        sample["__key__"] = key
    sample.update(meta)
    return sample


def _contiguous_strides(shape: Sequence[int]) -> list[int]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return strides


BUFFER_KEY = "__shardlake_buffer__"  # batch entry naming the pooled buffer (popped by the loader)


class BufferPool:
    """A worker's reusable shared-memory batch buffers.

    Fresh shared memory is expensive: the kernel zeroes and maps every page on first touch
    (about as costly as decoding, measured). So a worker keeps up to ``size`` buffers and reuses
    one once the main process has *released* it: the loader marks ``flags[i] = 0`` when its
    weak reference to the batch's storage expires, i.e. when no tensor or view of that batch is
    alive in the main process any more. A batch the user keeps is never overwritten; when every
    pooled buffer is still held, a fresh unpooled one is used.
    """

    def __init__(
        self,
        flags: torch.Tensor,
        base: int,
        size: int,
        allocate: Callable[[int], torch.UntypedStorage] | None = None,
    ) -> None:
        self.flags = flags
        self.base = base
        self.size = size
        self.buffers: list[torch.UntypedStorage] = []
        self.allocate = allocate or torch.UntypedStorage._new_shared
        self.lock = threading.RLock()  # held by new_batch_tensors while it takes a buffer

    def take(self, nbytes: int) -> tuple[torch.UntypedStorage, int]:
        with self.lock:
            for j, storage in enumerate(self.buffers):
                if int(self.flags[self.base + j]) == 0 and storage.nbytes() >= nbytes:
                    self.flags[self.base + j] = 1
                    return storage, self.base + j
            if len(self.buffers) < self.size:
                storage = self.allocate(nbytes)
                self.buffers.append(storage)
                self.flags[self.base + len(self.buffers) - 1] = 1
                return storage, self.base + len(self.buffers) - 1
        return self.allocate(nbytes), -1


_use_count: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count", None)


class LocalBufferPool(BufferPool):
    """The thread engine's reusable batch buffers (plain or pinned memory, in this process).

    A buffer is free again once no tensor or view of its batch is alive: its storage is then
    referenced by this pool alone. Fresh memory costs a page fault per page on first touch
    (a fresh batch-sized allocation is mapped anew by malloc every time)."""

    def __init__(self, size: int, allocate: Callable[[int], torch.UntypedStorage]) -> None:
        super().__init__(torch.zeros(0, dtype=torch.int32), 0, size if _use_count else 0, allocate)

    def take(self, nbytes: int) -> tuple[torch.UntypedStorage, int]:
        with self.lock:
            for storage in self.buffers:
                if storage.nbytes() >= nbytes and _use_count and _use_count(storage._cdata) == 1:
                    return storage, -1
            storage = self.allocate(nbytes)
            if len(self.buffers) < self.size:
                self.buffers.append(storage)
            return storage, -1


def new_batch_tensors(
    specs: Sequence[tuple[tuple[int, ...], torch.dtype]],
    shared: bool,
    pool: BufferPool | None = None,
) -> tuple[list[torch.Tensor], int]:
    """Tensors of the given shapes/dtypes, all views into ONE allocation; and its pool index.

    One allocation per batch instead of one per array: a worker creates (or reuses) one
    shared-memory segment per step and the main process maps one file descriptor, not one per
    array. The index is -1 unless the allocation came from ``pool``.
    """
    offsets, total = [], 0
    for shape, dtype in specs:
        item = torch.empty(0, dtype=dtype).element_size()
        total += -total % 64  # keep every array 64-byte aligned
        offsets.append(total)
        total += int(np.prod(shape, dtype=np.int64)) * item
    total = max(total, 1)

    def views(storage: torch.UntypedStorage) -> list[torch.Tensor]:
        out = []
        for (shape, dtype), offset in zip(specs, offsets, strict=True):
            item = torch.empty(0, dtype=dtype).element_size()
            t = torch.empty(0, dtype=dtype)
            t.set_(storage, offset // item, shape, _contiguous_strides(shape))
            out.append(t)
        return out

    if pool is not None:
        # Under the pool's lock: a buffer counts as taken once these views hold it.
        with pool.lock:
            storage, index = pool.take(total)
            return views(storage), index
    if shared:
        return views(torch.UntypedStorage._new_shared(total)), -1
    return views(torch.UntypedStorage(total)), -1


class _BatchSlots:
    """One batch's destination: tensors (one shared allocation), string lists, and the byte
    copies that move a sample with the first sample's header into row ``i``."""

    def __init__(
        self,
        n: int,
        specs: tuple[TensorSpec, ...],
        drop_keys: frozenset[str],
        shared: bool,
        pool: BufferPool | None,
    ) -> None:
        # Shapes and dtypes come from the first sample (safetensors header); the others must
        # match, as for default_collate's stack.
        self.specs = specs
        kept = [spec for spec in specs if spec[0] not in drop_keys]
        self.order = [spec[0] for spec in kept]
        # Rows may be filled by several threads at once (a batch built in parts): string
        # lists are filled by index, never appended to.
        self.lists: dict[str, list[Any]] = {}
        self.strings: list[TensorSpec] = []
        numeric: list[TensorSpec] = []
        for spec in kept:
            if spec[1].kind in "US":
                self.lists[spec[0]] = [None] * n
                self.strings.append(spec)
            else:
                numeric.append(spec)
        made, self.buffer = new_batch_tensors(
            [((n, *shape), torch_dtype(dtype)) for _, dtype, shape, _, _ in numeric], shared, pool
        )
        self.tensors = {spec[0]: t for spec, t in zip(numeric, made, strict=True)}
        self.views = {name: t.numpy() for name, t in self.tensors.items()}
        # (destination byte offset of row 0, bytes per row, source offset in the body)
        self.copies: list[tuple[int, int, int]] = []
        self.dest: np.ndarray[Any, np.dtype[np.uint8]] | None = None
        if made:
            storage = made[0].untyped_storage()
            whole = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
            self.dest = whole.numpy()
            for (_, _, _, start, end), t in zip(numeric, made, strict=True):
                if end > start:
                    offset = int(t.storage_offset()) * t.element_size()
                    self.copies.append((offset, end - start, start))

    def fill(self, i: int, raw: bytes, body: int) -> None:
        """Row ``i`` from a sample whose header equals the first sample's: plain byte copies."""
        src = np.frombuffer(raw, dtype=np.uint8)
        dest = self.dest
        if dest is not None:
            # NumPy copies without the GIL (a memoryview slice assignment holds it): the
            # thread engine's builders copy their batches' rows at once.
            for base, size, start in self.copies:
                at = base + i * size
                dest[at : at + size] = src[body + start : body + start + size]
        for name, dtype, shape, start, end in self.strings:
            value = np.frombuffer(memoryview(raw)[body + start : body + end], dtype=dtype)
            value = value.reshape(shape)
            self.lists[name][i] = _as_sample_value(value)

    def fill_checked(self, i: int, arrays: dict[str, np.ndarray[Any, Any]], where: str) -> None:
        """Row ``i`` from a sample with another header: array by array, checking each."""
        for name in self.order:
            array = arrays.get(name)
            if array is None:
                # Not damage: samples written with other arrays (a usage error, as for shapes).
                raise UsageError(
                    f"samples of one batch differ: the sample at {where} has no array "
                    f"{name!r}, the first sample of its batch has; pass transform= to reshape "
                    "samples, or use a plain DataLoader with a custom collate_fn"
                )
            if name in self.lists:
                self.lists[name][i] = _as_sample_value(array)
                continue
            out = self.views[name]
            if array.shape != out.shape[1:] or array.dtype != out.dtype:
                raise UsageError(
                    f"samples of one batch differ: array {name!r} is "
                    f"{array.dtype.str}{list(array.shape)} in the sample at {where}, "
                    f"{out.dtype.str}{list(out.shape[1:])} in the first sample of its batch; "
                    "the loader stacks equal shapes only (pass transform= to pad or crop them)"
                )
            out[i] = array

    def batch(self) -> dict[str, Any]:
        return {name: self.tensors.get(name, self.lists.get(name)) for name in self.order}


class BatchBuilder:
    """Assembles one batch by decoding payloads directly into preallocated batch tensors.

    Samples whose safetensors header is byte-identical to the batch's first (the usual case:
    same names, dtypes and shapes) are copied into their rows as raw byte ranges, without
    building an array per tensor; any other sample is checked array by array.
    """

    def __init__(
        self,
        batch_size: int,
        drop_keys: Sequence[str],
        *,
        shared: bool | None = None,
        pool: BufferPool | None = None,
    ) -> None:
        self.pool = pool
        self.batch_size = batch_size
        self.drop_keys = frozenset(drop_keys)
        self.shared = get_worker_info() is not None if shared is None else shared

    def build(
        self,
        decoder: PayloadDecoder,
        items: Sequence[tuple[int, bytes | memoryview]],
        keys: Sequence[str] | None,
        meta: dict[str, Sequence[Any]],
    ) -> dict[str, Any]:
        job = self.job(decoder, items, keys, meta)
        job.fill(0, len(items))
        return job.finish()

    def job(
        self,
        decoder: PayloadDecoder,
        items: Sequence[tuple[int, bytes | memoryview]],
        keys: Sequence[str] | None,
        meta: dict[str, Sequence[Any]],
        extras: dict[str, Any] | None = None,
    ) -> BatchJob:
        """The batch as work to split: :meth:`BatchJob.fill` of row ranges (on any threads,
        the range holding row 0 submitted first), then :meth:`BatchJob.finish`. ``extras``:
        entries the batch ends with."""
        return BatchJob(self, decoder, items, keys, meta, extras or {})


class BatchJob:
    """One batch being built, possibly by several threads at once (the thread engine splits
    a batch among its threads so that the first batch of a pass, and the last, use every
    core). The rows' order, values and checks are those of a one-thread build.

    The range holding row 0 shapes the batch (the first sample's header gives the tensors);
    every other range decompresses its first sample, then waits for that.
    """

    def __init__(
        self,
        builder: BatchBuilder,
        decoder: PayloadDecoder,
        items: Sequence[tuple[int, bytes | memoryview]],
        keys: Sequence[str] | None,
        meta: dict[str, Sequence[Any]],
        extras: dict[str, Any],
    ) -> None:
        self.builder = builder
        self.decoder = decoder
        self.items = items
        self.keys = keys
        self.meta = meta
        self.extras = extras
        self.slots: _BatchSlots | None = None
        self._shaped = threading.Event()  # set once row 0's range has made (or failed) slots
        self._abandoned = False

    def abandon(self) -> None:
        """Nobody wants the batch (its ranges may be cancelled): ranges waiting for row 0's,
        and those yet to start, return at once."""
        self._abandoned = True
        self._shaped.set()

    def _put(self, slots: _BatchSlots, i: int, raw: bytes) -> None:
        decoder, row = self.decoder, self.items[i][0]
        body, specs = decoder.layout(row, raw)
        if specs is slots.specs or specs == slots.specs:
            slots.fill(i, raw, body)
        else:
            slots.fill_checked(i, decoder.arrays_of(row, raw), decoder.where(row))

    def fill(self, lo: int, hi: int) -> None:
        """Decode rows ``[lo, hi)`` into the batch."""
        if lo >= hi:
            return
        decoder, items = self.decoder, self.items
        if lo == 0:
            try:
                raw = decoder.raw(*items[0])
                body, specs = decoder.layout(items[0][0], raw)
                b = self.builder
                slots = _BatchSlots(len(items), specs, b.drop_keys, b.shared, b.pool)
                self.slots = slots
            finally:
                self._shaped.set()  # a failure here is the batch's; the other ranges stop
            if self._abandoned:
                return
            slots.fill(0, raw, body)
        else:
            raw = decoder.raw(*items[lo])
            self._shaped.wait()
            found = self.slots
            if self._abandoned or found is None:
                return
            slots = found
            self._put(slots, lo, raw)
        for i in range(lo + 1, hi):
            self._put(slots, i, decoder.raw(*items[i]))

    def finish(self) -> dict[str, Any]:
        """The batch, once every row range is filled."""
        slots = self.slots
        batch = slots.batch() if slots is not None else {}
        if self.keys is not None:
            batch["__key__"] = list(self.keys)
        for name, values in self.meta.items():
            batch[name] = default_collate(list(values))
        if slots is not None and slots.buffer >= 0:
            batch[BUFFER_KEY] = slots.buffer
        batch.update(self.extras)
        return batch


def collate_samples(samples: list[dict[str, Any]]) -> Any:
    """The slow path (with a ``transform``): ``default_collate`` over transformed samples."""
    return default_collate(samples)
