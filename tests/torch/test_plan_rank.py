"""Plan shape 3: a rank's own slots planned alone equal those slots of the whole plan, touch only
the rows they read, and keep the epoch's guarantees (every row once, equal steps, resume with
another layout, exact padding)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from shardlake.torch.plan import plan_epoch, plan_leg
from shardlake.torch.plan_rank import Groups, plan_epoch3, plan_leg3, shard_groups
from shardlake.torch.plan_types import Layout, Leg, PlanParams, Rows

PARAMS = PlanParams(
    version_hash="v" * 32, selection_digest="s" * 32, seed=11, chunk_size=24, max_pad_fraction=99
)


def make_rows(sizes: list[int], shard_size: int = 50) -> Rows:
    shard, offset = [], []
    s = 0
    for size in sizes:
        for i in range(size):
            if i and i % shard_size == 0:
                s += 1
            shard.append(s)
            offset.append(i * 100)
        s += 1
    return Rows(np.array(shard, dtype=np.int64), np.array(offset, dtype=np.int64))


LAYOUTS = [Layout(1, 0, 8), Layout(2, 2, 8), Layout(3, 2, 5), Layout(4, 3, 16)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("sizes", [[1], [7], [230, 41, 99], [50] * 30])
def test_own_slots_equal_the_whole_plans(layout: Layout, sizes: list[int]) -> None:
    rows = make_rows(sizes)
    groups = shard_groups(rows)
    whole = plan_leg(rows, PARAMS, 3, layout)
    per = layout.slots_per_rank
    for rank in range(layout.world_size):
        mine = range(rank * per, (rank + 1) * per)
        own = plan_leg3(groups, PARAMS, 3, layout, n_all=len(rows), slots=mine)
        assert own.steps == whole.steps
        for s in range(layout.world_size * per):
            if s in mine:
                assert np.array_equal(own.slot_rows[s], whole.slot_rows[s])
                assert [c.tolist() for c in own.slot_chunks[s]] == [
                    c.tolist() for c in whole.slot_chunks[s]
                ]
            else:
                assert len(own.slot_rows[s]) == 0 and not own.slot_chunks[s]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_row_once_equal_steps_and_runs_in_one_shard(layout: Layout, drop_last: bool) -> None:
    rows = make_rows([230, 41, 99, 3, 180])
    params = PlanParams(**{**PARAMS.__dict__, "drop_last": drop_last, "max_pad_fraction": 1.0})
    plan = plan_leg(rows, params, 0, layout)
    n, per_step = len(rows), layout.global_batch
    assert plan.steps == (n // per_step if drop_last else -(-n // per_step))
    got = np.concatenate(plan.slot_rows)
    assert len(got) == plan.steps * per_step
    counts = np.bincount(got, minlength=n)
    if drop_last:
        assert counts.max() == 1 and counts.sum() == plan.steps * per_step
    else:
        assert counts.min() >= 1 and counts.sum() - n == plan.replays < per_step
    for r in range(layout.world_size):
        assert len(plan.rank_batches(r)) == plan.steps
    for chunks in plan.slot_chunks:
        for c in chunks:
            assert len(set(rows.shard[c].tolist())) == 1
            assert np.all(np.diff(rows.offset[c]) > 0)


def test_deterministic_and_another_order_every_epoch() -> None:
    rows = make_rows([400, 300])
    layout = Layout(2, 2, 8)
    a = plan_leg(rows, PARAMS, 0, layout)
    assert np.array_equal(
        np.concatenate(a.slot_rows), np.concatenate(plan_leg(rows, PARAMS, 0, layout).slot_rows)
    )
    b = plan_leg(rows, PARAMS, 1, layout)
    assert not np.array_equal(a.slot_rows[0], b.slot_rows[0])
    # Samples move between ranks from one epoch to the next.
    assert set(a.slot_rows[0].tolist()) != set(b.slot_rows[0].tolist())


@pytest.mark.parametrize(
    ("first", "second"),
    [(Layout(2, 2, 8), Layout(3, 1, 8)), (Layout(4, 2, 4), Layout(1, 2, 16))],
)
def test_resume_with_another_layout_is_one_epoch(first: Layout, second: Layout) -> None:
    rows = make_rows([230, 41, 99, 180])
    params = PlanParams(**{**PARAMS.__dict__, "exact": True})
    leg0 = plan_epoch(rows, params, 2, first)
    done = 3
    used = leg0.consumed(done)
    leg1 = plan_epoch(rows, params, 2, second, [Leg(first, done)])
    rest = np.concatenate(leg1.slot_rows)
    real = np.concatenate([used[used < len(rows)], rest[rest < len(rows)]])
    assert sorted(real.tolist()) == list(range(len(rows)))  # exact: every row exactly once
    per, last = second.slots_per_rank, second.world_size - 1
    own = plan_epoch3(
        shard_groups(rows),
        params,
        2,
        second,
        [Leg(first, done)],
        n_all=len(rows),
        slots=range(last * per, (last + 1) * per),
    )
    assert np.array_equal(own.slot_rows[last * per], leg1.slot_rows[last * per])


class _Recorder:
    """An ``order`` array that records which of its positions were read."""

    def __init__(self, values: np.ndarray[Any, Any]) -> None:
        self.values = values
        self.read: set[int] = set()

    def __getitem__(self, index: Any) -> Any:
        self.read.update(np.atleast_1d(np.arange(len(self.values))[index]).tolist())
        return self.values[index]


def test_a_rank_touches_only_the_rows_it_reads() -> None:
    # Rows out of shard order (a version with a base): the groups hold their order, and a
    # rank reads only its own stretch of it (plus the replays' rows).
    rows = make_rows([200] * 10)
    scramble = np.random.default_rng(0).permutation(len(rows))
    scrambled = Rows(rows.shard[scramble], rows.offset[scramble])
    groups = shard_groups(scrambled)
    assert groups.order is not None
    layout = Layout(4, 2, 16)
    recorder = _Recorder(groups.order)
    tracked = Groups(groups.n, groups.starts, recorder)  # type: ignore[arg-type]
    plan = plan_leg3(tracked, PARAMS, 0, layout, n_all=len(rows), slots=range(2, 4))
    mine = np.concatenate([plan.slot_rows[2], plan.slot_rows[3]])
    inverse = np.empty(len(rows), dtype=np.int64)
    inverse[groups.order] = np.arange(len(rows))
    assert recorder.read >= set(inverse[mine].tolist())
    assert len(recorder.read) <= len(mine) + plan.replays
    assert len(recorder.read) < len(rows) / 3


def test_unshuffled_shape_3_keeps_the_rows_order() -> None:
    rows = make_rows([30, 20])
    params = PlanParams(**{**PARAMS.__dict__, "shuffle": False, "max_pad_fraction": 1.0})
    plan = plan_leg(rows, params, 0, Layout(1, 1, 10))
    assert np.concatenate(plan.slot_rows)[: len(rows)].tolist() == list(range(len(rows)))
