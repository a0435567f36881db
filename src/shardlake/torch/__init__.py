"""PyTorch loading: ``ShardDataset`` (one root or a weighted mix of ``MixMember``s), its
resumable DDP loader, exact evaluation helpers and the mixing report.

Importing ``shardlake`` never imports torch; importing ``shardlake.torch`` does.
"""

from ..read.options import ReadOptions
from .batches import INDEX_KEY, VALID_KEY
from .checkpoint import ResumedOnSuccessorWarning
from .dataset import ShardDataset
from .ddp import masked_mean, masked_sum, pop_valid, valid_rows
from .loader import ShardLoader
from .mixing import MixingReport, batch_mixing, js_distance, plan_mixing
from .options import LoaderOptions
from .sources import MixMember
from .splits import train_valid

__all__ = [
    "INDEX_KEY",
    "VALID_KEY",
    "LoaderOptions",
    "MixMember",
    "MixingReport",
    "ReadOptions",
    "ResumedOnSuccessorWarning",
    "ShardDataset",
    "ShardLoader",
    "batch_mixing",
    "js_distance",
    "masked_mean",
    "masked_sum",
    "plan_mixing",
    "pop_valid",
    "train_valid",
    "valid_rows",
]


# The plan's internals, exported here before: importable from ``shardlake.torch`` for one
# release with a DeprecationWarning (their home is ``torch.plan`` / ``torch.plan_types``).
_PLAN_INTERNALS = {
    "Cursor": "plan_types",
    "Layout": "plan_types",
    "Leg": "plan_types",
    "LegPlan": "plan_types",
    "PlanParams": "plan_types",
    "Rows": "plan_types",
    "plan_epoch": "plan",
    "plan_leg": "plan",
}


def __getattr__(name: str) -> object:
    import importlib
    import warnings

    if name == "Source":  # the old name of MixMember (not pack's source tree), for one release
        warnings.warn(
            "shardlake.torch.Source is deprecated: use shardlake.torch.MixMember",
            DeprecationWarning,
            stacklevel=2,
        )
        return MixMember
    module = _PLAN_INTERNALS.get(name)
    if module is not None:
        warnings.warn(
            f"shardlake.torch.{name} is the loader plan's internal and leaves shardlake.torch: "
            f"import it from shardlake.torch.{module}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(f"{__name__}.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
