"""Retries: transient faults are retried within the limit, permanent errors surface at once."""

import pytest

from shardlake.errors import (
    AlreadyExistsError,
    KeyNotFoundError,
    RetriesExhaustedError,
    StorePermissionError,
)
from shardlake.store import RetryPolicy, Store
from shardlake.testing.faults import FaultPlan, FaultyStore

FAST = RetryPolicy(attempts=5, base_delay=0.001, max_delay=0.005)


def test_transient_faults_are_retried_within_the_limit(store: Store) -> None:
    faulty = FaultyStore.wrap(store, FaultPlan(fail_rate=0.3, seed=11, max_consecutive=3), FAST)
    for i in range(12):
        faulty.write(f"obj/{i}", bytes([i]) * 100)
    faulty.create("doc", b"created")
    assert [faulty.read(f"obj/{i}") for i in range(12)] == [bytes([i]) * 100 for i in range(12)]
    assert faulty.read_range("obj/3", 10, 20) == bytes([3]) * 10
    assert faulty.read_ranges([("obj/1", 0, 2), ("obj/2", 98, 120)]) == [b"\x01\x01", b"\x02\x02"]
    assert faulty.list("obj") == [f"obj/{i}" for i in sorted(range(12), key=str)]
    assert faulty.size("doc") == 7
    stats = faulty.stats
    assert stats.injected["write"] > 0 and stats.injected["read"] > 0
    assert stats.total_requests == sum(stats.requests.values()) > 30
    assert stats.bytes_read >= 12 * 100


def test_lost_create_reply_is_not_a_lost_race(store: Store) -> None:
    # Every create reaches the store, then its reply is "lost" once; the retry finds its own bytes.
    plan = FaultPlan(lost_reply_rate=1.0, max_consecutive=1, ops=("create",))
    faulty = FaultyStore.wrap(store, plan, FAST)
    faulty.create("commits/1", b"mine")
    assert faulty.stats.injected["create"] == 1 and faulty.stats.requests["create"] == 2
    with pytest.raises(AlreadyExistsError):
        faulty.create("commits/1", b"someone else's")
    assert store.read("commits/1") == b"mine"


def test_permanent_errors_are_not_retried(store: Store) -> None:
    store.write("denied/x", b"secret")
    faulty = FaultyStore.wrap(store, FaultPlan(permanent=("denied/",)), FAST)
    with pytest.raises(StorePermissionError):
        faulty.read("denied/x")
    assert faulty.stats.requests["read"] == 1
    with pytest.raises(KeyNotFoundError):
        faulty.read("missing")
    assert faulty.stats.requests["read"] == 2
    faulty.create("once", b"1")
    with pytest.raises(AlreadyExistsError):
        faulty.create("once", b"2")
    # create: the refused attempt plus nothing else - a precondition failure is final.
    assert faulty.stats.requests["create"] == 2


def test_exhausted_retries_name_url_operation_attempts(store: Store) -> None:
    policy = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.002)
    faulty = FaultyStore.wrap(store, FaultPlan(fail_rate=1.0), policy)
    with pytest.raises(RetriesExhaustedError) as caught:
        faulty.read("some/key")
    message = str(caught.value)
    assert "read" in message and faulty.key_url("some/key") in message
    assert "3 attempt" in message
    assert faulty.stats.requests["read"] == 3
    assert store.list() == []  # nothing written by the failed attempts
