"""The loader's compact set-up: the selection digest without a full sort is the digest saved
states carry, the row table uses 32-bit columns where values fit, and the slot reader's
NumPy set-up fetches exactly what the per-row version did (whole, resumed and repeated chunks)."""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from shardlake.torch import ShardDataset
from shardlake.torch.plan_types import selection_digest
from shardlake.torch.reader import RowTable, SlotReader
from shardlake.torch.strings import StringColumn, key_digest


def _keys(runs: int, per_run: int, seed: int) -> list[str]:
    """Keys as catalogs hold them: sorted runs (one per partition) in partition-id order."""
    rng = random.Random(seed)
    paths = [f"log{rng.randrange(10**6):06d}é" for _ in range(runs)]
    rng.shuffle(paths)
    return [f"{p}/{p}_{i:06d}" for p in paths for i in range(per_run)]


@pytest.mark.parametrize(
    "keys",
    [
        [],
        ["only"],
        _keys(50, 7, seed=1),  # sorted runs: merged without a sort
        sorted(_keys(20, 3, seed=2)),  # already sorted
        _keys(3, 40, seed=3)[::-1],  # descending: every key its own run, full sort
        ["b/1", "a/2", "b/0", "a/1", "a/1"],  # overlapping runs and a repeat: full sort
    ],
)
def test_key_digest_is_the_saved_states_digest(keys: list[str]) -> None:
    assert key_digest(pa.chunked_array([pa.array(keys, pa.string())])) == selection_digest(keys)


@pytest.mark.parametrize(
    "kind", [pa.large_string(), pa.string_view(), pa.dictionary(pa.int32(), pa.string())]
)
def test_key_digest_of_other_string_types(kind: pa.DataType) -> None:
    keys = _keys(20, 4, seed=9)
    assert key_digest(pa.array(keys).cast(kind)) == selection_digest(keys)


def test_key_digest_spans_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    import shardlake.torch.strings as strings

    keys = _keys(30, 11, seed=4)
    monkeypatch.setattr(strings, "DIGEST_BLOCK", 7)
    assert key_digest(pa.array(keys)) == selection_digest(keys)


def test_string_column_offsets_are_32_bit_and_concat_keeps_items() -> None:
    a = StringColumn.from_arrow(pa.array(["x", "yé", ""]))
    b = StringColumn.from_arrow(pa.chunked_array([pa.array(["zz"]), pa.array(["w"])]))
    both = StringColumn.concat([a, b])
    assert a.offsets.dtype == np.int32 and both.offsets.dtype == np.int32
    assert list(both) == ["x", "yé", "", "zz", "w"]
    assert both[-1] == "w" and both[1:3] == ["yé", ""]


def test_row_table_columns_are_compact(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "scale_bench", Path(__file__).resolve().parents[2] / "benchmarks" / "scale.py"
    )
    assert spec is not None and spec.loader is not None
    scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scale)
    url = str(tmp_path / "root")
    scale.build_root(url, 4, 5)
    ds = ShardDataset(url, "v1", batch_size=2, include_index=True, num_workers=0)
    t = ds.table
    assert [t.shard.dtype, t.offset.dtype, t.size.dtype, t.raw_size.dtype, t.crc32.dtype] == [
        np.int32,
        np.int32,
        np.int32,
        np.int32,
        np.uint32,
    ]
    assert ds.source_of.dtype == np.int8 and ds.partition_of.dtype == np.int8
    # The plan: rows int32, each emit's chunk number uint16 (a slot's chunks are fewer than
    # 65,536 here), the same emits as int64 would give.
    plan = ds.plan(ds.layout(2), ds.cursor)
    assert {a.dtype for a in plan.slot_rows} == {np.dtype(np.int32)}
    assert {a.dtype for a in plan.slot_emit_chunk} == {np.dtype(np.uint16)}
    seen = [k for batch in ds.loader() for k in ds.keys_of(batch["__index__"])]
    assert sorted(seen) == sorted(t.keys) and len(seen) == 20


