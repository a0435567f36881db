"""A cold rank's table set-up (issue #47): the catalog read with the partition column as
dictionary codes, the loader columns built chunk by chunk, the key digest hashed over the Arrow
buffers where they lie. Each gives what the former whole-table computation gave."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import shardlake
import shardlake.format.catalog as format_catalog
import shardlake.meta.catalog as catalog_mod
from shardlake.errors import IntegrityError
from shardlake.format.catalog import CatalogRef, ObjectRef, encode_segment, segment_key
from shardlake.format.documents import PartitionEntry
from shardlake.meta.catalog import Catalog
from shardlake.meta.catalog_objects import write_object
from shardlake.store import open_store
from shardlake.torch import ShardDataset, columns, sources
from shardlake.torch.columns import INT32_MAX, SourceColumns, index_dtype
from shardlake.torch.plan_types import selection_digest
from shardlake.torch.strings import key_digest


def _old_shard_index(
    part: np.ndarray[Any, Any], names: list[str], shards: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], list[tuple[str, int]]]:
    """``_shard_index`` before the cold-path change (the reference)."""
    if len(part) == 0:
        return np.zeros(0, dtype=np.int64), []
    pair = part.astype(np.int64) * (int(shards.max()) + 1) + shards
    changes = np.flatnonzero(pair[1:] != pair[:-1]) + 1
    starts = np.concatenate([[0], changes])
    if len(np.unique(pair[starts])) == len(starts):
        run = np.zeros(len(pair), dtype=np.int64)
        run[changes] = 1
        firsts = zip(part[starts].tolist(), shards[starts].tolist(), strict=True)
        return np.cumsum(run), [(names[p], s) for p, s in firsts]
    _u, first, inverse = np.unique(pair, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    order = np.sort(first)
    return rank[inverse.reshape(-1)], [(names[int(part[i])], int(shards[i])) for i in order]


def _old_from_table(table: pa.Table) -> SourceColumns:
    """``SourceColumns.from_table`` before the cold-path change (the reference)."""
    pids = table.column("partition")
    codes = pids.dictionary_encode().combine_chunks() if len(pids) else None
    if codes is None:
        part = np.zeros(0, dtype=np.int64)
        names: list[str] = []
    else:
        part = codes.indices.to_numpy()
        names = codes.dictionary.to_pylist()
    shard, pairs = _old_shard_index(part, names, columns._narrow(table.column("shard")))
    by_name = sorted(range(len(names)), key=names.__getitem__)
    rank = np.empty(len(names), dtype=index_dtype(len(names)))
    rank[by_name] = np.arange(len(names))
    offset, size = table.column("offset"), table.column("size")
    ends = pc.max(pc.add(offset, size)).as_py() if len(offset) else 0
    return SourceColumns(
        shard=shard.astype(np.int32 if len(pairs) <= INT32_MAX else np.int64),
        offset=columns._narrow(offset, ends or 0),
        size=columns._narrow(size),
        raw_size=columns._narrow(table.column("raw_size")),
        crc32=columns._narrow_crc(table.column("crc32")),
        partition=rank[part],
        pairs=pairs,
        partition_names=[names[i] for i in by_name],
        offset_end=int(ends or 0),
    )


def _assert_same(got: SourceColumns, want: SourceColumns) -> None:
    for name in SourceColumns.ARRAYS:
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype, name
        assert np.array_equal(a, b), name
    assert got.pairs == want.pairs
    assert got.partition_names == want.partition_names
    assert got.offset_end == want.offset_end


def _rows(
    parts: int, seed: int, *, shards: int = 3, equal_lengths: bool = True, big: bool = False
) -> pa.Table:
    """Catalog-like rows: partitions in id order (ids unrelated to the key paths), each one's
    rows grouped by shard, keys sorted within a partition."""
    rng = random.Random(seed)
    ids = sorted({f"{rng.getrandbits(48):012x}" for _ in range(parts)})
    cols: dict[str, list[Any]] = {c: [] for c in sources.READER_COLUMNS}
    for pid in ids:
        path = f"log{rng.randrange(10**6)}é" if rng.random() < 0.3 else f"log{rng.randrange(10**6)}"
        count = rng.choice([0, 1, 2, 5, 17, 40])
        for i in range(count):
            cols["key"].append(
                f"{path}/{i:04d}" if equal_lengths else f"{path}/{'x' * rng.randrange(4)}{i}"
            )
            cols["partition"].append(pid)
            cols["shard"].append(i * shards // max(count, 1))
            cols["offset"].append(rng.randrange(2**40 if big else 2**20))
            cols["size"].append(rng.randrange(1, 4096))
            cols["raw_size"].append(rng.randrange(1, 8192))
            cols["crc32"].append(rng.randrange(2**32))
    schema = {"shard": pa.int32()}
    return pa.table({c: pa.array(v, schema.get(c)) for c, v in cols.items()})


def _with_offsets_near_2_31(table: pa.Table, rows: range, past: bool = True) -> pa.Table:
    """Some rows' offsets just under 2**31 (they fit int32, offset + size does not); with
    ``past``, one row's past it (its row group stays int64)."""
    offsets = table.column("offset").to_pylist()
    for i in rows:
        offsets[i] = 2**31 - 10
    if past:
        offsets[rows.stop] = 2**31 + 5
    i = table.schema.get_field_index("offset")
    return table.set_column(i, "offset", pa.array(offsets, pa.int64()))


