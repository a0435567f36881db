"""Streaming writes: visible only when complete, nothing left behind on error or SIGKILL."""

import gc
import multiprocessing
import os
import signal
import time

import pytest

from shardlake.store import Store
from shardlake.testing.fixtures import store_kinds
from shardlake.testing.workers import stream_then_hang

# Memory stores live in one process; a killed child's memory store is gone with it.
SHARED_KINDS = [kind for kind in store_kinds(include_env=True) if kind != "memory"]


class Boom(Exception):
    pass


def multipart_threshold(store: Store) -> int:
    """Bytes after which the backend switches to a multipart / resumable upload."""
    if store.protocol in ("s3", "s3a", "gs", "gcs"):
        return int(store.fs.default_block_size)
    return 1024 * 1024


def pending_uploads(store: Store) -> list[str]:
    """Multipart uploads still open under the store's root (S3 only; [] elsewhere)."""
    if store.protocol not in ("s3", "s3a"):
        return []
    bucket, _, prefix = store.root.partition("/")
    uploads = store.fs.list_multipart_uploads(bucket)
    return [u["Key"] for u in uploads if u["Key"].startswith(prefix)]


def leftovers(store: Store) -> list[str]:
    """Anything a writer left in the store directory besides the listed keys (local temp files)."""
    if store.protocol != "file" or not os.path.isdir(store.root):
        return []
    found = []
    for dirpath, _dirs, files in os.walk(store.root):
        found += [
            os.path.join(dirpath, name) for name in files if name.startswith(".shardlake-tmp")
        ]
    return found


def chunks(total: int, size: int = 300_000):
    pattern = bytes(range(256)) * (size // 256 + 1)
    sent = 0
    while sent < total:
        piece = pattern[: min(size, total - sent)]
        yield piece
        sent += len(piece)


def test_stream_larger_than_multipart_threshold(store: Store) -> None:
    threshold = multipart_threshold(store)
    total = 2 * threshold + 12345
    expected = b"".join(chunks(total))
    checked = False
    with store.open_writer("shards/big.tar") as out:
        sent = 0
        for piece in chunks(total):
            out.write(piece)
            sent += len(piece)
            if sent > 1.5 * threshold and not checked:
                out.flush()  # at least one part is uploaded now
                assert not store.exists("shards/big.tar"), "visible before the writer closed"
                assert store.list("shards") == []
                if store.protocol in ("s3", "s3a"):
                    assert len(pending_uploads(store)) == 1, "not a multipart upload"
                checked = True
    assert checked
    assert store.size("shards/big.tar") == total
    assert store.read("shards/big.tar") == expected
    assert store.read_range("shards/big.tar", total - 10, total + 10) == expected[-10:]
    assert pending_uploads(store) == []
    assert leftovers(store) == []


def _fail_midway(store: Store, key: str, total: int) -> bool:
    """Stream ``total`` bytes into ``key``, then fail; returning drops every handle reference."""
    try:
        with store.open_writer(key) as out:
            for piece in chunks(total):
                out.write(piece)
            out.flush()
            raise Boom()
    except Boom:
        return True
    return False


@pytest.mark.parametrize("size", ["small", "multipart"])
def test_stream_error_leaves_nothing(store: Store, size: str) -> None:
    total = 100 if size == "small" else 2 * multipart_threshold(store) + 1
    assert _fail_midway(store, "shards/failed.tar", total)
    gc.collect()  # a discarded handle must not commit from __del__ either
    assert not store.exists("shards/failed.tar")
    assert store.list() == []
    assert pending_uploads(store) == []
    assert leftovers(store) == []


@pytest.mark.parametrize("store_kind", SHARED_KINDS)
def test_killed_writer_leaves_nothing_visible(store: Store, tmp_path) -> None:
    ready = tmp_path / "ready"
    total = 2 * multipart_threshold(store) + 1
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(
        target=stream_then_hang, args=(store, "shards/killed.tar", total, str(ready))
    )
    proc.start()
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.is_alive(), "the writer died before it was ready"
            assert time.monotonic() < deadline, "the writer never got ready"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.join(timeout=30)
    assert proc.exitcode == -signal.SIGKILL
    assert not store.exists("shards/killed.tar")
    assert store.list() == []
    if store.protocol in ("s3", "s3a"):
        # The killed writer could not abort its upload; a lifecycle rule must (docs/storage.md).
        bucket, _, prefix = store.root.partition("/")
        key = f"{prefix}/shards/killed.tar" if prefix else "shards/killed.tar"
        assert pending_uploads(store) == [key]
        for upload in store.fs.list_multipart_uploads(bucket):
            if upload["Key"] == key:
                store.fs.abort_mpu(bucket, key, upload["UploadId"])
        assert pending_uploads(store) == []
