"""The loader's ``__key__`` labels the sample its arrays came from, on every way of making a
version and every way of reading it (issue #43): with the node-local catalog cache off, cold
and warm, on both engines, with and without workers. Each sample holds a hash of its own key,
so a label that belongs to another sample is caught."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardlake
from shardlake.torch import ShardDataset

pytestmark = pytest.mark.timeout(300)

# Partition names whose order differs from the order of the segments holding their rows.
PARTITIONS = {"a": 7, "b": 5, "c": 9, "d": 4}


def key_hash(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:7], "little")


def sample(key: str, salt: int = 0) -> dict[str, np.ndarray]:
    return {
        "h": np.array([key_hash(key)], dtype=np.int64),
        "x": np.full(3, salt + len(key), dtype=np.float32),
    }


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("labels")
    src = tmp / "src"
    for part, count in PARTITIONS.items():
        (src / part).mkdir(parents=True)
        for i in range(count):
            np.savez(src / part / f"s{i:03d}.npz", **sample(f"{part}/s{i:03d}"))
    url = str(tmp / "root")
    r = shardlake.open(url)
    r.pack(src, tag="v1")
    with r.writer("based", base="v1") as w:  # replaces b and c, keeps a and d
        for part in ("c", "b"):
            for i in range(6):
                w.write(f"{part}/n{i:03d}", sample(f"{part}/n{i:03d}", 1))
    r.remove("removed", base="v1", keys=["a/s001", "c/s004", "d/s000"])
    (src / "b" / "s002.npz").write_bytes((src / "b" / "s002.npz").read_bytes())
    np.savez(src / "c" / "s000.npz", **sample("c/s000", 2))  # one partition rebuilt
    r.pack(src, tag="packed-base", base="v1")
    return url


def check_labels(url: str, version: str, engine: str, workers: int) -> int:
    ds = ShardDataset(
        url, version=version, batch_size=4, include_key=True, num_workers=workers,
        engine=engine, shuffle=True, seed=5, max_pad_fraction=1,
    )  # fmt: skip
    seen = 0
    for batch in ds.loader():
        got = [int(v) for v in batch["h"].reshape(-1).tolist()]
        assert got == [key_hash(k) for k in batch["__key__"]], (version, batch["__key__"])
        seen += len(got)
    return seen


@pytest.mark.parametrize("version", ["based", "removed", "packed-base"])
def test_keys_label_their_own_samples_with_the_catalog_cache_off_cold_and_warm(
    root: str, version: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = shardlake.open(root).version(version).samples
    for cache in ("off", str(tmp_path / "cache"), str(tmp_path / "cache")):  # off, cold, warm
        monkeypatch.setenv("SHARDLAKE_CATALOG_CACHE", cache)
        for engine in ("threads", "processes"):
            for workers in (0, 2):
                assert check_labels(root, version, engine, workers) >= want


def test_every_read_path_lists_a_versions_keys_in_one_order(root: str) -> None:
    """Keys read alone come in the order of the rows read with them (partition, then manifest
    order), whatever segments hold them."""
    r = shardlake.open(root)
    for version in ("based", "removed", "packed-base"):
        ds = r.dataset(version)
        rows = ds.manifests(["key", "partition"])
        assert ds.manifests(["key"]).column("key").to_pylist() == rows.column("key").to_pylist()
        assert ds.keys() == rows.column("key").to_pylist()
        parts = rows.column("partition").to_pylist()
        assert parts == sorted(parts)


def test_keys_out_of_the_cached_columns_order_are_refused(
    root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keys read beside cached row columns are checked against their partition order: a
    copy that disagrees is an IntegrityError, not a mislabelled batch."""
    from shardlake.errors import IntegrityError
    from shardlake.query.dataset import Dataset

    monkeypatch.setenv("SHARDLAKE_CATALOG_CACHE", str(tmp_path / "cache"))
    check_labels(root, "based", "threads", 0)  # cold: the columns are cached
    real = Dataset.manifests

    def reversed_partitions(self: Dataset, columns: Any = None, pids: Any = None) -> Any:
        table = real(self, columns, pids)
        if columns is not None and list(columns) == ["key", "partition"]:
            return table.take(list(range(table.num_rows))[::-1])
        return table

    monkeypatch.setattr(Dataset, "manifests", reversed_partitions)
    with pytest.raises(IntegrityError, match="do not come in the order of its cached row"):
        check_labels(root, "based", "threads", 0)
