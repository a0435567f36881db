"""Per-slot streaming of sample payloads through a Store: MB-scale ranged reads, read-ahead.

A slot's plan is a list of *chunks* (rows of one shard, ascending offsets; the loader sizes
chunks to about ``ReadOptions.request_bytes`` of payload) and, per emitted sample, which chunk
holds it. A chunk is fetched with one ``read_ranges`` call whose ranges are its members
coalesced (:func:`coalesce`): a gap between members is read over (skimmed) while the unselected
bytes stay within ``max_skim_fraction`` of the request, so a dense run of samples is one
request of several MB and a sparse selection fetches little beyond its members. Up to
``max_inflight`` chunks (sized from a throughput target) are fetched by a thread pool while the
caller decodes; read-ahead stops when ``max_buffer_bytes`` of payloads are fetched (or being
fetched) and not yet opened. A chunk is refilled as each one opens, so GETs stay in flight
while the worker decodes (plan shape 2 opens its runs one at a time).

Retries of failed requests belong to the store layer (its retry policy). Integrity is checked
once per payload: a zstd frame carrying a content checksum (every frame shardlake writes) is
verified while it is decompressed, so the loader makes no separate CRC-32 pass over it; other
payloads, and those bound for the epoch cache, are checked against the manifest's CRC-32 as
they arrive. A payload failing either check is re-read (:meth:`SlotReader.refetch`, which
checks the CRC-32) up to the store's ``retry.integrity_rereads`` times, like every other payload
read; a mismatch on every read is an ``IntegrityError`` naming the store URL, shard, key and
offset.

With an :class:`~shardlake.read.cache.EpochCache`, payloads are looked up there first and the
fetched ones are stored there (after their CRC check) for the next epoch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn, overload

import numpy as np

from ..errors import IntegrityError, KeyNotFoundError
from ..format.codec import frame_has_checksum, payload_checksum
from ..progress.bar import plural
from ..read.cache import EpochCache
from ..read.options import DEFAULT_REQUEST_BYTES, ReadOptions
from ..read.receipts import superseded_error
from ..store import Store
from .plan_types import DEFAULT_CHUNK_SIZE, PLAN_SHAPE
from .slot_units import Reach, SlotUnits, chunk_ends

__all__ = [
    "ChunkList",
    "Payload",
    "RowTable",
    "SlotReader",
    "coalesce",
    "iter_ints",
    "request_chunk_size",
    "selection_members",
]

Payload = bytes | memoryview
MAX_RUN_SAMPLES = 512  # plan shape 2, shuffled, request_bytes unset: samples per run at most
DEFAULT_LOOKAHEAD = 32  # emits the reader asks for at once (the loader passes its batch size)


def _missing_shard(store: Any, key: str, exc: KeyNotFoundError) -> NoReturn:
    """A shard gone mid-epoch: name the forget that deleted it and the successor, if one did."""
    split = getattr(store, "store_of", None)
    real, inner = split(key) if split is not None else (store, key)
    redacted = superseded_error(real, inner)
    if redacted is None:
        raise exc
    raise redacted from exc


@dataclass(frozen=True)
class RowTable:
    """The columns a reader needs, as plain arrays (cheap to pickle into workers)."""

    shard: np.ndarray[Any, Any]  # int64 index into shard_keys
    offset: np.ndarray[Any, Any]
    size: np.ndarray[Any, Any]
    raw_size: np.ndarray[Any, Any]
    crc32: np.ndarray[Any, Any]
    keys: Sequence[str]
    shard_keys: Sequence[str]

    def __len__(self) -> int:
        return len(self.keys)


def request_chunk_size(
    table: RowTable,
    options: ReadOptions,
    *,
    shuffled: bool = True,
    shape: int = PLAN_SHAPE,
    mean: float | None = None,
) -> int:
    """Samples per plan chunk so that a dense chunk is about one ``request_bytes`` GET.

    With ``request_bytes`` unset the target is :data:`DEFAULT_REQUEST_BYTES`. Plan shape 2
    (the default) reads runs of that size shuffled or not (shuffled: of at most
    ``MAX_RUN_SAMPLES`` samples): its lanes keep ``interleave`` runs open at once, which is
    what mixes partitions into a batch. Plan shape 1 (loader states
    saved before it) held a shuffled chunk to at most ``DEFAULT_CHUNK_SIZE`` samples.
    """
    target = options.request_bytes or DEFAULT_REQUEST_BYTES
    if mean is None:  # `mean`: the mean payload size, where the caller knows it
        mean = float(table.size.mean()) if len(table) else 1.0
    samples = max(1, min(4096, round(target / max(mean, 1.0))))
    if options.request_bytes or not shuffled:
        return samples
    if shape >= 2:
        # A worker holds its open runs' payloads as one object per sample: with small samples
        # runs stop at MAX_RUN_SAMPLES (32 lanes x 512 samples, ~4 MB of objects per worker).
        return min(MAX_RUN_SAMPLES, samples)
    return min(DEFAULT_CHUNK_SIZE, samples)


def selection_members(table: RowTable) -> Iterator[tuple[str, np.ndarray[Any, Any]]]:
    """``(shard_key, offsets)`` of every selected payload, per shard (what a cache must keep)."""
    order = np.argsort(table.shard, kind="stable")
    shards = table.shard[order]
    cuts = np.flatnonzero(np.diff(shards)) + 1
    for group in np.split(order, cuts):
        if len(group):
            yield table.shard_keys[int(table.shard[group[0]])], table.offset[group]


def coalesce(
    offsets: Sequence[int],
    sizes: Sequence[int],
    gap: int,
    max_skim_fraction: float = 0.0,
    max_bytes: int | None = None,
) -> list[tuple[int, int, list[int]]]:
    """Group members (ascending offsets) into spans ``(start, end, member indices)``.

    A member joins the previous span when the gap to it is at most ``gap`` bytes, or when the
    span's skimmed (unselected) bytes stay within ``max_skim_fraction`` of its selected bytes;
    and the span stays within ``max_bytes`` (if given).
    """
    spans: list[tuple[int, int, list[int]]] = []
    skimmed = useful = 0
    for i, (off, size) in enumerate(zip(offsets, sizes, strict=False)):
        if spans and off >= spans[-1][0]:
            start, end, members = spans[-1]
            hole = max(0, off - end)
            new_end = max(end, off + size)
            fits = max_bytes is None or new_end - start <= max_bytes
            cheap = hole <= gap or skimmed + hole <= max_skim_fraction * (useful + size)
            if fits and cheap:
                members.append(i)
                spans[-1] = (start, new_end, members)
                skimmed += hole
                useful += size
                continue
        spans.append((off, off + size, [i]))
        skimmed, useful = 0, size
    return spans


def iter_ints(values: np.ndarray[Any, Any], block: int = 4096) -> Iterator[Any]:
    """The items of ``values`` as Python scalars, converted ``block`` at a time."""
    for begin in range(0, len(values), block):
        yield from values[begin : begin + block].tolist()


class ChunkList(Sequence[np.ndarray[Any, Any]]):
    """A slot's chunks as views into one flat array: one NumPy object per chunk would cost
    ~7 bytes a sample at the default 16 samples a chunk."""

    def __init__(self, chunks: Sequence[np.ndarray[Any, Any]]) -> None:
        lengths = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=len(chunks))
        self.bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        flat = np.concatenate(list(chunks)) if len(chunks) else np.zeros(0, np.int64)
        fits = not len(flat) or (int(flat.min()) >= 0 and int(flat.max()) < 2**31)
        self.flat = flat.astype(np.int32 if fits else np.int64, copy=False)

    @classmethod
    def from_flat(cls, flat: np.ndarray[Any, Any], bounds: np.ndarray[Any, Any]) -> ChunkList:
        """Chunks ``flat[bounds[i]:bounds[i + 1]]`` (e.g. views into a mapped plan file)."""
        self = cls.__new__(cls)
        self.flat, self.bounds = flat, bounds
        return self

    def __len__(self) -> int:
        return len(self.bounds) - 1

    @overload
    def __getitem__(self, index: int) -> np.ndarray[Any, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[np.ndarray[Any, Any]]: ...

    def __getitem__(self, index: int | slice) -> np.ndarray[Any, Any] | list[np.ndarray[Any, Any]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = int(index) + len(self) if int(index) < 0 else int(index)
        if not 0 <= i < len(self):
            raise IndexError(f"chunk {index} is outside {len(self)} chunks")
        return self.flat[self.bounds[i] : self.bounds[i + 1]]


class SlotReader:
    """Fetches the payloads of one slot's samples in emit order (see the module docstring).

    Units are asked for in two tiers: every unit the next ``lookahead`` emits need (a batch),
    and read-ahead beyond them only while none of those is still on its way, so a server that
    shares its bandwidth among all GETs in flight serves the ones a batch waits for first.
    """

    def __init__(
        self,
        store: Store,
        table: RowTable,
        chunks: Sequence[np.ndarray[Any, Any]],
        emit_rows: np.ndarray[Any, Any],
        emit_chunk: np.ndarray[Any, Any],
        options: ReadOptions | None = None,
        *,
        cache: EpochCache | None = None,
        lookahead: int = DEFAULT_LOOKAHEAD,
        ends: np.ndarray[Any, Any] | None = None,
        begin: int = 0,
    ) -> None:
        """``ends``: the slot's :func:`.slot_units.chunk_ends` (the plan keeps them; without
        them they are computed here, ``O(emits)``), and ``begin``: the slot's emits before
        ``emit_rows[0]`` (a resume), which ``ends`` count."""
        self.store = store
        self.lookahead = lookahead
        self.table = table
        self.options = options or ReadOptions()
        self.cache = cache
        self.emit_rows = np.asarray(emit_rows)  # int32 or int64: a view of the plan's rows
        self.emit_chunk = np.asarray(emit_chunk)
        self.chunks = chunks
        # Units are set up as the reads reach them (:class:`.slot_units.SlotUnits`): nothing
        # here is O(slot), so a worker's first batch (and a resume) costs its first units.
        if ends is None:
            ends, begin = chunk_ends(self.emit_chunk, len(chunks)), 0
        self.ends, self.begin = ends, begin
        self.units: SlotUnits | None = None  # the current pass's (for its `scanned`)
        self.bytes_fetched = 0
        self.requests = 0

    def _emits(self) -> Iterator[tuple[int, int]]:
        """``(row, chunk)`` in emit order, as Python ints a block at a time (a whole slot's
        worth of int objects would cost a worker ~70 bytes per sample)."""
        return zip(iter_ints(self.emit_rows), iter_ints(self.emit_chunk), strict=False)

    # --- fetching ------------------------------------------------------------------------------

    def where(self, row: int) -> str:
        t = self.table
        return (
            f"{self.store.key_url(t.shard_keys[int(t.shard[row])])} key {t.keys[row]!r} "
            f"offset {int(t.offset[row])}"
        )

    def _member(self, row: int) -> tuple[str, int, int, int]:
        t = self.table
        return (
            t.shard_keys[int(t.shard[row])],
            int(t.offset[row]),
            int(t.size[row]),
            int(t.crc32[row]),
        )

    def _fetch_rows(self, rows: list[int]) -> dict[int, Payload]:
        """Payloads of ``rows`` (one shard, ascending offsets), each checked against its CRC."""
        out: dict[int, Payload] = {}
        cache = self.cache
        missing = rows
        if cache is not None:
            missing = []
            for row in rows:
                hit = cache.get(*self._member(row))
                if hit is None:
                    missing.append(row)
                else:
                    out[row] = hit
        if not missing:
            return out
        t = self.table
        shard_key = t.shard_keys[int(t.shard[missing[0]])]
        offsets = t.offset[missing].tolist()
        sizes = t.size[missing].tolist()
        opts = self.options
        spans = coalesce(offsets, sizes, opts.skim_gap, opts.max_skim_fraction)
        self.requests += len(spans)
        try:
            data = self.store.read_ranges([(shard_key, s, e) for s, e, _ in spans], views=True)
        except KeyNotFoundError as exc:
            _missing_shard(self.store, shard_key, exc)
        for (start, _end, members), blob in zip(spans, data, strict=True):
            self.bytes_fetched += len(blob)
            view = memoryview(blob)
            for i in members:
                rel = offsets[i] - start
                row = missing[i]
                payload: Payload = view[rel : rel + sizes[i]]
                if len(payload) != sizes[i] or not self._trusted(payload, row):
                    payload = self.refetch(row)
                out[row] = payload
                if cache is not None:
                    cache.put(*self._member(row), payload)
        return out

    def _trusted(self, payload: Payload, row: int) -> bool:
        """Whether ``payload`` may go to the decoder without a CRC-32 pass of its own.

        A zstd frame with a content checksum is checked while it is decompressed (a bad one is
        re-read through :meth:`refetch`), so a second pass over its bytes here is waste. A payload
        bound for the epoch cache is checked now: the cache must never keep bad bytes.
        """
        if self.cache is None and frame_has_checksum(payload):
            return True
        return payload_checksum(payload) == int(self.table.crc32[row])

    def refetch(self, row: int) -> bytes:
        """Re-read one payload from the store, up to the store's ``retry.integrity_rereads``
        times (the one re-read policy of every payload read); ``IntegrityError`` if every
        re-read mismatches.

        Called after a CRC mismatch and after a zstd frame checksum failure at decode time (a
        payload served by the cache is re-read from the store, never from the cache).
        """
        shard_key, start, size, crc = self._member(row)
        rereads = self.store.retry.integrity_rereads
        problem = "no re-read allowed (retry.integrity_rereads is 0)"
        for _ in range(rereads):
            self.requests += 1
            payload = self.store.read_range(shard_key, start, start + size)
            self.bytes_fetched += len(payload)
            actual = payload_checksum(payload)
            if len(payload) == size and actual == crc:
                if self.cache is not None:
                    self.cache.put(shard_key, start, size, crc, payload)
                return payload
            problem = (
                f"payload checksum mismatch (crc32 {actual:08x}, manifest says {crc:08x}, "
                f"{len(payload)} of {plural(size, 'byte')})"
            )
        raise IntegrityError(f"{self.where(row)}: {problem} on {plural(rereads + 1, 'read')}")

    # --- emitting ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[int, Payload]]:
        """``(row, payload)`` in emit order."""
        opts = self.options
        units = self.units = SlotUnits(
            self.chunks, self.emit_rows, self.emit_chunk, self.table.size, self.ends, self.begin
        )
        reach = Reach(self.emit_chunk)
        pool = ThreadPoolExecutor(max_workers=opts.max_inflight)
        # Keyed by chunk number: units are fetched in chunk order.
        futures: dict[int, Future[dict[int, Payload]]] = {}
        held: dict[int, dict[int, Payload]] = {}
        left: dict[int, int] = {}  # emits still to come, per unit asked for or open
        unit_bytes: dict[int, int] = {}  # per unit asked for and not opened yet
        # Bytes read ahead: units submitted whose first sample is not emitted yet. Units being
        # emitted (the plan's open runs) do not count, so read-ahead refills steadily, one
        # unit as each one opens, instead of waiting for a whole set of runs to end.
        ahead_bytes = 0
        next_unit = units.next_unit(0)

        def submit(unit: int) -> None:
            nonlocal next_unit, ahead_bytes
            rows, count, size = units.unit(unit)
            futures[unit] = pool.submit(self._fetch_rows, rows.tolist())
            left[unit], unit_bytes[unit] = count, size
            ahead_bytes += size
            next_unit = units.next_unit(unit + 1)

        def submit_more(need: int) -> None:
            while next_unit is not None and next_unit <= need:
                submit(next_unit)
            if any(u <= need and not f.done() for u, f in futures.items()):
                return  # read-ahead waits while a unit the next batch needs is on its way
            while (
                next_unit is not None
                and len(futures) < opts.max_inflight
                and ahead_bytes < opts.max_buffer_bytes
            ):
                submit(next_unit)

        try:
            for position, (row, unit) in enumerate(self._emits()):
                need = max(unit, reach.needed_by(position + self.lookahead))
                submit_more(need)
                if unit not in held:
                    held[unit] = futures.pop(unit).result()
                    ahead_bytes -= unit_bytes.pop(unit)
                    submit_more(need)  # the same tiers: read-ahead still waits for `need`
                payload = held[unit][row]
                left[unit] -= 1
                if left[unit] == 0:
                    del held[unit], left[unit]
                yield row, payload
        finally:
            for fut in futures.values():
                fut.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