def _narrowed_chunks(table: pa.Table) -> pa.Table:
    """``table`` with each chunk's integer columns int32/uint32 where that chunk's values fit
    (as a catalog read with ``narrow`` gives them)."""
    pieces = [
        format_catalog._narrowed(pa.Table.from_batches([b]), sources.NARROW_COLUMNS)
        for b in table.to_batches()
    ]
    return pa.concat_tables(pieces, promote_options="permissive") if pieces else table


def _chunked(table: pa.Table, seed: int) -> pa.Table:
    """``table`` cut into chunks at random places (empty chunks included)."""
    rng = random.Random(seed)
    n = table.num_rows
    cuts = sorted({0, n, *(rng.randrange(n + 1) for _ in range(6))}) if n else [0, 0]
    pieces = [table.slice(a, b - a) for a, b in zip(cuts, cuts[1:], strict=False)]
    pieces.insert(len(pieces) // 2, table.slice(0, 0))
    return pa.concat_tables(pieces)


def _as_codes(table: pa.Table) -> pa.Table:
    """``table`` with its partition column dictionary-encoded chunk by chunk, each chunk's
    dictionary holding unused entries too (as a filtered parquet read gives it)."""
    chunks = []
    for chunk in table.column("partition").chunks:
        extra = pa.array(["zzz-unused", *chunk.to_pylist(), "000-unused"], pa.string())
        coded = extra.dictionary_encode()
        chunks.append(coded.slice(1, len(chunk)))
    column = pa.chunked_array(chunks, pa.dictionary(pa.int32(), pa.string()))
    return table.set_column(table.schema.get_field_index("partition"), "partition", column)


@pytest.mark.parametrize(
    "table",
    [
        _rows(0, 1),
        _rows(1, 2),
        _rows(30, 3),
        _rows(200, 4, shards=1, equal_lengths=False),
        _rows(50, 5, big=True),  # offsets past int32: int64 columns
        _with_offsets_near_2_31(_rows(30, 8), range(3, 9)),  # mixed int32 and int64 chunks
        _with_offsets_near_2_31(_rows(30, 9), range(3, 9), past=False),  # offset + size past
    ],
)
def test_columns_equal_the_former_computation(table: pa.Table) -> None:
    want = _old_from_table(table)
    for seed in range(3):
        cut = _chunked(table, seed)
        _assert_same(SourceColumns.from_table(cut), want)
        _assert_same(SourceColumns.from_table(_as_codes(cut)), want)
        _assert_same(SourceColumns.from_table(_narrowed_chunks(_as_codes(cut))), want)


def test_columns_of_rows_out_of_partition_order() -> None:
    """A selection in listed order: partitions interleaved, a (partition, shard) pair in
    several runs (the sorting path of the shard index)."""
    table = _rows(20, 6)
    rng = np.random.default_rng(6)
    mixed = table.take(pa.array(rng.permutation(table.num_rows)))
    _assert_same(SourceColumns.from_table(_chunked(mixed, 1)), _old_from_table(mixed))
    _assert_same(SourceColumns.from_table(_as_codes(_chunked(mixed, 2))), _old_from_table(mixed))


def test_a_row_without_partition_is_refused() -> None:
    table = _rows(5, 7)
    pids = table.column("partition").to_pylist()
    pids[3] = None
    bad = table.set_column(1, "partition", pa.array(pids, pa.string()))
    with pytest.raises(IntegrityError, match="no partition"):
        SourceColumns.from_table(bad)
    with pytest.raises(IntegrityError, match="no partition"):
        SourceColumns.from_table(_as_codes(bad))


def _breaks(table: pa.Table) -> np.ndarray[Any, Any]:
    part = SourceColumns.from_table(table).partition
    return np.flatnonzero(part[1:] != part[:-1]) + 1


@pytest.mark.parametrize("block", [7, 1 << 16])
@pytest.mark.parametrize(
    "table",
    [
        _rows(0, 11),
        _rows(1, 12),
        _rows(40, 13),
        _rows(60, 14, equal_lengths=False),
    ],
)
def test_digest_over_chunks_equals_the_saved_states_digest(
    table: pa.Table, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys in many chunks (runs split across them, empty chunks), with and without partition
    breaks, blocks of any size: the digest is :func:`selection_digest`'s."""
    import shardlake.torch.strings as strings

    monkeypatch.setattr(strings, "DIGEST_BLOCK", block)
    want = selection_digest(table.column("key").to_pylist())
    for seed in range(3):
        cut = _chunked(table, seed)
        assert key_digest(cut.column("key"), _breaks(cut)) == want
        assert key_digest(cut.column("key")) == want
        assert key_digest(cut.column("key").cast(pa.large_string())) == want
        breaks = columns.partition_breaks(_as_codes(cut).column("partition"))
        assert key_digest(cut.column("key"), breaks) == want


@pytest.mark.parametrize(
    "keys",
    [
        ["", "", "a", ""],  # empty keys and repeats: a full sort
        ["b", "a"] * 3 + [f"c{i}" for i in range(40)],
        [f"k{i:03d}" for i in range(50)] + ["k", "kk"] + [f"k{i:03d}" for i in range(50, 99)],
        [f"{'é' * (i % 5)}{i:05d}" for i in range(300)],  # lengths vary key to key
    ],
)
def test_digest_of_odd_key_columns(keys: list[str]) -> None:
    for seed in range(3):
        rng = random.Random(seed)
        cuts = sorted({0, len(keys), *(rng.randrange(len(keys)) for _ in range(4))})
        column = pa.chunked_array(
            [pa.array(keys[a:b], pa.string()) for a, b in zip(cuts, cuts[1:], strict=False)]
        )
        assert key_digest(column) == selection_digest(keys)


def test_digest_refuses_null_keys() -> None:
    with pytest.raises(ValueError, match="nulls"):
        key_digest(pa.chunked_array([pa.array(["a"]), pa.array(["b", None])]))


def _entry(pid: str, samples: int, segment: str | None) -> PartitionEntry:
    return PartitionEntry(
        pid, pid, "d", "m", "r", f"data/{pid}.parquet", samples, 0, 0, (), segment=segment
    )


@pytest.mark.parametrize("big", [None, False, True])
@pytest.mark.parametrize("layout", ["in id order", "interleaved", "one"])
def test_a_catalog_of_many_segments_reads_as_one(
    layout: str, big: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version's rows over several segments (as a publish in parts writes them, in id order,
    or interleaved as incremental publishes leave them; one holding a replaced partition's
    stale rows): in partition order, equal with and without partition codes and narrowed
    integers, and the loader columns and key digest equal those of the rows in one table."""
    monkeypatch.setattr(format_catalog, "SEGMENT_ROW_GROUP", 16)  # many row groups
    monkeypatch.setattr(format_catalog.os, "cpu_count", lambda: 4)  # decoded on threads
    table = _rows(60, 21)
    if big is not None:  # offsets near 2**31 (past it too: some row groups stay int64)
        table = _with_offsets_near_2_31(table, range(40, 45), past=big)
    store = open_store(f"memory://coldpath-{layout.replace(' ', '-')}")
    pids = sorted(set(table.column("partition").to_pylist()))
    counts = {p: 0 for p in pids}
    for p in table.column("partition").to_pylist():
        counts[p] += 1
    if layout == "in id order":
        groups = [pids[i : i + 9] for i in range(0, len(pids), 9)]
    elif layout == "interleaved":
        groups = [pids[i::4] for i in range(4)]
    else:
        groups = [pids]
    segments: list[ObjectRef] = []
    segment_of: dict[str, str] = {}
    for group in groups:
        mask = pc.is_in(table.column("partition"), value_set=pa.array(group))
        part = table.filter(mask)
        if group is groups[0] and len(groups) > 1:  # stale rows of a partition another holds
            stale = table.filter(pc.equal(table.column("partition"), groups[1][0])).slice(0, 1)
            part = pa.concat_tables([part, stale])
        ref = write_object(store, segment_key, encode_segment(part), part.num_rows)
        segments.append(ref)
        segment_of.update((p, ref.sha256) for p in group)
    entries = [_entry(p, counts[p], segment_of[p] if counts[p] else None) for p in pids]
    parts = ObjectRef("catalog/partitions/x.parquet", "0" * 64, 0, len(entries))
    catalog = Catalog(store, "version 'v'", entries, CatalogRef(parts, tuple(segments)))
    if layout == "in id order":  # partitions do not interleave: no row is moved
        monkeypatch.setattr(catalog_mod, "_by_partition", _no_sort)
    plain = catalog.rows(sources.READER_COLUMNS)
    codes = catalog.rows(
        sources.READER_COLUMNS, partition_codes=True, narrow=sources.NARROW_COLUMNS
    )
    assert pa.types.is_dictionary(codes.schema.field("partition").type)
    assert plain.to_pydict() == table.to_pydict()
    assert codes.cast(plain.schema).to_pydict() == table.to_pydict()
    narrowed = {c.type for c in codes.column("size").chunks}
    assert narrowed == {pa.int32()}  # read a row group at a time, each narrowed
    _assert_same(SourceColumns.from_table(codes), _old_from_table(table))
    assert key_digest(codes.column("key"), _breaks(codes)) == selection_digest(
        table.column("key").to_pylist()
    )
    some = [pids[1], pids[-2]]
    picked = catalog.rows(["key"], some, partition_codes=True, narrow=sources.NARROW_COLUMNS)
    want = table.filter(pc.is_in(table.column("partition"), value_set=pa.array(some)))
    assert picked.column("key").to_pylist() == want.column("key").to_pylist()


def _no_sort(table: pa.Table) -> pa.Table:
    raise AssertionError("segments in id order were sorted by partition")


def test_parquet_dictionary_codes_read_back_as_strings() -> None:
    """What ``partition_codes`` relies on: parquet's dictionary read gives the same values."""
    table = _rows(30, 31)
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=7)
    reader = pq.ParquetFile(pa.BufferReader(sink.getvalue()), read_dictionary=["partition"])
    codes = reader.read()
    assert codes.column("partition").num_chunks > 1
    assert codes.cast(table.schema).equals(table)


def _scale_module() -> Any:
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "scale.py"
    spec = importlib.util.spec_from_file_location("scale_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_first_rank_hashes_its_keys_while_it_builds_its_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's first rank starts the selection digest on a thread as soon as it has read
    the catalog rows; the digest is the saved states' one, and the next rank reads it from
    the node-local cache (no thread, no key read)."""
    monkeypatch.setenv("SHARDLAKE_CATALOG_CACHE", str(tmp_path / "cache"))
    url = str(tmp_path / "root")
    _scale_module().build_root(url, 7, 9)
    keys = shardlake.open(url).dataset("v1").manifests(["key"]).column("key").to_pylist()
    first = sources.select_rows(sources.MixMember(url, "v1"), cached=True)
    assert first.digest_ahead is not None
    assert sources.selection_key_digest(first) == selection_digest(keys)
    second = sources.select_rows(sources.MixMember(url, "v1"), cached=True)
    assert second.digest_ahead is None and second.table is None
    assert sources.selection_key_digest(second) == selection_digest(keys)
    ds = ShardDataset(url, "v1", batch_size=4, num_workers=0)
    assert ds.selection_digest == selection_digest(keys)


def test_a_digest_computed_ahead_hands_its_error_to_the_caller() -> None:
    table = pa.table({"key": pa.array(["a", None]), "partition": pa.array(["p", "p"])})
    with pytest.raises(ValueError, match="nulls"):
        sources._digest_ahead(table).result(timeout=60)
