"""Root.write_bag on a real distributed cluster (loopback, 2 worker processes), local and S3."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dask.bag as db
import distributed
import numpy as np
import pytest
from support.writer import (
    FailFirstManifest,
    Sample,
    assert_loads_bit_exact,
    make_samples,
    revisions,
    write_npz_tree,
)

import shardlake
from shardlake import PackOptions, RetryPolicy, WriteOptions, open_store
from shardlake.errors import SourceError
from shardlake.testing.fixtures import StoreLocation

SHARD = 1500


@pytest.fixture(scope="module")
def client(dask_cluster: Any) -> Iterator[Any]:
    with distributed.Client(dask_cluster) as dask_client:
        yield dask_client


def _bag(samples: list[Sample], npartitions: int = 4) -> Any:
    # Records of one partition spread over several bag partitions: the build must group them.
    return db.from_sequence(samples[::-1], npartitions=npartitions)


@pytest.mark.parametrize("store_kind", ["local", "s3"])
def test_write_bag_on_a_cluster_equals_pack(
    client: Any, store_factory: Callable[..., StoreLocation], tmp_path: Path
) -> None:
    samples = make_samples(partitions=3, per_partition=8)
    location = store_factory(label="bag")
    root = shardlake.open(location.url, **location.storage_options)
    report = root.write_bag(_bag(samples), "v1", options=WriteOptions(shard_size=SHARD))
    assert report.version.samples == len(samples) and len(report.built) == 3
    source = tmp_path / "src"
    write_npz_tree(source, samples)
    packed = shardlake.open(tmp_path / "packed")
    packed.pack(source, tag="v1", options=PackOptions(shard_size=SHARD, executor="inline"))
    assert revisions(root, "v1") == revisions(packed, "v1")
    assert root.verify(source).ok and root.scrub().ok
    assert_loads_bit_exact(location.url, "v1", samples, location.storage_options or None)
    # incremental: one partition rewritten with new content, the others carried
    changed = [(k, {**a, "ego": a["ego"] + 1}, m) for k, a, m in samples if k.startswith("log2/")]
    again = root.write_bag(_bag(changed, 2), "v2", base="v1")
    assert again.built == ["log2"] and sorted(again.carried) == ["log0", "log1"]
    assert root.diff("v1", "v2").data_changed == ["log2"]
    root.keysets.create("odd", version="v1", where='"index" % 2 = 1')
    rebased = root.keysets.rebase("odd", "v2", new_name="odd-v2")
    assert (rebased.kept, rebased.dropped, rebased.changed) == (12, 0, 4)


def test_failing_record_publishes_nothing(client: Any, tmp_path: Path) -> None:
    samples = make_samples(partitions=2, per_partition=4)
    bad = [*samples, ("log1/bad", {"x": np.array([None], dtype=object)}, {})]
    root = shardlake.open(tmp_path / "root")
    with pytest.raises(SourceError, match="log1/bad"):
        root.write_bag(_bag(bad), "v1")
    dup = [*samples, samples[0]]
    with pytest.raises(SourceError, match="duplicate key"):
        root.write_bag(_bag(dup), "v1")
    with pytest.raises(SourceError, match="empty write"):
        root.write_bag(db.from_sequence([], npartitions=1), "v1")
    assert root.versions() == []


def test_failed_build_task_is_retried_by_dask(client: Any, tmp_path: Path) -> None:
    samples = make_samples(partitions=3, per_partition=3)
    # No store-level retry: the injected failure reaches the task, and Dask retries the task.
    store = open_store(str(tmp_path / "root")).with_retry(RetryPolicy(attempts=1))
    root = shardlake.open(store.with_layers(FailFirstManifest()))
    report = root.write_bag(_bag(samples), "v1")
    # a retried task may hold a partition whose first build already finished: then it is resumed
    assert sorted(report.built + report.resumed) == ["log0", "log1", "log2"]
    assert root.scrub().ok and root.dataset("v1").version.samples == len(samples)


def test_a_duplicate_key_is_not_retried_and_reported_once(client: Any, tmp_path: Path) -> None:
    samples = make_samples(partitions=2, per_partition=4)
    root = shardlake.open(tmp_path / "root")

    def failures() -> int:
        logs = client.get_worker_logs()
        return sum("duplicate key" in msg for lines in logs.values() for _, msg in lines)

    before = failures()
    with pytest.raises(SourceError, match="'log0/000000': duplicate key in the bag"):
        root.write_bag(_bag([*samples, samples[0]]), "v1")  # retries=2, the default
    # No worker logged a failed attempt (Dask logs a traceback per attempt it retries).
    assert failures() == before
    assert root.versions() == []


def test_write_bag_shows_progress_as_the_cluster_builds(
    client: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    samples = make_samples(partitions=3, per_partition=4)
    root = shardlake.open(tmp_path / "root")
    report = root.write_bag(_bag(samples), "v1", options=WriteOptions(progress=True))
    assert report.version.samples == len(samples)
    err = capsys.readouterr().err.splitlines()
    assert err and err[-1].startswith("write_bag v1: build: "), err
    assert " bag partitions (100.0%)" in err[-1], err
