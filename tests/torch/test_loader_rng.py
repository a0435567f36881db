"""The loader consumes torch's global random generator exactly as the recipe it replaces (a
``DataLoader`` with a ``DistributedSampler``): one draw per epoch, at ``iter()``, whichever
engine builds the batches. Dropout masks and augmentations then see the same stream, and a run
moved from that recipe to shardlake can show "nothing changed"."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from shardlake.torch import ShardDataset

pytestmark = pytest.mark.timeout(180)

SAMPLES = 24


@pytest.fixture(scope="module")
def root(packed_root: Callable[..., tuple[Path, Path]]) -> Path:
    return packed_root([10, 14], name="rng")[1]


def _recipe_stream(workers: int, epochs: int) -> torch.Tensor:
    """``torch.rand(3)`` after ``epochs`` epochs of the recipe shardlake replaces."""
    torch.manual_seed(1234)
    data = list(range(SAMPLES))
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=4, sampler=sampler, num_workers=workers)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for _ in loader:
            pass
    return torch.rand(3)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("engine", ["threads", "processes"])
def test_two_epochs_leave_the_global_generator_where_a_dataloader_does(
    root: Path, engine: str, workers: int
) -> None:
    ds = ShardDataset(str(root), "v1", batch_size=4, num_workers=workers, engine=engine)
    loader = ds.loader()
    torch.manual_seed(1234)
    for epoch in range(2):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
    ours = torch.rand(3)
    assert torch.equal(ours, _recipe_stream(workers, 2)), engine


@pytest.mark.parametrize("engine", ["threads", "processes"])
def test_the_draw_happens_at_iter_like_a_dataloader(root: Path, engine: str) -> None:
    # A DataLoader draws when its iterator is made, before the first batch is asked for.
    ds = ShardDataset(str(root), "v1", batch_size=4, num_workers=0, engine=engine)
    torch.manual_seed(99)
    it = iter(ds.loader())
    ours = torch.rand(3)
    next(it)
    torch.manual_seed(99)
    iter(DataLoader(list(range(SAMPLES)), batch_size=4))
    assert torch.equal(ours, torch.rand(3))
