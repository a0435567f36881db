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
from .plan import plan_epoch, plan_leg
from .plan_types import Cursor, Layout, Leg, LegPlan, PlanParams, Rows
from .sources import MixMember
from .splits import train_valid

__all__ = [
    "INDEX_KEY",
    "VALID_KEY",
    "Cursor",
    "Layout",
    "Leg",
    "LegPlan",
    "LoaderOptions",
    "MixMember",
    "MixingReport",
    "PlanParams",
    "ReadOptions",
    "ResumedOnSuccessorWarning",
    "Rows",
    "ShardDataset",
    "ShardLoader",
    "batch_mixing",
    "js_distance",
    "masked_mean",
    "masked_sum",
    "plan_epoch",
    "plan_leg",
    "plan_mixing",
    "pop_valid",
    "train_valid",
    "valid_rows",
]


def __getattr__(name: str) -> object:
    if name == "Source":  # the old name of MixMember (not pack's source tree), for one release
        import warnings

        warnings.warn(
            "shardlake.torch.Source is deprecated: use shardlake.torch.MixMember",
            DeprecationWarning,
            stacklevel=2,
        )
        return MixMember
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
