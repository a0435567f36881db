"""The slot reader sets up its units as it reaches them: a slot's first batch does the first
units' work, and the reads, their order and the emitted payloads are those of the whole-slot
set-up it replaced (tests/support/slot_reference.py), on plans of every shape and on arbitrary
layouts (resumes mid-chunk, repeats, chunks out of order, chunks never emitted)."""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.slot_reference import WholeSlotReader, reference_args

import shardlake.torch.reader as reader_module
from shardlake.torch.compact import compact_plan, plan_arrays, plan_from_arrays
from shardlake.torch.plan import plan_epoch
from shardlake.torch.plan_batches import plan_torch_leg
from shardlake.torch.plan_types import Layout, PlanParams, Rows, resolve
from shardlake.torch.reader import ChunkList, RowTable, SlotReader
from shardlake.torch.slot_units import chunk_ends

pytestmark = pytest.mark.timeout(300)


class _Store:
    """Byte ``i`` of every shard is ``i % 251``; every request is recorded in order."""

    url = "mem://"

    def __init__(self) -> None:
        self.asked: list[tuple[str, int, int]] = []

    def key_url(self, key: str) -> str:
        return f"mem://{key}"

    def read_ranges(self, ranges: Any, *, views: bool = False) -> list[bytes]:
        self.asked.extend(ranges)
        return [bytes(i % 251 for i in range(s, e)) for _k, s, e in ranges]

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return self.read_ranges([(key, start, end)])[0]


class _Future(Future[Any]):
    """Runs its call when it is first waited for (``lazy``), else at once."""

    def __init__(self, call: Any, lazy: bool) -> None:
        super().__init__()
        self._call = call
        if not lazy:
            self.result()

    def result(self, timeout: float | None = None) -> Any:
        if not self.done():
            self.set_result(self._call())
        return super().result(timeout)


class _Pool:
    """A ThreadPoolExecutor stand-in without threads: a deterministic trace of submissions."""

    def __init__(self, trace: list[Any], lazy: bool) -> None:
        self.trace, self.lazy = trace, lazy

    def __call__(self, max_workers: int) -> _Pool:
        return self

    def submit(self, fn: Any, rows: list[int]) -> _Future:
        self.trace.append(("fetch", tuple(rows)))
        return _Future(lambda: fn(rows), self.lazy)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


