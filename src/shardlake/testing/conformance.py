"""``StoreConformance``: the tests any store backend must pass, as classes to subclass.

This module imports pytest and is meant to be imported by test code only (like
:mod:`shardlake.testing.pytest_plugin`; nothing else in shardlake imports it).  A backend proves
the promises of ``docs/storage.md`` by subclassing :class:`StoreConformance` in a test module and
providing a ``store`` fixture that yields a fresh, empty :class:`~shardlake.store.Store`::

    import uuid, pytest
    from ..store import open_store, register_backend
    from .conformance import StoreConformance

    register_backend("myfs", MyBackend)

    class TestMyStore(StoreConformance):
        @pytest.fixture
        def store(self):
            return open_store(f"myfs://bucket/conformance-{uuid.uuid4().hex}")

Optional fixtures: ``new_store`` (a callable making another fresh store, for copies; by default
a sibling prefix of ``store``) and ``process_pool``.  Set ``shared_across_processes = False`` for
a store that lives in one process (the memory store), which skips the cross-process tests.
The parts are also usable alone: :class:`BasicConformance`, :class:`AtomicityConformance`,
:class:`StreamingConformance`, :class:`ProcessConformance`, :class:`RetryConformance`.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, ClassVar

import pytest

from ..errors import (
    AlreadyExistsError,
    CapabilityError,
    KeyNotFoundError,
    RetriesExhaustedError,
    StoreError,
    StorePermissionError,
    UsageError,
)
from ..store import RequestCounter, RetryPolicy, Store, open_store
from .faults import FaultInjector, FaultPlan
from .workers import create_at, read_key, stream_then_hang, warm_up, write_key

PAYLOAD = 256 * 1024  # large enough that a non-atomic write would be seen half done
FAST_RETRY = RetryPolicy(attempts=5, base_delay=0.001, max_delay=0.005, deadline=30.0)
POOL_SIZE = 4


def _payload(tag: int, size: int = PAYLOAD) -> bytes:
    head = f"writer-{tag:03d}|".encode()
    return head + bytes([tag % 251]) * (size - len(head))


def _chunks(total: int, size: int = 300_000) -> Iterator[bytes]:
    pattern = bytes(range(256)) * (size // 256 + 1)
    sent = 0
    while sent < total:
        piece = pattern[: min(size, total - sent)]
        yield piece
        sent += len(piece)


def _is_local_only(store: Store) -> bool:
    return store.protocol in ("file", "local", "memory")


def multipart_threshold(store: Store) -> int:
    """Bytes after which the backend switches to a multipart / resumable upload."""
    size = getattr(store.fs, "default_block_size", None) or getattr(store.fs, "blocksize", None)
    if store.protocol in ("s3", "s3a", "gs", "gcs") and size:
        return int(size)
    return 1024 * 1024


def pending_uploads(store: Store) -> list[str]:
    """Multipart uploads still open under the store's root (S3 only; [] elsewhere)."""
    if store.protocol not in ("s3", "s3a"):
        return []
    bucket, _, prefix = store.root.partition("/")
    uploads = store.fs.list_multipart_uploads(bucket)
    return [u["Key"] for u in uploads if u["Key"].startswith(prefix)]


