"""The checkpoint recipe of docs/getting-started.md §5 and docs/loader.md: ``torch.save`` of
``loader.state_dict()`` and ``loader.run_record()`` loads back with a plain ``torch.load(path)``
(torch's default ``weights_only=True``), and the loaded state resumes the loader."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import shardlake
from shardlake.torch import MixMember, ShardDataset

pytestmark = pytest.mark.timeout(120)

PLAIN = (str, int, float, bool, type(None), torch.Tensor)


def assert_plain(value: Any, where: str = "") -> None:
    """Only str, int, float, bool, None, lists, dicts (str keys) and tensors, exactly."""
    if isinstance(value, dict):
        assert type(value) is dict, where
        for key, item in value.items():
            assert type(key) is str, f"{where}: key {key!r}"
            assert_plain(item, f"{where}.{key}")
    elif isinstance(value, list):
        assert type(value) is list, where
        for i, item in enumerate(value):
            assert_plain(item, f"{where}[{i}]")
    else:
        assert type(value) in PLAIN or isinstance(value, torch.Tensor), (
            f"{where}: {type(value).__name__} {value!r}"
        )


@pytest.fixture(scope="module")
def root(packed_root: Callable[..., tuple[Path, Path]]) -> Path:
    return packed_root([6, 10], name="ckpt")[1]


def test_getting_started_checkpoint_loads_with_plain_torch_load(root: Path, tmp_path: Path) -> None:
    shardlake.open(str(root)).keysets.create("train", where="key IS NOT NULL")
    model = torch.nn.Linear(3, 1)
    ds = ShardDataset(str(root), version="v1", keyset="train", batch_size=4, seed=0, num_workers=1)
    loader = ds.loader()
    path = tmp_path / "ckpt.pt"
    for epoch in range(1):
        loader.set_epoch(epoch)
        for step, _batch in enumerate(loader):
            if step == 1:
                break
        # Exactly the line of getting-started §5.
        torch.save(
            {
                "model": model.state_dict(),
                "loader": loader.state_dict(),
                "data": loader.run_record(),
            },
            path,
        )
    ckpt = torch.load(path)  # torch's defaults: weights_only
    assert ckpt["data"] == loader.run_record() and ckpt["loader"] == loader.state_dict()
    assert type(ckpt["data"]["torch_version"]) is str
    assert_plain(ckpt["data"], "run_record")
    assert_plain(ckpt["loader"], "state_dict")
    resumed = ShardDataset(
        str(root), version="v1", keyset="train", batch_size=4, seed=0, num_workers=1
    ).loader()
    resumed.load_state_dict(ckpt["loader"])
    assert resumed.state_dict() == loader.state_dict()


def test_loader_md_checkpoint_and_dataset_state_load_back(root: Path, tmp_path: Path) -> None:
    ds = ShardDataset.mix(
        [
            MixMember(str(root), where="key LIKE '%0%'", weight=0.7),
            MixMember(str(root), weight=0.3),
        ],
        batch_size=4,
        seed=0,
        num_workers=0,
    )
    loader = ds.loader()
    # Exactly the line of docs/loader.md.
    torch.save({"data": loader.state_dict(), "run": loader.run_record()}, tmp_path / "ckpt.pt")
    ckpt = torch.load(tmp_path / "ckpt.pt")
    assert ckpt == {"data": loader.state_dict(), "run": loader.run_record()}
    assert_plain(ckpt, "loader.md checkpoint")
    # The per-worker dataset state (StatefulDataLoader saves it the same way).
    torch.save(ds.state_dict(), tmp_path / "ds.pt")
    state = torch.load(tmp_path / "ds.pt")
    assert state == ds.state_dict()
    assert_plain(state, "dataset state_dict")