def _table(rng: np.random.Generator, n: int) -> RowTable:
    shard = np.sort(rng.integers(0, max(1, n // 25), n)).astype(np.int32)
    size = rng.integers(1, 30, n).astype(np.int32)
    gap = rng.integers(0, 3, n) * rng.integers(0, 40, n)
    offset = np.zeros(n, np.int64)
    for s in np.unique(shard).tolist():
        mine = np.flatnonzero(shard == s)
        offset[mine] = np.cumsum(size[mine] + gap[mine]) - size[mine]
    spans = zip(offset.tolist(), size.tolist(), strict=True)
    crc = [zlib.crc32(bytes(i % 251 for i in range(o, o + z))) for o, z in spans]
    return RowTable(
        shard=shard,
        offset=offset.astype(np.int32),
        size=size,
        raw_size=size,
        crc32=np.array(crc, np.uint32),
        keys=[f"k{i}" for i in range(n)],
        shard_keys=[f"s{i}" for i in range(int(shard.max()) + 1)],
    )


Slot = tuple[Any, np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]


def _plan_slots(seed: int, table: RowTable) -> Iterator[tuple[Slot, bool]]:
    """Every slot of a random plan (shapes 1-3, unshuffled, order torch, exact), with ends as
    the plan computes them or as the node-local cache maps them."""
    rng = random.Random(seed)
    order = rng.choice(["shardlake", "shardlake", "torch"])
    params = PlanParams(
        "v",
        "s",
        seed=seed,
        shuffle=rng.random() < 0.8,
        chunk_size=rng.randint(1, 40),
        interleave=rng.randint(1, 8),
        shuffle_buffer=rng.randint(1, 64),
        exact=rng.random() < 0.3,
        shape=rng.choice([1, 2, 3]),
        max_pad_fraction=100.0,
        order=order,
    )
    layout = Layout(rng.randint(1, 3), rng.randint(0, 3), rng.randint(1, 7))
    rows = Rows(table.shard.astype(np.int64), table.offset.astype(np.int64))
    if order == "torch":
        perm = np.random.default_rng(seed).permutation(len(table)) if params.shuffle else None
        leg = plan_torch_leg(rows, params, layout, perm)
    else:
        leg = plan_epoch(rows, params, seed % 3, layout)
    plan = compact_plan(resolve(leg, None))
    if rng.random() < 0.5:  # as a rank maps it from the node-local cache
        plan = plan_from_arrays(layout, *plan_arrays(plan), keep=range(len(plan.slot_rows)))
    assert plan.slot_chunk_ends is not None
    for i, emit in enumerate(plan.slot_rows):
        yield (plan.slot_chunks[i], emit, plan.slot_emit_chunk[i], plan.slot_chunk_ends[i]), False


def _arbitrary_slot(seed: int, table: RowTable) -> Slot:
    """Chunks of one shard each (some never emitted), emitted out of chunk order with a
    jitter, some rows dropped or repeated, and a few repeats far from their chunk."""
    rng = np.random.default_rng(seed)
    n = len(table)
    chunks: list[np.ndarray[Any, Any]] = []
    for s in np.unique(table.shard).tolist():
        mine = np.flatnonzero(table.shard == s)
        cuts = np.sort(rng.choice(np.arange(1, len(mine)), min(len(mine) - 1, 3), replace=False))
        chunks += [c.astype(np.int32) for c in np.split(mine, cuts) if len(c)]
    numbering = rng.permutation(len(chunks)) if rng.random() < 0.3 else np.arange(len(chunks))
    emits: list[tuple[float, int, int]] = []
    for c in range(len(chunks)):
        if rng.random() < 0.1:
            continue  # a chunk never emitted
        rows = chunks[c]
        picked = rows[rng.random(len(rows)) < 0.9] if rng.random() < 0.3 else rows
        if rng.random() < 0.2 and len(rows):
            picked = np.r_[picked, rng.choice(rows, rng.integers(1, 4))]
        base = int(numbering[c]) * 7.0
        for r in picked.tolist():
            far = rng.random() < 0.02
            emits.append((base + rng.random() * 30 + (n * 10 if far else 0), r, c))
    emits.sort()
    emit = np.array([r for _, r, _ in emits], np.int32)
    emit_chunk = np.array([c for _, _, c in emits], np.int64)
    return chunks, emit, emit_chunk, chunk_ends(emit_chunk, len(chunks))


def _run(
    cls: type[SlotReader],
    slot: Slot,
    begin: int,
    opts: Any,
    lookahead: int,
    table: RowTable,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> tuple[list[Any], list[Any], int, int]:
    chunks, emit, emit_chunk, ends = slot
    trace: list[Any] = []
    with monkeypatch.context() as m:
        if mode != "threads":
            m.setattr(reader_module, "ThreadPoolExecutor", _Pool(trace, lazy=mode == "lazy"))
        store = _Store()
        kwargs = {"ends": ends, "begin": begin, "lookahead": lookahead}
        if cls is WholeSlotReader:
            kwargs = reference_args(kwargs)
        reader = cls(
            store,  # type: ignore[arg-type]
            table,
            chunks,
            emit[begin:],
            emit_chunk[begin:],
            opts,
            **kwargs,
        )
        for row, payload in reader:
            trace.append(("emit", row, bytes(payload)))
    asked = store.asked if mode != "threads" else sorted(store.asked)
    if mode == "threads":
        trace = [t for t in trace if t[0] == "emit"]
    return trace, asked, reader.requests, reader.bytes_fetched


def _compare(slot: Slot, table: RowTable, rng: random.Random, mp: pytest.MonkeyPatch) -> None:
    from shardlake.torch import ReadOptions

    n = len(slot[1])
    begin = rng.choice([0, 0, n, rng.randint(0, n)]) if n else 0
    opts = ReadOptions(
        inflight=rng.randint(1, 5),
        max_buffer_bytes=rng.choice([1, 40, 200, 1 << 20]),
        skim_gap=rng.choice([0, 5, 50]),
        max_skim_fraction=rng.choice([0.0, 0.2, 1.0]),
    )
    lookahead = rng.randint(1, 12)
    for mode in ("eager", "lazy", "threads"):
        new = _run(SlotReader, slot, begin, opts, lookahead, table, mp, mode)
        old = _run(WholeSlotReader, slot, begin, opts, lookahead, table, mp, mode)
        assert new == old, (mode, begin)


@pytest.mark.parametrize("seed", range(0, 60, 6))
def test_reads_and_payloads_match_the_whole_slot_set_up(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    for s in range(seed, seed + 6):
        rng = random.Random(s)
        table = _table(np.random.default_rng(s), rng.randint(1, 300))
        for slot, _ in _plan_slots(s, table):
            _compare(slot, table, rng, monkeypatch)
        _compare(_arbitrary_slot(s, table), table, rng, monkeypatch)


def _status(field: str) -> int:
    """A ``/proc/self/status`` memory figure in bytes (VmRSS: now; VmHWM: the peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/self/status")


class _Keys:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> str:
        return f"k{i}"


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux: resets VmHWM")
def test_a_huge_slots_first_batch_touches_only_its_first_units() -> None:
    """A 20M-sample slot whose arrays are zero pages but for its first runs: the first batch
    (and its read-ahead) scans the emits of the units it fetches, and the process's peak
    memory grows by far less than one pass over the slot's arrays (~80 MB each; the
    whole-slot set-up peaked ~450 MB higher here, and took ~3 s)."""
    n, run, real = 20_000_000, 500, 100_000
    zeros = bytes(10)
    emit = np.zeros(n, np.int32)  # calloc: pages appear only where written
    emit_chunk = np.zeros(n, np.int32)
    flat = np.zeros(n, np.int32)
    offset, size, crc = np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros(n, np.uint32)
    emit[:real] = flat[:real] = np.arange(real)
    emit_chunk[:real] = np.arange(real) // run
    offset[:real], size[:real], crc[:real] = np.arange(real) * 10, 10, zlib.crc32(zeros)
    chunks = ChunkList.from_flat(flat, np.arange(0, n + 1, run, dtype=np.int64))
    ends = (np.arange(len(chunks), dtype=np.int32) + 1) * run
    table = RowTable(
        np.zeros(n, np.int32),
        offset,
        size,
        size,
        crc,
        _Keys(n),
        ["s"],  # type: ignore[arg-type]
    )

    class Zeros:
        url = "mem://"

        def read_ranges(self, ranges: Any, *, views: bool = False) -> list[bytes]:
            return [bytes(e - s) for _k, s, e in ranges]

    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from now
    before = _status("VmRSS")
    reader = SlotReader(Zeros(), table, chunks, emit, emit_chunk, lookahead=64, ends=ends)  # type: ignore[arg-type]
    items = iter(reader)
    first = [next(items) for _ in range(64)]
    grown = _status("VmHWM") - before
    assert [row for row, _ in first] == list(range(64))
    assert reader.units is not None and reader.units.scanned < real
    assert grown < 40 * 2**20, f"the first batch grew the process by {grown / 2**20:.0f} MiB"
    items.close()  # type: ignore[attr-defined]
