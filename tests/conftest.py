"""Shared fixtures: run any test on every store backend (see shardlake.testing.pytest_plugin)."""

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.torch import make_root

# Off unless a test turns it on: request counts must not depend on what an earlier test (or
# the user's ~/.cache) left in the node-local catalog cache (tests/read/test_catalog_cache.py).
os.environ["SHARDLAKE_CATALOG_CACHE"] = "off"

pytest_plugins = ["shardlake.testing.pytest_plugin"]


@pytest.fixture(params=["threads", "processes"])
def loader_engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a loader test on both engines: the default engine comes from
    ``SHARDLAKE_LOADER_ENGINE``, which DDP ranks started as subprocesses inherit."""
    engine: str = request.param
    monkeypatch.setenv("SHARDLAKE_LOADER_ENGINE", engine)
    return engine


@pytest.fixture(scope="module")
def dask_cluster() -> Iterator[Any]:
    """A real distributed cluster on loopback: 2 worker processes, 1 thread each (one per
    test module: it goes away with the module's tests)."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=2,
        processes=True,
        threads_per_worker=1,
        protocol="tcp://",
        host="127.0.0.1",
        dashboard_address=None,
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def dask_address(dask_cluster: Any) -> str:
    """The cluster's scheduler as shardlake's executor spec (``dask://127.0.0.1:PORT``)."""
    return str(dask_cluster.scheduler_address).replace("tcp://", "dask://")


@pytest.fixture(scope="session")
def packed_root(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, Path]]:
    """A factory: ``packed_root(counts, **make_root_options)`` synthesizes a corpus of
    ``len(counts)`` logs and packs it as ``v1``; ``(source, root)``. Every call makes its own root
    in a fresh directory, so a test that damages one never meets another's."""

    def make(counts: list[int], *, name: str = "packed", **options: Any) -> tuple[Path, Path]:
        return make_root(tmp_path_factory.mktemp(name), counts, **options)

    return make
