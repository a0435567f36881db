"""Stores cross process boundaries: pickled into spawned workers, inherited through fork."""

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

from shardlake.store import Store
from shardlake.testing.fixtures import store_kinds
from shardlake.testing.workers import read_key, write_key

# Memory stores live in one process; a spawned child would see an empty one (docs/storage.md).
SHARED_KINDS = [kind for kind in store_kinds(include_env=True) if kind != "memory"]


def test_pickle_roundtrip_in_process(store: Store) -> None:
    store.write("k", b"v")
    clone = pickle.loads(pickle.dumps(store))
    assert clone.url == store.url and clone.read("k") == b"v"
    assert repr(clone) == repr(store)


@pytest.mark.parametrize("store_kind", SHARED_KINDS)
def test_store_pickled_into_spawned_process(
    store: Store, process_pool: ProcessPoolExecutor
) -> None:
    store.write("from/parent", b"parent bytes")
    assert process_pool.submit(read_key, store, "from/parent").result(timeout=60) == b"parent bytes"
    process_pool.submit(write_key, store, "from/child", b"child bytes").result(timeout=60)
    assert store.read("from/child") == b"child bytes"


def _fork_child(store: Store, queue: "multiprocessing.Queue[bytes]") -> None:
    store.write("from/fork", b"forked " + store.read("from/parent"))
    queue.put(store.read("from/fork"))


@pytest.mark.parametrize("store_kind", SHARED_KINDS)
def test_store_used_after_fork(store: Store) -> None:
    # The parent's filesystem (and, for s3fs/gcsfs, its event loop) is live before the fork.
    store.write("from/parent", b"p")
    ctx = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[bytes] = ctx.Queue()
    proc = ctx.Process(target=_fork_child, args=(store, queue))
    proc.start()
    got = queue.get(timeout=60)
    proc.join(timeout=30)
    assert proc.exitcode == 0
    assert got == b"forked p"
    assert store.read("from/fork") == b"forked p"