class _Store:
    """Serves ranges of one fake shard whose byte ``i`` is ``i % 251``."""

    url = "mem://"

    def key_url(self, key: str) -> str:
        return f"mem://{key}"

    def read_ranges(
        self, ranges: list[tuple[str, int, int]], *, views: bool = False
    ) -> list[bytes]:
        return [bytes(i % 251 for i in range(s, e)) for _k, s, e in ranges]

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return self.read_ranges([(key, start, end)])[0]


def _table(n: int) -> RowTable:
    offsets = np.arange(n, dtype=np.int32) * 10
    crcs = [zlib.crc32(bytes(i % 251 for i in range(o, o + 10))) for o in offsets.tolist()]
    return RowTable(
        shard=np.zeros(n, np.int32),
        offset=offsets,
        size=np.full(n, 10, np.int32),
        raw_size=np.full(n, 10, np.int32),
        crc32=np.array(crcs, np.uint32),
        keys=[f"k{i}" for i in range(n)],
        shard_keys=["s"],
    )


@pytest.mark.parametrize(
    ("chunks", "emit_rows", "emit_chunk"),
    [
        ([[0, 1, 2], [3, 4]], [3, 4, 0, 1, 2], [1, 1, 0, 0, 0]),  # whole chunks
        ([[0, 1, 2], [3, 4]], [1, 2, 3, 4], [0, 0, 1, 1]),  # a resume mid-chunk
        ([[0, 1, 2]], [2, 0, 2], [0, 0, 0]),  # a repeat standing in for a row
        ([[5, 5, 6]], [5, 6], [0, 0]),  # a repeated row in the chunk, partly emitted
    ],
)
def test_slot_reader_emits_its_rows_with_their_bytes(
    chunks: list[list[int]], emit_rows: list[int], emit_chunk: list[int]
) -> None:
    table = _table(8)
    reader = SlotReader(
        _Store(),  # type: ignore[arg-type]
        table,
        [np.array(c, np.int32) for c in chunks],
        np.array(emit_rows, np.int32),
        np.array(emit_chunk, np.int64),
    )
    out = list(reader)
    assert [r for r, _ in out] == emit_rows
    for row, payload in out:
        assert bytes(payload) == bytes(i % 251 for i in range(10 * row, 10 * row + 10))
    assert reader.bytes_fetched >= 10 * len(set(emit_rows))


def test_keys_are_dropped_unless_batches_carry_them_and_read_back_on_demand(
    tmp_path: Path,
) -> None:
    import shardlake
    from shardlake.testing import synth_corpus
    from shardlake.torch.strings import LazyStrings

    src = tmp_path / "src"
    synth_corpus(src, 2, 5, seed=1, neighbors=2, lanes=4)
    root = str(tmp_path / "root")
    shardlake.open(root).pack(src, tag="v1")
    ds = ShardDataset(root, batch_size=2, include_index=True, num_workers=0, engine="threads")
    keys = ds.table.keys
    assert isinstance(keys, LazyStrings) and keys._column is None and len(keys) == 10
    batch = next(iter(ds.loader()))
    assert keys._column is None  # reading and batching need no keys
    carried = ShardDataset(root, batch_size=2, include_key=True, num_workers=0)
    assert isinstance(carried.table.keys, StringColumn)
    assert list(keys) == list(carried.table.keys)  # read back from the catalog, same order
    rows = batch["__index__"].tolist()
    assert ds.keys_of(batch["__index__"]) == [carried.table.keys[r] for r in rows]