class _Poller:
    """Reader threads that read ``key`` until stopped and record every distinct answer."""

    def __init__(self, store: Store, key: str, threads: int = 2) -> None:
        self.store, self.key = store, key
        self.seen: set[bytes | None] = set()
        self.reads = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run) for _ in range(threads)]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                got: bytes | None = self.store.read(self.key)
            except KeyNotFoundError:
                got = None
            with self._lock:
                self.seen.add(got)
                self.reads += 1

    def wait_to_see(self, value: bytes, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while value not in self.seen and time.monotonic() < deadline:
            time.sleep(0.01)

    def __enter__(self) -> _Poller:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


class _Fixtures:
    """Fixtures every part shares; a subclass provides ``store`` (and may override the rest)."""

    shared_across_processes: ClassVar[bool] = True

    @pytest.fixture
    def store(self) -> Store:
        raise NotImplementedError("a StoreConformance subclass provides the `store` fixture")

    @pytest.fixture
    def new_store(self, store: Store) -> Callable[[], Store]:
        def make() -> Store:
            return open_store(f"{store.url}-other-{uuid.uuid4().hex[:8]}", store.storage_options)

        return make

    @pytest.fixture(scope="class")
    @classmethod
    def process_pool(cls) -> Iterator[ProcessPoolExecutor]:
        """Warm spawned workers for the cross-process tests, one pool per class."""
        pool = ProcessPoolExecutor(POOL_SIZE, mp_context=multiprocessing.get_context("spawn"))
        try:
            pids: set[int] = set()
            for _ in range(5):  # every worker imports the backends once, before timed races
                pids |= set(pool.map(warm_up, [0.5] * POOL_SIZE))
                if len(pids) >= POOL_SIZE:
                    break
            yield pool
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def shared(self, store: Store) -> bool:
        """Whether a pickled copy of ``store`` in another process sees the same objects."""
        return self.shared_across_processes and store.protocol != "memory"

    def require_shared(self, store: Store) -> None:
        if not self.shared(store):
            pytest.skip("this store lives in one process")


class BasicConformance(_Fixtures):
    """Reads, writes, ranges, listing and delete: the same answers on every backend."""

    def test_write_read_stat_delete(self, store: Store) -> None:
        store.write("a/b.bin", b"hello")
        assert store.read("a/b.bin") == b"hello"
        assert store.exists("a/b.bin") and not store.exists("a/c.bin")
        assert not store.exists("a")  # a directory-like prefix is not an object
        info = store.stat("a/b.bin")
        assert (info.key, info.size) == ("a/b.bin", 5)
        store.write("a/b.bin", b"bye")  # overwrite
        assert store.read("a/b.bin") == b"bye"
        store.delete("a/b.bin")
        store.delete("a/b.bin")  # a missing key is not an error
        assert not store.exists("a/b.bin")
        with pytest.raises(KeyNotFoundError) as caught:
            store.read("a/b.bin")
        assert isinstance(caught.value, FileNotFoundError) and "a/b.bin" in str(caught.value)
        with pytest.raises(KeyNotFoundError):
            store.stat("a/b.bin")

    def test_create_if_absent(self, store: Store) -> None:
        store.create("doc.json", b"first")
        with pytest.raises(AlreadyExistsError) as caught:
            store.create("doc.json", b"second")
        assert isinstance(caught.value, FileExistsError) and isinstance(caught.value, StoreError)
        assert store.read("doc.json") == b"first"
        store.create("doc.json", b"first")  # a re-sent create of the same bytes is not a loss
        store.create("empty", b"")
        assert store.read("empty") == b""
        with pytest.raises(AlreadyExistsError):
            store.create("empty", b"x")
        store.ensure_create_enforced()

    def test_range_edge_cases(self, store: Store) -> None:
        data = b"0123456789"
        store.write("f", data)
        store.write("empty", b"")
        assert store.read("empty") == b"" and store.size("empty") == 0
        assert store.read_range("empty", 0, 10) == b""
        assert store.read_range("empty", 0, 0) == b""
        assert store.read_range("empty", 5, 9) == b""
        for start, end in [(0, 10), (2, 5), (5, 5), (0, 1), (9, 10), (8, 20), (10, 20), (12, 30)]:
            assert store.read_range("f", start, end) == data[start:end], (start, end)
        for start, end in [(0, 4), (3, 3)]:
            with pytest.raises(KeyNotFoundError):
                store.read_range("missing", start, end)
        for start, end in [(5, 4), (-1, 4)]:
            with pytest.raises(UsageError):
                store.read_range("f", start, end)

    def test_many_ranges_in_one_call(self, store: Store) -> None:
        blob = bytes(range(256)) * 40  # 10240 bytes
        contents = {"blob": blob, "f": b"0123456789", "empty": b""}
        for key, value in contents.items():
            store.write(key, value)
        ranges = [("blob", s, s + 97) for s in range(0, 10240, 211)]
        ranges += [("f", 3, 3), ("f", 8, 20), ("f", 10, 12), ("empty", 0, 5)]
        ranges += [("blob", 10000, 11000), ("empty", 0, 0), ("f", 0, 10), ("blob", 0, 1)]
        assert store.read_ranges(ranges) == [contents[k][s:e] for k, s, e in ranges]
        assert store.read_ranges([]) == []
        for bad in ([("f", 0, 2), ("missing", 0, 2)], [("f", 0, 2), ("missing", 1, 1)]):
            with pytest.raises(KeyNotFoundError):
                store.read_ranges(bad)

    def test_prefix_listing_is_by_directory(self, store: Store) -> None:
        keys = ["c/x", "c/y/z", "c/y/zz", "cc/x", "ca", "d/c/x"]
        for key in keys:
            store.write(key, key.encode())
        assert store.list("c") == store.list("c/") == ["c/x", "c/y/z", "c/y/zz"]
        assert store.list("c/y") == ["c/y/z", "c/y/zz"]
        assert store.list("cc") == ["cc/x"] and store.list("d") == ["d/c/x"]
        assert store.list("nope") == []
        assert store.list() == store.list("") == sorted(keys)
        sizes = {info.key: info.size for info in store.list_info("c")}
        assert sizes == {"c/x": 3, "c/y/z": 5, "c/y/zz": 6}
        store.delete("c/x")
        assert store.list("c") == ["c/y/z", "c/y/zz"]  # no stale listing cache

    def test_keys_with_spaces_and_unicode(self, store: Store) -> None:
        keys = [
            "with space/file name.bin",
            "ünïcødé/κλειδί 1.npz",
            "日本/データ",
            "plus+sign=eq,comma",
        ]
        for i, key in enumerate(keys):
            store.create(key, f"payload {i}".encode())
        for i, key in enumerate(keys):
            assert store.read(key) == f"payload {i}".encode()
            assert store.read_range(key, 0, 7) == b"payload"
        assert store.list() == sorted(keys)
        assert store.list("ünïcødé") == ["ünïcødé/κλειδί 1.npz"]
        assert store.list("with space") == ["with space/file name.bin"]

    def test_copy_between_stores(self, store: Store, new_store: Callable[[], Store]) -> None:
        store.write("src/obj", b"x" * 1000)
        other = new_store()
        store.copy_to(other, "src/obj", "dst/obj")
        assert other.read("dst/obj") == b"x" * 1000
        assert other.list() == ["dst/obj"]

    def test_prefix_is_not_an_object(self, store: Store) -> None:
        store.write("dir/obj", b"1")
        with pytest.raises(KeyNotFoundError):
            store.read("dir")
        with pytest.raises(KeyNotFoundError):
            store.read_range("dir", 0, 1)
        with pytest.raises(KeyNotFoundError):
            store.read("dir/obj/deeper")
        assert store.read_ranges([("dir/obj", 0, 1)]) == [b"1"]


class AtomicityConformance(_Fixtures):
    """Create races and overwrites under concurrent readers: nobody sees a partial object."""

    race_rounds: ClassVar[int] = 2

    def test_create_race_threads_and_processes(
        self, store: Store, process_pool: ProcessPoolExecutor
    ) -> None:
        procs = 4 if self.shared(store) else 0  # one-process stores race threads only
        threads = 12 - procs
        rounds = 2 * self.race_rounds if _is_local_only(store) else self.race_rounds
        for r in range(rounds):
            key = f"commits/{r:08d}.json"
            tags = [100 * r + i for i in range(procs + threads)]
            start_at = time.time() + 0.25
            with _Poller(store, key) as poller:
                futures = [
                    process_pool.submit(create_at, store, key, _payload(t), start_at)
                    for t in tags[:procs]
                ]
                with ThreadPoolExecutor(threads) as tp:
                    local = [
                        tp.submit(create_at, store, key, _payload(t), start_at)
                        for t in tags[procs:]
                    ]
                    outcomes = [f.result(timeout=60) for f in futures + local]
                assert outcomes.count("won") == 1, (r, outcomes)
                winner = _payload(tags[outcomes.index("won")])
                poller.wait_to_see(winner)
            assert store.read(key) == winner
            assert poller.seen <= {None, winner}, "a reader saw bytes other than the winner's"
            assert winner in poller.seen and poller.reads > 2

    def test_overwrite_is_atomic_under_readers(self, store: Store) -> None:
        key = "pointer/latest"
        rounds = 30 if _is_local_only(store) else 12
        versions = [_payload(i) for i in range(rounds)]
        store.write(key, versions[0])
        with _Poller(store, key, threads=3) as poller:
            for data in versions[1:]:
                store.write(key, data)
        assert store.read(key) == versions[-1]
        assert poller.seen <= set(versions), "torn or foreign read during overwrite"
        assert None not in poller.seen

    def test_capability_check_refuses_store_that_ignores_create(self, store: Store) -> None:
        store.ensure_create_enforced()
        store.write("data", b"readable")
        ignoring = store.with_layers(FaultInjector(FaultPlan(ignore_create=True)))
        with pytest.raises(CapabilityError) as caught:
            ignoring.ensure_create_enforced()
        assert "create-if-absent" in str(caught.value) and store.url in str(caught.value)
        assert ignoring.read("data") == b"readable"  # reading still works
        assert store.list() == ["data"]  # the probe cleaned up after itself


class StreamingConformance(_Fixtures):
    """Streaming writes: visible only when complete; nothing left behind on error or SIGKILL,
    except staging that :meth:`Store.leftovers` finds and :meth:`Store.discard_leftover` removes."""

    def test_stream_larger_than_multipart_threshold(self, store: Store) -> None:
        threshold = multipart_threshold(store)
        total = 2 * threshold + 12345
        expected = b"".join(_chunks(total))
        checked = False
        with store.open_writer("shards/big.tar") as out:
            sent = 0
            for piece in _chunks(total):
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
        assert store.leftovers(time.time() + 60) == []

    @pytest.mark.parametrize("size", ["small", "multipart"])
    def test_stream_error_leaves_nothing(self, store: Store, size: str) -> None:
        total = 100 if size == "small" else 2 * multipart_threshold(store) + 1
        assert _fail_midway(store, "shards/failed.tar", total)
        gc.collect()  # a discarded handle must not commit from __del__ either
        assert not store.exists("shards/failed.tar")
        assert store.list() == []
        assert pending_uploads(store) == []
        assert store.leftovers(time.time() + 60) == []

    def test_killed_writer_leaves_only_discardable_leftovers(
        self, store: Store, tmp_path: Any
    ) -> None:
        self.require_shared(store)
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
            os.kill(proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
        finally:
            proc.join(timeout=30)
        assert proc.exitcode == -signal.SIGKILL
        assert not store.exists("shards/killed.tar")
        assert store.list() == []
        found = store.leftovers(time.time() + 60)
        if store.protocol in ("s3", "s3a", "file", "local"):
            # S3 keeps the upload open, local disk the temp file: gc discards them.
            assert len(found) == 1 and "killed.tar" in found[0].path
        for leftover in found:
            store.discard_leftover(leftover)
        assert store.leftovers(time.time() + 60) == [] and pending_uploads(store) == []


def _fail_midway(store: Store, key: str, total: int) -> bool:
    """Stream ``total`` bytes into ``key``, then fail; returning drops every handle reference."""

    class Boom(Exception):
        pass

    try:
        with store.open_writer(key) as out:
            for piece in _chunks(total):
                out.write(piece)
            out.flush()
            raise Boom()
    except Boom:
        return True
    return False


class ProcessConformance(_Fixtures):
    """Stores cross process boundaries: pickled, spawned, forked."""

    def test_pickle_roundtrip_in_process(self, store: Store) -> None:
        store.write("k", b"v")
        clone = pickle.loads(pickle.dumps(store))
        assert clone.url == store.url and clone.read("k") == b"v"
        assert repr(clone) == repr(store)

    def test_store_pickled_into_spawned_process(
        self, store: Store, process_pool: ProcessPoolExecutor
    ) -> None:
        self.require_shared(store)
        store.write("from/parent", b"parent bytes")
        got = process_pool.submit(read_key, store, "from/parent").result(timeout=60)
        assert got == b"parent bytes"
        process_pool.submit(write_key, store, "from/child", b"child bytes").result(timeout=60)
        assert store.read("from/child") == b"child bytes"

    def test_store_used_after_fork(self, store: Store) -> None:
        self.require_shared(store)
        # The parent's filesystem (for s3fs/gcsfs, its event loop too) is live before the fork.
        store.write("from/parent", b"p")
        ctx = multiprocessing.get_context("fork")
        queue: multiprocessing.Queue[bytes] = ctx.Queue()
        proc = ctx.Process(target=_fork_child, args=(store, queue))
        proc.start()
        got = queue.get(timeout=60)
        proc.join(timeout=30)
        assert proc.exitcode == 0 and got == b"forked p"
        assert store.read("from/fork") == b"forked p"


def _fork_child(store: Store, queue: multiprocessing.Queue[bytes]) -> None:
    store.write("from/fork", b"forked " + store.read("from/parent"))
    queue.put(store.read("from/fork"))


class RetryConformance(_Fixtures):
    """The store's one retry policy on this backend: transient faults retried within the limit,
    a lost create reply is not a lost race, permanent errors surface at once."""

    @staticmethod
    def faulty(
        store: Store, plan: FaultPlan, policy: RetryPolicy = FAST_RETRY
    ) -> tuple[Store, RequestCounter, FaultInjector]:
        counter, injector = RequestCounter(), FaultInjector(plan)
        return store.with_retry(policy).with_layers(counter, injector), counter, injector

    def test_transient_faults_are_retried_within_the_limit(self, store: Store) -> None:
        plan = FaultPlan(fail_rate=0.3, seed=11, max_consecutive=3)
        faulty, counter, injector = self.faulty(store, plan)
        for i in range(12):
            faulty.write(f"obj/{i}", bytes([i]) * 100)
        faulty.create("doc", b"created")
        assert [faulty.read(f"obj/{i}") for i in range(12)] == [bytes([i]) * 100 for i in range(12)]
        assert faulty.read_range("obj/3", 10, 20) == bytes([3]) * 10
        assert faulty.read_ranges([("obj/1", 0, 2), ("obj/2", 98, 120)]) == [
            b"\x01\x01",
            b"\x02\x02",
        ]
        assert faulty.list("obj") == [f"obj/{i}" for i in sorted(range(12), key=str)]
        assert faulty.size("doc") == 7
        assert injector.injected["write"] > 0 and injector.injected["read"] > 0
        assert counter.total_requests > 30 and counter.bytes_read >= 12 * 100

    def test_lost_create_reply_is_not_a_lost_race(self, store: Store) -> None:
        # Every create reaches the store, then its reply is "lost" once; the retry finds its bytes.
        plan = FaultPlan(lost_reply_rate=1.0, max_consecutive=1, ops=("create",))
        faulty, counter, injector = self.faulty(store, plan)
        faulty.create("commits/1", b"mine")
        assert injector.injected["create"] == 1 and counter.requests["create"] == 2
        with pytest.raises(AlreadyExistsError):
            faulty.create("commits/1", b"someone else's")
        assert store.read("commits/1") == b"mine"

    def test_permanent_errors_are_not_retried(self, store: Store) -> None:
        store.write("denied/x", b"secret")
        faulty, counter, _ = self.faulty(store, FaultPlan(permanent=("denied/",)))
        with pytest.raises(StorePermissionError):
            faulty.read("denied/x")
        assert counter.requests["read"] == 1
        with pytest.raises(KeyNotFoundError):
            faulty.read("missing")
        assert counter.requests["read"] == 2
        faulty.create("once", b"1")
        with pytest.raises(AlreadyExistsError):
            faulty.create("once", b"2")
        # The refused create is final: one request, then the read-back (stat) that settles it.
        assert counter.requests["create"] == 2

    def test_exhausted_retries_name_url_operation_attempts(self, store: Store) -> None:
        policy = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.002)
        faulty, counter, _ = self.faulty(store, FaultPlan(fail_rate=1.0), policy)
        with pytest.raises(RetriesExhaustedError) as caught:
            faulty.read("some/key")
        message = str(caught.value)
        assert "read" in message and faulty.key_url("some/key") in message
        assert "3 attempt" in message and counter.requests["read"] == 3
        assert store.list() == []  # nothing written by the failed attempts


class StoreConformance(
    BasicConformance,
    AtomicityConformance,
    StreamingConformance,
    ProcessConformance,
    RetryConformance,
):
    """Every conformance test; subclass it and provide the ``store`` fixture (module docstring)."""


__all__ = [
    "AtomicityConformance",
    "BasicConformance",
    "ProcessConformance",
    "RetryConformance",
    "StoreConformance",
    "StreamingConformance",
    "multipart_threshold",
    "pending_uploads",
]
