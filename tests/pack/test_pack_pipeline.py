"""The overlapped build: read-ahead of uncached sources, background shard writes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from support.pack import make_source, read_all, small_frame

import shardlake
import shardlake.pack.build as build
from shardlake import Store, open_store
from shardlake.errors import PackWorkerError

FRAMES = {f"log/f{i:02d}": small_frame(i) for i in range(12)}


class _FailingHandle:
    """Accepts ``budget`` bytes, then fails like a dropped upload."""

    def __init__(self, inner: BinaryIO, budget: int) -> None:
        self._inner, self._left = inner, budget

    def write(self, data: bytes) -> int:
        if len(data) > self._left:
            raise ConnectionResetError("injected: upload connection reset")
        self._left -= len(data)
        return self._inner.write(data)


class _FailingShardWrites(Store):
    """A store whose streamed shard writes die after ``budget`` bytes (an explicit wrapper)."""

    budget = 1500

    @contextlib.contextmanager
    def open_writer(self, key: str) -> Iterator[BinaryIO]:
        with super().open_writer(key) as handle:
            yield _FailingHandle(handle, self.budget)  # type: ignore[misc]


def _no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every npz is read again after pass 1, so the read-ahead path does all source reads.
    monkeypatch.setattr(build, "READ_CACHE_BYTES", 0)


def test_read_ahead_roundtrip_is_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_cache(monkeypatch)
    src = make_source(tmp_path / "src", FRAMES)
    store = open_store(str(tmp_path / "root"))
    version = shardlake.open(store).pack(src, tag="v1", executor="inline", shard_size=4096).record
    assert sum(len(p.shards) for p in version.entries) > 1
    got = read_all(store, version)
    assert sorted(got) == sorted(FRAMES)
    for key, arrays in FRAMES.items():
        for name, array in arrays.items():
            assert got[key][name].tobytes() == array.tobytes()


def test_file_changed_between_passes_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_cache(monkeypatch)
    src = make_source(tmp_path / "src", FRAMES)
    real = build._hash_sources

    def hash_then_change(task: Any, root: Path) -> Any:
        out = real(task, root)
        make_source(src, {"log/f07": small_frame(99)})  # rewritten after it was hashed
        return out

    monkeypatch.setattr(build, "_hash_sources", hash_then_change)
    store = open_store(str(tmp_path / "root"))
    with pytest.raises(PackWorkerError, match=r"f07\.npz: changed while it was being packed"):
        shardlake.open(store).pack(src, tag="v1", executor="inline")
    assert shardlake.open(store).versions() == []
    assert store.list("versions/") == []


def test_background_write_failure_fails_the_build(tmp_path: Path) -> None:
    src = make_source(tmp_path / "src", FRAMES)
    store = _FailingShardWrites(str(tmp_path / "root"))
    with pytest.raises(PackWorkerError, match="upload connection reset"):
        shardlake.open(store).pack(src, tag="v1", executor="inline", shard_size=1 << 20)
    assert shardlake.open(store).versions() == []
    # The failed shard was discarded: no shard or manifest object is visible.
    assert [k for k in store.list("") if k.endswith((".tar", ".parquet"))] == []
