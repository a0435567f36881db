"""The conformance suite runs on every loopback backend, plus a real bucket when
SHARDLAKE_CONFORMANCE_URL is set (see conformance/README.md)."""

import multiprocessing
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

import pytest

from shardlake.testing import workers
from shardlake.testing.fixtures import (  # noqa: F401 - pytest finds fixtures by name
    store,
    store_factory,
    store_kinds,
    store_location,
    store_servers,
    store_url,
)

POOL_SIZE = 4


@pytest.fixture(params=store_kinds(include_env=True))
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def process_pool() -> Iterator[ProcessPoolExecutor]:
    """Four warm spawned workers, shared by the tests that need other processes."""
    pool = ProcessPoolExecutor(POOL_SIZE, mp_context=multiprocessing.get_context("spawn"))
    try:
        # Every worker imports the backends once, so timed races start together later.
        pids: set[int] = set()
        for _ in range(5):
            pids |= set(pool.map(workers.warm_up, [0.5] * POOL_SIZE))
            if len(pids) >= POOL_SIZE:
                break
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