def test_key_digest_hashes_sorted_runs_where_they_lie(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs in the wrong order are hashed in sorted order without a sorted copy of every key
    (at 5M keys the copy was most of the digest's 1.8 s)."""
    import pyarrow.compute as pc

    import shardlake.torch.strings as strings

    runs = sorted(_keys(50, 7, seed=5))
    keys = [key for start in range(len(runs) - 7, -1, -7) for key in runs[start : start + 7]]
    column = pa.array(keys)  # 50 sorted runs, each behind the one that follows it in order

    class NoFullTake:
        def __getattr__(self, name: str) -> object:
            return getattr(pc, name)

        def take(self, values: pa.Array, indices: pa.Array) -> pa.Array:
            if len(indices) == len(keys):
                raise AssertionError("the digest took a sorted copy of every key")
            return pc.take(values, indices)

    monkeypatch.setattr(strings, "pc", NoFullTake())
    assert key_digest(column) == selection_digest(keys)
    assert key_digest(column.slice(7, 140)) == selection_digest(keys[7:147])
    assert key_digest(pa.array(runs)) == selection_digest(runs)  # sorted: one range


def test_key_digest_with_partition_breaks_needs_no_sort(monkeypatch: pytest.MonkeyPatch) -> None:
    """Partitions in hash order (as catalogs hold them): neighbours whose keys happen to ascend
    would merge into runs that overlap the others, and the keys would be sorted; the
    partitions' first rows as ``breaks`` keep one run per partition, hashed in place."""
    import pyarrow.compute as pc

    import shardlake.torch.strings as strings

    per = 9
    keys = _keys(60, per, seed=8)
    breaks = np.arange(per, len(keys), per)
    sorts: list[int] = []

    class CountSorts:
        def __getattr__(self, name: str) -> object:
            return getattr(pc, name)

        def sort_indices(self, values: pa.Array) -> pa.Array:
            sorts.append(len(values))
            return pc.sort_indices(values)

    monkeypatch.setattr(strings, "pc", CountSorts())
    assert key_digest(pa.array(keys)) == selection_digest(keys)
    assert len(keys) in sorts  # without the breaks: a sort of every key
    sorts.clear()
    assert key_digest(pa.array(keys), breaks) == selection_digest(keys)
    assert len(keys) not in sorts
    odd = np.array([0, 5, 13, len(keys), len(keys) + 7])  # cuts anywhere: the same digest
    assert key_digest(pa.array(keys), odd) == selection_digest(keys)


def test_set_up_collects_only_the_young_generations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The set-up runs with the collector paused, so its objects are young: collecting
    generations 0-1 frees its cycles, and a full collection (every object of the process,
    torch's included: ~80 ms of every start-up, however small the version) is not made."""
    import gc

    import shardlake
    from shardlake.testing import synth_corpus

    src = tmp_path / "src"
    synth_corpus(src, 2, 3, seed=2, neighbors=2, lanes=4)
    root = str(tmp_path / "root")
    shardlake.open(root).pack(src, tag="v1")
    calls: list[int] = []
    real = gc.collect

    def collect(generation: int = 2) -> int:
        calls.append(generation)
        return real(generation)

    monkeypatch.setattr(gc, "collect", collect)
    ds = ShardDataset(root, batch_size=2, num_workers=0)
    assert calls and max(calls) <= 1, calls
    assert next(iter(ds.loader()))  # and the loader works


def test_int32_columns_are_kept_without_a_scan() -> None:
    from shardlake.torch.sources import compact_int

    class Unscanned(np.ndarray):
        """A column whose pages must stay untouched (mapped from the node-local cache)."""

        def max(self, *args: object, **kwargs: object) -> None:  # type: ignore[override]
            raise AssertionError("scanned")

        min = max  # type: ignore[assignment]

    mapped = np.arange(10, dtype=np.int32).view(Unscanned)
    assert compact_int(mapped) is mapped
    assert compact_int(mapped, upper=2**20) is mapped
    # What does not fit is still widened (offsets whose ends pass 2 GiB).
    assert compact_int(np.arange(3, dtype=np.int32), upper=2**31).dtype == np.int64
    assert compact_int(np.array([1, 2**33], dtype=np.int64)).dtype == np.int64
    assert compact_int(np.array([1, 2], dtype=np.int64)).dtype == np.int32
