"""Issue #47: the faster slot order (stable sort of int32 ticks instead of ``lexsort``, fewer
and smaller temporaries) gives every plan array bit for bit as the form it replaced
(tests/support/plan_reference.py): saved states resume these plans, so no order may move."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from tests.support.plan_reference import shard_groups as reference_shard_groups
from tests.support.plan_reference import slot_order as reference_slot_order

import shardlake.torch.plan as plan_module
import shardlake.torch.plan_rank as plan_rank_module
from shardlake.torch.plan import plan_epoch
from shardlake.torch.plan_rank import plan_epoch3, shard_groups
from shardlake.torch.plan_steps import _slot_order
from shardlake.torch.plan_types import Layout, Leg, LegPlan, PlanParams, Rows

PARAMS = PlanParams(version_hash="v" * 32, selection_digest="s" * 32, max_pad_fraction=99)


def same(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(a, b)


@pytest.mark.parametrize("shape", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [True, False])
def test_slot_order_equals_the_reference(shape: int, shuffle: bool) -> None:
    draw = np.random.default_rng(shape)
    for case in range(120):
        chunks = int(draw.integers(0, 60))
        lengths = draw.integers(0 if case % 7 == 0 else 1, draw.integers(2, 90), chunks)
        ids = draw.permutation(int(lengths.sum()) + 5)[: int(lengths.sum())].astype(np.int64)
        segment = np.split(ids, np.cumsum(lengths)[:-1]) if chunks else []
        params = replace(
            PARAMS,
            shape=shape,
            interleave=int(draw.integers(1, 40)),
            shuffle_buffer=int(draw.choice([1, 7, 64, 65, 100, 512, 3000])),
        )
        seed = int(draw.integers(0, 2**32))
        rngs = [np.random.default_rng(seed) if shuffle else None for _ in range(4)]
        want = reference_slot_order(segment, params, rngs[0])
        lean = _slot_order(segment, params, rngs[3], reads=False)
        same(lean[0], want[0])
        same(lean[3], want[3])
        assert len(lean[1]) == len(lean[2]) == 0
        for got, rng in (
            (_slot_order(segment, params, rngs[1]), rngs[1]),
            (_slot_order(segment, params, rngs[2], ids if chunks else None), rngs[2]),
        ):
            for a, b in zip(got, want, strict=True):
                same(a, b)
            if rng is not None:  # the same draws: the generators are left in one state
                assert rng.random() == np.random.default_rng(seed).random(len(ids) + 1)[-1]


def make_rows(draw: np.random.Generator, n: int) -> Rows:
    shard = np.sort(draw.integers(0, max(1, n // 40), n))
    offset = draw.integers(0, 10**6, n)
    if draw.random() < 0.5:  # rows out of (shard, offset) order too
        shuffle = draw.permutation(n)
        shard, offset = shard[shuffle], offset[shuffle]
    return Rows(shard.astype(np.int64), offset.astype(np.int64))


def plans(
    monkeypatch: pytest.MonkeyPatch,
    rows: Rows,
    params: PlanParams,
    epoch: int,
    layout: Layout,
    legs: tuple[Leg, ...],
) -> tuple[LegPlan, LegPlan]:
    got = plan_epoch(rows, params, epoch, layout, legs)
    with monkeypatch.context() as m:

        def old(seg: list[Any], p: PlanParams, rng: Any, ids: Any = None, **_: Any) -> Any:
            return reference_slot_order(seg, p, rng)

        m.setattr(plan_module, "_slot_order", old)
        m.setattr(plan_rank_module, "_slot_order", old)
        want = plan_epoch(rows, params, epoch, layout, legs)
    return got, want


def assert_same_plan(got: LegPlan, want: LegPlan) -> None:
    assert (got.layout, got.steps, got.samples, got.replays, got.pad_base) == (
        want.layout,
        want.steps,
        want.samples,
        want.replays,
        want.pad_base,
    )
    if want.pad_rows is None:
        assert got.pad_rows is None
    else:
        assert got.pad_rows is not None
        same(got.pad_rows, want.pad_rows)
    for field in ("slot_rows", "slot_read", "slot_read_pos", "slot_emit_chunk"):
        a, b = getattr(got, field), getattr(want, field)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    assert len(got.slot_chunks) == len(want.slot_chunks)
    for x, y in zip(got.slot_chunks, want.slot_chunks, strict=True):
        assert len(x) == len(y)
        for c, d in zip(x, y, strict=True):
            same(c, d)


@pytest.mark.filterwarnings("ignore:.*replaying samples")
@pytest.mark.parametrize("shape", [1, 2, 3])
def test_plans_equal_the_reference(monkeypatch: pytest.MonkeyPatch, shape: int) -> None:
    """Every array of whole plans, shuffled or not, exact, drop_last, world sizes 1-16,
    workers 0-4, and resumed legs with another layout."""
    draw = np.random.default_rng(100 + shape)
    for case in range(40):
        n = int(draw.choice([1, 5, 37, 300, 1000, 2500]))
        rows = make_rows(draw, n)
        params = replace(
            PARAMS,
            shape=shape,
            seed=int(draw.integers(0, 1000)),
            shuffle=case % 5 != 4,
            exact=bool(draw.random() < 0.3),
            drop_last=bool(draw.random() < 0.3),
            chunk_size=int(draw.choice([4, 16, 24, 512])),
            interleave=int(draw.choice([1, 3, 32])),
            shuffle_buffer=int(draw.choice([8, 64, 512])),
        )
        layout = Layout(
            int(draw.integers(1, 17)), int(draw.integers(0, 5)), int(draw.integers(1, 9))
        )
        legs: tuple[Leg, ...] = ()
        if case % 3 == 0:  # resumed after a leg with another layout
            first = Layout(int(draw.integers(1, 5)), int(draw.integers(0, 3)), 4)
            steps = plan_epoch(rows, params, 2, first).steps
            legs = (Leg(first, steps // 2),)
        got, want = plans(monkeypatch, rows, params, 2, layout, legs)
        assert_same_plan(got, want)


@pytest.mark.filterwarnings("ignore:.*replaying samples")
def test_rank_plans_without_reads_equal_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loader's plan of its own slots (``reads=False``, resumed legs too): the same rows,
    chunks and emit chunks as the old form's."""
    draw = np.random.default_rng(7)
    for case in range(30):
        rows = make_rows(draw, int(draw.choice([3, 300, 2500])))
        params = replace(
            PARAMS,
            seed=case,
            exact=bool(draw.random() < 0.3),
            drop_last=bool(draw.random() < 0.3),
            chunk_size=int(draw.choice([4, 24, 512])),
        )
        layout = Layout(
            int(draw.integers(1, 17)), int(draw.integers(0, 5)), int(draw.integers(1, 9))
        )
        legs: tuple[Leg, ...] = ()
        if case % 2:
            first = Layout(int(draw.integers(1, 5)), int(draw.integers(0, 3)), 4)
            legs = (Leg(first, plan_epoch(rows, params, 1, first).steps // 3),)
        per = layout.slots_per_rank
        rank = int(draw.integers(0, layout.world_size))
        mine = range(rank * per, (rank + 1) * per)
        groups = shard_groups(rows)
        got = plan_epoch3(groups, params, 1, layout, legs, n_all=len(rows), slots=mine, reads=False)
        _, want = plans(monkeypatch, rows, params, 1, layout, legs)
        assert (got.steps, got.samples, got.replays, got.pad_base) == (
            want.steps,
            want.samples,
            want.replays,
            want.pad_base,
        )
        for s in mine:
            same(got.slot_rows[s], want.slot_rows[s])
            same(got.slot_emit_chunk[s], want.slot_emit_chunk[s])
            assert len(got.slot_read[s]) == len(got.slot_read_pos[s]) == 0
            assert len(got.slot_chunks[s]) == len(want.slot_chunks[s])
            for c, d in zip(got.slot_chunks[s], want.slot_chunks[s], strict=True):
                same(c, d)


@pytest.mark.parametrize("block", [1, 2, 3, 64, 1 << 20])
def test_shard_groups_equal_the_reference(monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    """The blockwise in-order check finds the same groups, over block boundaries too."""
    monkeypatch.setattr(plan_rank_module, "_BLOCK", block)
    draw = np.random.default_rng(block)
    for case in range(60):
        n = int(draw.integers(0, 300))
        shard = np.sort(draw.integers(0, max(1, n // int(draw.integers(1, 20))), n))
        offset = np.zeros(n, dtype=np.int64)
        for s in np.unique(shard):  # ascending offsets within each shard
            at = shard == s
            offset[at] = np.sort(draw.integers(0, 10**6, int(at.sum())))
        if case % 3 == 1 and n > 1:  # one pair out of order
            i = int(draw.integers(1, n))
            offset[i], shard[i] = offset[i - 1] - 1, shard[i - 1]
        if case % 3 == 2:
            shuffle = draw.permutation(n)
            shard, offset = shard[shuffle], offset[shuffle]
        dtype = np.int32 if case % 2 else np.int64
        rows = Rows(shard.astype(dtype), offset.astype(dtype))
        got = shard_groups(rows)
        n_want, starts, order = reference_shard_groups(rows)
        assert got.n == n_want
        same(got.starts, starts)
        if order is None:
            assert got.order is None
        else:
            assert got.order is not None
            same(got.order, order)
