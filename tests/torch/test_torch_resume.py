"""Resume through the conventions users already have: torchdata's ``StatefulDataLoader`` and
torch.distributed.checkpoint (DCP) ``Stateful`` objects."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.stateful import Stateful
from torchdata.stateful_dataloader import StatefulDataLoader

from shardlake.errors import PlanError
from shardlake.torch import ShardDataset

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("loader_engine")]

BATCH = 4


@pytest.fixture(scope="module")
def root(packed_root: Callable[..., tuple[Path, Path]]) -> str:
    return str(packed_root([9, 21], name="resume", seed=4)[1])


def dataset(root: str) -> ShardDataset:
    return ShardDataset(root, batch_size=BATCH, include_key=True, max_pad_fraction=0.5)


def sdl(ds: ShardDataset, workers: int) -> StatefulDataLoader:
    return StatefulDataLoader(ds, batch_size=BATCH, num_workers=workers)


def keys(batches: list[dict]) -> list[list[str]]:
    return [list(b["__key__"]) for b in batches]


def take(it: object, n: int) -> list[dict]:
    return [next(it) for _ in range(n)]  # type: ignore[call-overload]


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_twice_in_a_row(root: str, workers: int) -> None:
    ds = dataset(root)
    full = keys(list(sdl(ds, workers)))
    assert Counter(k for b in full for k in b).keys() == set(ds.table.keys)
    # Stop after 2 batches, resume, stop after 2 more, resume again: the same batches.
    loader = sdl(dataset(root), workers)
    got = keys(take(iter(loader), 2))
    state = loader.state_dict()
    second = sdl(dataset(root), workers)
    second.load_state_dict(state)
    got += keys(take(iter(second), 2))
    state = second.state_dict()
    third = sdl(dataset(root), workers)
    third.load_state_dict(state)
    got += keys(list(third))
    assert got == full


def test_stateful_dataloader_resume_at_the_epoch_boundary_starts_the_next_epoch(root: str) -> None:
    ds = dataset(root)
    loader = sdl(ds, 2)
    epoch0 = keys(list(loader))
    state = loader.state_dict()  # after the last batch of epoch 0
    ds1 = dataset(root)
    ds1.set_epoch(1)
    want = keys(list(sdl(ds1, 2)))
    fresh_ds = dataset(root)
    fresh = sdl(fresh_ds, 2)
    fresh.load_state_dict(state)
    fresh_ds.set_epoch(1)
    got = keys(list(fresh))
    assert got == want and got != epoch0  # nothing dropped, nothing repeated


def test_loader_resumes_at_boundaries_and_after_the_last_step(root: str) -> None:
    ds = dataset(root)
    loader = ds.loader(num_workers=2)
    assert isinstance(loader, Stateful)
    epochs = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        epochs.append(keys(list(loader)))
    # After the last step of the last epoch (inside the loop): nothing left of epoch 1 ...
    last = dataset(root).loader(num_workers=2)
    last.set_epoch(1)
    for n, _ in enumerate(last, 1):
        if n == len(epochs[1]):
            state = last.state_dict()
            break
    resumed = dataset(root).loader(num_workers=1)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)  # the usual loop calls set_epoch: it keeps the position
    assert list(resumed) == []
    # ... and the next pass is epoch 2, whole.
    assert resumed.epoch == 2
    want = dataset(root).loader(num_workers=1)
    want.set_epoch(2)
    assert keys(list(resumed)) == keys(list(want))


def test_dcp_round_trip(root: str, tmp_path: Path) -> None:
    loader = dataset(root).loader(num_workers=0)
    it = iter(loader)
    done = keys(take(it, 3))
    dcp.save({"loader": loader}, checkpoint_id=str(tmp_path / "ckpt"))
    rest_want = keys(list(it))
    fresh = dataset(root).loader(num_workers=0)
    state = {"loader": fresh}
    dcp.load(state, checkpoint_id=str(tmp_path / "ckpt"))
    rest = keys(list(fresh))
    assert rest == rest_want
    assert sorted(k for b in done + rest for k in b) == sorted(
        k for b in keys(list(dataset(root).loader(num_workers=0))) for k in b
    )


@pytest.mark.parametrize("shape", [1, 2])
def test_a_state_of_an_older_plan_shape_resumes_that_plan(root: str, shape: int) -> None:
    # A state saved before plan shape 2 names no shape (1); one saved before shape 3 names 2:
    # either resumes exactly the batches it had, then the epoch ends as it would have.
    old = dataset(root)
    old.adopt_plan_shape({} if shape == 1 else {"plan_shape": 2})
    assert old.params.shape == shape
    full = keys(list(old.loader(num_workers=0)))
    assert full != keys(list(dataset(root).loader(num_workers=0)))  # shape 3 plans another
    loader = old.loader(num_workers=0)
    got = keys(take(iter(loader), 2))
    state = loader.state_dict()
    assert state["plan_shape"] == shape
    if shape == 1:
        del state["plan_shape"]
    fresh = dataset(root)
    assert fresh.params.shape == 3
    resumed = fresh.loader(num_workers=0)
    resumed.load_state_dict(state)
    assert fresh.params.shape == shape
    assert got + keys(list(resumed)) == full
    # ... and a state of the default shape resumes shape 3; an unknown shape is refused.
    again = dataset(root).loader(num_workers=0)
    again.load_state_dict({**state, "plan_shape": 3})
    assert again.ds.params.shape == 3
    with pytest.raises(PlanError, match="plan shape 4"):
        dataset(root).loader(num_workers=0).load_state_dict({**state, "plan_shape": 4})


def test_a_state_saved_on_one_engine_resumes_on_the_other(root: str, loader_engine: str) -> None:
    other = "processes" if loader_engine == "threads" else "threads"
    full = keys(list(dataset(root).loader(num_workers=2)))
    loader = dataset(root).loader(num_workers=2)
    first = keys(take(iter(loader), 3))
    state = loader.state_dict()
    resumed = ShardDataset(
        root, batch_size=BATCH, include_key=True, max_pad_fraction=0.5, engine=other
    ).loader(num_workers=2)
    resumed.load_state_dict(state)
    assert resumed.engine == other
    assert first + keys(list(resumed)) == full
