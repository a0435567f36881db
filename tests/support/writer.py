"""Samples, npz trees and checks shared by the writer, write_bag and import-wds tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

import shardlake
from shardlake.testing import npz_bytes

Sample = tuple[str, dict[str, np.ndarray[Any, Any]], dict[str, Any]]


def make_samples(partitions: int = 3, per_partition: int = 6, seed: int = 0) -> list[Sample]:
    """``(key, arrays, meta)`` records: numeric arrays of several dtypes and shapes."""
    rng = np.random.default_rng(seed)
    out: list[Sample] = []
    for p in range(partitions):
        for i in range(per_partition):
            arrays = {
                "ego": rng.normal(size=(4, 3)).astype(np.float32),
                "lanes": rng.integers(0, 255, size=(int(rng.integers(1, 6)), 2)).astype(np.uint8),
                "speed": np.float64(rng.normal()).reshape(()),
                "ids": rng.integers(-5, 5, size=(3,)).astype(np.int32),
            }
            meta = {"index": i, "scene": {"weather": ["sun", "rain"][i % 2]}, "is_skipped": False}
            out.append((f"log{p}/{i:06d}", arrays, meta))
    return out


def write_npz_tree(source: Path, samples: list[Sample]) -> None:
    """The same samples as pack's input: canonical npz files plus JSON sidecars."""
    for key, arrays, meta in samples:
        path = source / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_name(path.name + ".npz").write_bytes(npz_bytes(arrays, compress=False))
        path.with_name(path.name + ".json").write_text(json.dumps(meta))


def revisions(root: shardlake.Root, tag: str) -> dict[str, tuple[str, str, list[str]]]:
    """partition path -> (data_rev, meta_rev, shard keys) of a version."""
    entries = root.dataset(tag).version.entries
    return {e.path: (e.data_rev, e.meta_rev, [s.key for s in e.shards]) for e in entries}


def assert_same_arrays(got: dict[str, Any], want: dict[str, np.ndarray[Any, Any]]) -> None:
    assert list(got) == list(want)
    for name, array in want.items():
        value = np.asarray(got[name])
        assert value.dtype == array.dtype and value.shape == array.shape, name
        assert value.tobytes() == array.tobytes(), name


def assert_loads_bit_exact(
    url: str, tag: str, samples: list[Sample], storage_options: dict[str, Any] | None = None
) -> None:
    """Every sample through the loader (ShardDataset) equals its arrays, byte for byte."""
    import torch

    from shardlake.torch import ShardDataset

    want = {key: arrays for key, arrays, _ in samples}
    ds = ShardDataset(
        url,
        tag,
        batch_size=1,
        num_workers=0,
        include_key=True,
        storage_options=storage_options,
    )
    seen = set()
    for sample in ds:
        key = sample["__key__"]
        seen.add(key)
        for name, array in want[key].items():
            tensor = sample[name]
            assert isinstance(tensor, torch.Tensor)
            assert tensor.numpy().tobytes() == array.tobytes(), (key, name)
            assert tuple(tensor.shape) == array.shape
    assert seen == set(want)


_FAILED_ONCE: set[str] = set()  # per process: a task's layer is unpickled afresh each time


class FailFirstManifest:
    """A store layer: the first create of each manifest in a process fails (a reset
    connection), so that a build task fails once and Dask has to retry it."""

    def __call__(self, request: Any, send: Any) -> Any:
        key = request.key
        if request.op == "create" and "/manifest-" in key and key not in _FAILED_ONCE:
            _FAILED_ONCE.add(key)
            raise ConnectionResetError(104, f"injected: first create of {key}")
        return send()
