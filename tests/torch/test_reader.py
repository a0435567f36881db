"""The loader's read path: request coalescing, MB-scale requests, one re-read on a mismatch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.torch import assert_batch_equal, copy_root, flip_byte

from shardlake import Store, open_store
from shardlake.errors import IntegrityError
from shardlake.tools.bench.measure import CountingStore, read_counts
from shardlake.torch import ReadOptions, ShardDataset
from shardlake.torch.reader import coalesce, request_chunk_size

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("loader_engine")]


@pytest.fixture(scope="module")
def corpus(packed_root: Callable[..., tuple[Path, Path]]) -> tuple[Path, Path]:
    return packed_root([30, 30], name="reader", shard_size=400_000)


def test_coalesce_bounds_skimmed_bytes() -> None:
    # Dense members with small (tar header) gaps: one span.
    assert coalesce([0, 1100, 2200], [1000, 1000, 1000], gap=512) == [(0, 3200, [0, 1, 2])]
    # Every other member selected: the gaps are half the bytes, above a 10% skim bound.
    sparse = coalesce([0, 2000, 4000], [1000, 1000, 1000], gap=0, max_skim_fraction=0.1)
    assert [m for _, _, m in sparse] == [[0], [1], [2]]
    # Small holes within the bound are read over; the bound is on unselected/selected bytes.
    near = coalesce([0, 1050, 2100], [1000, 1000, 1000], gap=0, max_skim_fraction=0.1)
    assert near == [(0, 3100, [0, 1, 2])]
    # A size cap splits a run.
    capped = coalesce([0, 1000, 2000, 3000], [1000] * 4, gap=0, max_bytes=2000)
    assert [m for _, _, m in capped] == [[0, 1], [2, 3]]


def test_full_epoch_requests_are_request_sized(corpus: tuple[Path, Path], tmp_path: Path) -> None:
    _, root = corpus
    log = str(tmp_path / "gets.log")
    store = CountingStore.wrap(open_store(str(root)), log)
    options = ReadOptions(request_bytes=64 * 1024)
    ds = ShardDataset(store, batch_size=4, num_workers=2, read_options=options)
    assert ds.params.chunk_size == request_chunk_size(ds.table, options) > 1
    # One epoch's requests: no prefetch of the next one during its tail (it adds its reads).
    samples = sum(len(b["lanes"]) for b in ds.loader(prefetch_next_epoch=False))
    gets, fetched = read_counts(log)
    assert samples == len(ds) and fetched >= int(ds.table.size.sum())
    # Dense chunks are one GET each: far fewer GETs than samples, of about the target size.
    assert gets <= len(ds.table) / 2
    assert fetched / gets >= 0.4 * options.request_bytes


class FlipOnceStore(Store):
    """Corrupts the first read of one offset (a bad reply on the wire), then reads truly."""

    target: tuple[str, int] = ("", -1)
    flipped = False

    def read_ranges(
        self, ranges: Sequence[tuple[str, int, int]], *, views: bool = False
    ) -> list[Any]:
        out: list[Any] = super().read_ranges(ranges, views=views)
        for i, (key, start, end) in enumerate(ranges):
            key0, offset = self.target
            if not self.flipped and key == key0 and start <= offset < end:
                self.flipped = True
                blob = bytearray(out[i])
                blob[offset - start] ^= 0xFF
                out[i] = bytes(blob)
        return out


def test_one_bad_read_is_reread_once(corpus: tuple[Path, Path], tmp_path: Path) -> None:
    _, root = corpus
    clean = list(ShardDataset(str(root), batch_size=4, include_key=True).loader(num_workers=0))
    store = FlipOnceStore.__new__(FlipOnceStore)
    Store.__setstate__(store, open_store(str(root)).__getstate__())
    ds = ShardDataset(store, batch_size=4, include_key=True)
    row = 7
    store.target = (ds.table.shard_keys[int(ds.table.shard[row])], int(ds.table.offset[row]) + 9)
    got = list(ds.loader(num_workers=0))
    assert store.flipped
    for a, b in zip(got, clean, strict=True):
        assert a["__key__"] == b["__key__"]
        assert_batch_equal(a, {k: v for k, v in b.items() if k != "__key__"})


def test_persistent_mismatch_fails_after_two_reads(
    corpus: tuple[Path, Path], tmp_path: Path
) -> None:
    _, root = corpus
    bad = copy_root(root, tmp_path / "bad")
    log = str(tmp_path / "gets.log")
    ds = ShardDataset(
        CountingStore.wrap(open_store(str(bad)), log),
        batch_size=4,
        include_key=True,
        shuffle=False,
        read_options=ReadOptions(request_bytes=1),  # one sample per request
    )
    row = 0
    shard_key = ds.table.shard_keys[int(ds.table.shard[row])]
    flip_byte(bad, shard_key, int(ds.table.offset[row]) + 5)
    with pytest.raises(IntegrityError, match="on 3 reads") as info:
        list(ds.loader(num_workers=0))
    assert ds.table.keys[row] in str(info.value) and shard_key in str(info.value)
    size = int(ds.table.size[row])
    sizes = [int(line.split()[1]) for line in Path(log).read_text().splitlines()]
    assert sizes.count(size) >= 2  # the first read and exactly one re-read of that payload


def test_checksummed_frames_get_no_separate_crc_pass(
    corpus: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """zstd checks its frame checksum while decoding; the CRC-32 is for the cache only."""
    import shardlake.torch.reader as reader

    _, root = corpus
    calls: list[int] = []
    real = reader.payload_checksum

    def counting(payload: bytes | memoryview) -> int:
        calls.append(len(payload))
        return real(payload)

    monkeypatch.setattr(reader, "payload_checksum", counting)
    ds = ShardDataset(str(root), batch_size=4)
    assert sum(len(b["lanes"]) for b in ds.loader(num_workers=0)) == len(ds)
    assert calls == []
    cached = ShardDataset(str(root), batch_size=4, cache_dir=tmp_path / "cache")
    assert sum(len(b["lanes"]) for b in cached.loader(num_workers=0)) == len(cached)
    assert len(calls) >= len(cached.table)  # every payload checked before the cache keeps it


def test_request_bytes_sets_the_chunk_size_and_plan_shape_1_caps_it(
    corpus: tuple[Path, Path],
) -> None:
    from shardlake.torch.plan_types import DEFAULT_CHUNK_SIZE

    _, root = corpus
    ds = ShardDataset(str(root), batch_size=4)
    table = ds.table
    tiny = ReadOptions(request_bytes=int(table.size.mean()) * 40)
    # Plan shape 3 (the default; 2 alike): shuffled runs of about request_bytes (8 MiB by
    # default).
    assert ds.params.shape == 3
    assert ds.params.chunk_size == request_chunk_size(table, ReadOptions()) > DEFAULT_CHUNK_SIZE
    # A state saved before shape 2 plans as it did: shuffled chunks held to 16 samples.
    ds.adopt_plan_shape({})
    assert ds.params.shape == 1 and ds.params.chunk_size <= DEFAULT_CHUNK_SIZE
    assert ds.params.interleave == 16
    # An explicit target is honoured beyond the default cap (bigger GETs, e.g. for S3).
    assert request_chunk_size(table, tiny) == 40
    assert ShardDataset(str(root), batch_size=4, read_options=tiny).params.chunk_size == 40


class _GatedStore:
    """Ranges of one fake shard (byte ``i`` is ``i % 251``); the first two units' reads wait
    for ``gate``, and every read's unit (40-byte blocks) is recorded."""

    url = "mem://"

    def __init__(self) -> None:
        import threading

        self.gate = threading.Event()
        self.asked: list[int] = []

    def key_url(self, key: str) -> str:
        return f"mem://{key}"

    def read_ranges(self, ranges: Any, *, views: bool = False) -> list[bytes]:
        units = [s // 40 for _k, s, _e in ranges]
        self.asked.extend(units)
        if min(units) < 2:
            self.gate.wait(30)
        return [bytes(i % 251 for i in range(s, e)) for _k, s, e in ranges]

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return self.read_ranges([(key, start, end)])[0]


def test_read_ahead_waits_while_a_unit_the_next_batch_needs_is_on_its_way() -> None:
    import threading
    import time

    import numpy as np

    from shardlake.format.codec import payload_checksum
    from shardlake.torch.reader import RowTable, SlotReader

    n = 40  # 10 units of 4 rows, 10 bytes each, emitted in order
    offsets = np.arange(n, dtype=np.int32) * 10
    table = RowTable(
        shard=np.zeros(n, np.int32),
        offset=offsets,
        size=np.full(n, 10, np.int32),
        raw_size=np.full(n, 10, np.int32),
        crc32=np.array(
            [payload_checksum(bytes(i % 251 for i in range(o, o + 10))) for o in offsets.tolist()],
            np.uint32,
        ),
        keys=[f"k{i}" for i in range(n)],
        shard_keys=["s"],
    )
    store = _GatedStore()
    reader = SlotReader(
        store,  # type: ignore[arg-type]
        table,
        [np.arange(4 * u, 4 * u + 4, dtype=np.int32) for u in range(10)],
        np.arange(n, dtype=np.int32),
        np.repeat(np.arange(10), 4),
        ReadOptions(inflight=4),
        lookahead=4,  # a "batch" of 4 rows: the first one needs unit 0, the next unit 1
    )
    out: list[Any] = []
    consumer = threading.Thread(target=lambda: out.extend(reader))
    consumer.start()
    time.sleep(0.3)
    # The units the next rows need are asked for together, and nothing else yet.
    assert sorted(store.asked) == [0, 1]
    store.gate.set()
    consumer.join(30)
    assert [row for row, _ in out] == list(range(n))
    assert sorted(store.asked) == list(range(10))
