"""Create races, overwrites under concurrent readers: nobody ever sees a partial object."""

import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

from shardlake.errors import KeyNotFoundError
from shardlake.store import Store
from shardlake.testing.workers import create_at

PAYLOAD = 256 * 1024  # large enough that a non-atomic write would be seen half done


def payload(tag: int, size: int = PAYLOAD) -> bytes:
    head = f"writer-{tag:03d}|".encode()
    return head + bytes([tag % 251]) * (size - len(head))


class Poller:
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

    def __enter__(self) -> "Poller":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


def test_create_race_threads_and_processes(
    store: Store, store_kind: str, process_pool: ProcessPoolExecutor
) -> None:
    # Memory stores live in one process, so there all twelve creators are threads.
    procs = 0 if store_kind == "memory" else 4
    threads = 12 - procs
    rounds = 4 if store_kind in ("local", "memory") else 2
    for r in range(rounds):
        key = f"commits/{r:08d}.json"
        tags = [100 * r + i for i in range(procs + threads)]
        start_at = time.time() + 0.25
        with Poller(store, key) as poller:
            futures = [
                process_pool.submit(create_at, store, key, payload(t), start_at)
                for t in tags[:procs]
            ]
            with ThreadPoolExecutor(threads) as tp:
                local = [
                    tp.submit(create_at, store, key, payload(t), start_at) for t in tags[procs:]
                ]
                outcomes = [f.result(timeout=60) for f in futures + local]
            assert outcomes.count("won") == 1, (r, outcomes)
            winner = payload(tags[outcomes.index("won")])
            poller.wait_to_see(winner)
        assert store.read(key) == winner
        assert poller.seen <= {None, winner}, "a reader saw bytes other than the winner's"
        assert winner in poller.seen and poller.reads > 2


def test_overwrite_is_atomic_under_readers(store: Store, store_kind: str) -> None:
    key = "pointer/latest"
    rounds = 30 if store_kind in ("local", "memory") else 12
    versions = [payload(i) for i in range(rounds)]
    store.write(key, versions[0])
    with Poller(store, key, threads=3) as poller:
        for data in versions[1:]:
            store.write(key, data)
    assert store.read(key) == versions[-1]
    assert poller.seen <= set(versions), "torn or foreign read during overwrite"
    assert None not in poller.seen


def test_capability_check_refuses_store_that_ignores_create(store: Store) -> None:
    from shardlake.errors import CapabilityError
    from shardlake.testing.faults import FaultPlan, FaultyStore

    store.ensure_create_enforced()
    store.write("data", b"readable")
    ignoring = FaultyStore.wrap(store, FaultPlan(ignore_create=True))
    try:
        ignoring.ensure_create_enforced()
    except CapabilityError as exc:
        assert "create-if-absent" in str(exc) and store.url in str(exc)
    else:
        raise AssertionError("a store that ignores create-if-absent passed the check")
    assert ignoring.read("data") == b"readable"  # reading still works
    assert store.list() == ["data"]  # the probe cleaned up after itself
