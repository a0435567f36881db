"""Fixtures of the model-based suite (tests/support/model.py)."""

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def model_dask_client() -> Iterator[Any]:
    """A Dask client on an in-process cluster (threads, no worker processes): write_bag's
    tasks run for real, without paying a process start per sequence. ``None`` without
    ``distributed`` (the machine then leaves write_bag out)."""
    try:
        import distributed
    except ImportError:
        yield None
        return
    with (
        distributed.LocalCluster(
            n_workers=1,
            threads_per_worker=2,
            processes=False,
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client
