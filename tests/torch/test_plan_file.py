"""A rank's plan mapped from the node-local plan file: its dtypes come from the file's
recorded bounds, so no array of the plan is scanned (a scan paged every slot into the rank)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from shardlake.torch.compact import compact_plan, plan_arrays, plan_from_arrays
from shardlake.torch.plan import plan_epoch
from shardlake.torch.plan_types import Layout, PlanParams, Rows, resolve


class Unscanned(np.ndarray):  # type: ignore[type-arg]
    """An array whose every value must not be read (min/max refused)."""

    def min(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a plan array was scanned")

    def max(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a plan array was scanned")


def _plan(seed: int, n: int, layout: Layout) -> Any:
    rng = np.random.default_rng(seed)
    shard = np.sort(rng.integers(0, 7, n))
    rows = Rows(shard, np.arange(n, dtype=np.int64))
    params = PlanParams("v", "s", seed=seed, chunk_size=16, shape=3, max_pad_fraction=100.0)
    return resolve(plan_epoch(rows, params, 0, layout), None)


@pytest.mark.parametrize("seed", range(6))
def test_mapped_slots_equal_the_compact_plan_without_a_scan(seed: int) -> None:
    layout = Layout(2, seed % 3, 4)
    plan = _plan(seed, 500 + 97 * seed, layout)
    doc, arrays = plan_arrays(plan)
    guarded = {name: a.view(Unscanned) for name, a in arrays.items()}
    slots = len(plan.slot_rows)
    for keep in (range(slots), range(0, 1), range(slots - 1, slots)):
        want = compact_plan(plan, keep=keep)
        got = plan_from_arrays(layout, doc, guarded, keep)
        for field in ("slot_rows", "slot_emit_chunk", "slot_chunk_ends"):
            for a, b in zip(getattr(want, field), getattr(got, field), strict=True):
                assert a.dtype == b.dtype and np.array_equal(a, b)
    old = {k: v for k, v in doc.items() if k != "slot_bounds"}  # a file written before
    with pytest.raises(AssertionError, match="scanned"):
        plan_from_arrays(layout, old, guarded, range(slots))
    assert plan_from_arrays(layout, old, arrays, range(slots)).steps == plan.steps
