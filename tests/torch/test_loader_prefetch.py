"""The next epoch's prefetch (thread engine): started during a pass's tail, taken over by the
next pass only where it starts, never changing a batch, and never leaving a thread behind."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.torch import assert_batch_equal

import shardlake
from shardlake.torch import ShardDataset, ShardLoader

pytestmark = pytest.mark.timeout(240)

COUNTS = [3, 40, 25, 12]  # 80 samples: 20 steps of 4 on one rank, 2 slots


@pytest.fixture(scope="module")
def root(packed_root: Callable[..., tuple[Path, Path]]) -> Path:
    return packed_root(COUNTS, name="prefetch")[1]


def open_loader(root: Path, engine: str = "threads", **loader: Any) -> ShardLoader:
    ds = (
        shardlake.open(str(root))
        .dataset()
        .to_torch(batch_size=4, num_workers=2, seed=3, engine=engine, include_index=True)
    )
    assert isinstance(ds, ShardDataset)
    return ds.loader(**loader)


def feeders() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "shardlake-feed"]


def shardlake_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("shardlake-")]


def wait_for(check: Callable[[], bool]) -> bool:
    for _ in range(100):
        if check():
            return True
        time.sleep(0.05)
    return check()


def run(loader: ShardLoader, script: list[int | None]) -> Iterator[list[dict[str, Any]]]:
    """One pass per entry: ``set_epoch(e)`` first, or none (``None``: the loader moves on);
    ``len(loader)`` before each, as a progress bar asks (it shares a prefetch's plan)."""
    for epoch in script:
        if epoch is not None:
            loader.set_epoch(epoch)
        steps = len(loader)
        batches = list(loader)
        assert len(batches) == steps
        yield batches


def assert_same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert_batch_equal(x, y)


# Sequential epochs (set_epoch and moving on), a jump, a step back, the same epoch twice.
SCRIPT: list[int | None] = [0, 1, None, 7, None, 3, 3]


def test_prefetch_changes_no_batch_on_either_engine(root: Path) -> None:
    off = list(run(open_loader(root, prefetch_next_epoch=False), SCRIPT))
    on_loader = open_loader(root)
    on = []
    for epoch, batches in zip(SCRIPT, run(on_loader, SCRIPT), strict=True):
        on.append(batches)
        # The pass ended: the next epoch's pass is already running (its feeder waits for room).
        assert feeders(), f"no prefetch after the pass of epoch {epoch}"
    for a, b in zip(on, off, strict=True):
        assert_same(a, b)
    assert [int(b[0]["__index__"][0]) for b in on] != [int(on[0][0]["__index__"][0])] * len(on)
    on_loader.close()
    # The process engine (no prefetch) yields the same batches.
    processes = list(run(open_loader(root, engine="processes"), SCRIPT[:3]))
    for a, b in zip(on, processes, strict=False):
        assert_same(a, b)


def test_prefetch_with_a_transform_builds_after_the_loop_moves_on(root: Path) -> None:
    """A transform may read what the training loop sets between epochs: a prefetch reads ahead
    but builds nothing before the next pass starts."""
    now = {"epoch": -1}

    def tag(sample: dict[str, Any]) -> dict[str, Any]:
        return {"x": sample["ego_current_state"], "epoch": now["epoch"]}

    def passes(**loader: Any) -> list[list[dict[str, Any]]]:
        ds = ShardDataset(str(root), batch_size=4, num_workers=2, seed=3, transform=tag)
        dl = ds.loader(**loader)
        out = []
        for epoch in (0, 1, 2):
            dl.set_epoch(epoch)
            now["epoch"] = epoch
            out.append(list(dl))
            time.sleep(0.2)  # room for a prefetch to build, were it allowed to
        dl.close()
        return out

    on, off = passes(), passes(prefetch_next_epoch=False)
    for epoch, (a, b) in enumerate(zip(on, off, strict=True)):
        assert all(batch["epoch"].tolist() == [epoch] * 4 for batch in a)
        assert_same(a, b)


def test_resume_at_the_epoch_boundary(root: Path) -> None:
    reference = list(run(open_loader(root, prefetch_next_epoch=False), [0, 1, 2]))
    steps = len(reference[0])

    # Saved after the last step of epoch 0 (the prefetch of epoch 1 running), restored into a
    # fresh loader and into the same one.
    a = open_loader(root)
    assert_same(list(a), reference[0])
    state = a.state_dict()
    assert (state["epoch"], state["step"]) == (1, 0)
    b = open_loader(root)
    b.load_state_dict(state)
    assert_same(list(b), reference[1])
    a.load_state_dict(state)  # where the prefetch starts: it is kept and taken
    assert feeders()
    assert_same(list(a), reference[1])
    a.set_epoch(2)
    assert_same(list(a), reference[2])
    a.close()
    b.close()

    # Saved in the tail of epoch 1 (its last batch not yet taken; the prefetch started and was
    # dropped when the loop left early); then a state of another epoch drops a prefetch.
    c = open_loader(root)
    c.set_epoch(1)
    got = []
    for batch in c:
        got.append(batch)
        if len(got) == steps - 1:
            tail = c.state_dict()
            break
    assert tail["step"] == steps - 1
    assert wait_for(lambda: not feeders())  # leaving the loop stopped the prefetch too
    d = open_loader(root)
    d.load_state_dict(tail)
    rest = list(d)
    assert_same(got + rest, reference[1])
    assert_same(list(d), reference[2])  # and on into the next epoch, prefetched
    d.load_state_dict(tail)  # another position: the prefetch of epoch 3 is dropped
    assert wait_for(lambda: len(feeders()) == 0)
    assert_same(list(d), reference[1][-1:])
    d.close()


def test_no_thread_outlives_the_loader(root: Path) -> None:
    # Threads of earlier tests in this process (obstore's event loop lives as long as the
    # process) are not this loader's.
    before = set(shardlake_threads())

    def ours() -> list[threading.Thread]:
        return [t for t in shardlake_threads() if t not in before]

    loader = open_loader(root)
    for _ in run(loader, [0, 1]):
        pass
    assert [t for t in feeders() if t not in before]  # epoch 2's prefetch
    loader.close()
    assert not ours()
    assert len(list(loader)) == 20  # still usable after close
    del loader
    gc.collect()
    assert wait_for(lambda: not ours()), ours()
    # A training that breaks off inside the tail leaves nothing running either.
    loader = open_loader(root)
    for i, _ in enumerate(loader):
        if i == 18:
            break
    assert wait_for(lambda: not ours()), ours()
    assert np.isfinite(len(loader))


class Outage:
    """A store layer: payload reads beyond the first ``allow`` fail (access denied: never
    retried) until ``allow`` is None again."""

    def __init__(self) -> None:
        self.allow: int | None = None
        self.reads = 0

    def __call__(self, request: Any, send: Callable[[], Any]) -> Any:
        if request.op.startswith("read_range"):
            self.reads += 1
            if self.allow is not None and self.reads > self.allow:
                raise PermissionError(13, f"outage: {request.key}")
        return send()


def test_a_prefetch_that_failed_is_read_again(root: Path) -> None:
    """An outage during the tail fails the prefetch, not the next epoch: its pass runs again."""
    reference = list(run(open_loader(root, prefetch_next_epoch=False), [0, 1]))
    outage = Outage()
    store = shardlake.open_store(str(root)).with_layers(outage)

    def loader(**options: Any) -> ShardLoader:
        ds = ShardDataset(store, batch_size=4, num_workers=2, seed=3, include_index=True)
        outage.reads = 0
        return ds.loader(**options)

    assert_same(list(loader(prefetch_next_epoch=False)), reference[0])
    outage.allow = outage.reads  # the reads of epoch 0 pass, the prefetch's fail
    on = loader()
    assert_same(list(on), reference[0])
    assert wait_for(lambda: not feeders())  # the prefetch met the outage and stopped
    assert outage.reads > outage.allow
    outage.allow = None  # over before epoch 1 starts
    assert_same(list(on), reference[1])
    on.close()


def test_each_epoch_is_planned_once(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prefetch's plan is the one the next pass and ``len(loader)`` use: no epoch is
    planned twice."""
    planned: list[int] = []
    real = ShardDataset._rank_plan

    def counted(self: ShardDataset, layout: Any, cursor: Any, mine: Any) -> Any:
        planned.append(cursor.epoch)
        return real(self, layout, cursor, mine)

    monkeypatch.setattr(ShardDataset, "_rank_plan", counted)
    loader = open_loader(root)
    for _ in run(loader, [0, None, None]):
        pass
    loader.close()
    assert sorted(planned) == [0, 1, 2, 3]  # 3: the last prefetch, which nobody took
