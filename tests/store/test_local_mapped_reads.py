"""Local disk: the loader's reads (``read_ranges(views=True)``) map shard bytes, never copy them."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest

from shardlake.store import open_store


def test_local_views_map_the_file_and_clip_at_its_end(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    data = bytes(range(256)) * 40  # 10,240 bytes: ranges across page boundaries
    store.write("a/shard.tar", data)
    store.write("a/empty.tar", b"")
    ranges = [("a/shard.tar", 4095, 4200), ("a/shard.tar", 10, 20), ("a/shard.tar", 10000, 99999)]
    views = store.read_ranges(ranges, views=True)
    # Mapped from the page cache, not copied into fresh memory (the loader's reads).
    assert all(isinstance(v, memoryview) for v in views)
    assert [bytes(v) for v in views] == [data[4095:4200], data[10:20], data[10000:]]
    assert [bytes(v) for v in store.read_ranges(ranges[:1], views=True)] == [data[4095:4200]]
    assert store.read_ranges(ranges) == [data[4095:4200], data[10:20], data[10000:]]
    assert store.read_ranges([("a/empty.tar", 0, 10)], views=True) == [b""]
    # Shards are never rewritten in place; removing one leaves the mapped bytes readable.
    store.delete("a/shard.tar")
    assert bytes(views[0]) == data[4095:4200]


def test_local_views_fall_back_to_copies_where_files_cannot_be_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(str(tmp_path))
    data = bytes(range(256)) * 40
    store.write("a/shard.tar", data)

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(19, "No such device")  # ENODEV: what a FUSE mount without mmap says

    monkeypatch.setattr(mmap, "mmap", refuse)
    got = store.read_ranges([("a/shard.tar", 4095, 4200), ("a/shard.tar", 9000, 20000)], views=True)
    assert [bytes(v) for v in got] == [data[4095:4200], data[9000:]]
