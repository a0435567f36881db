"""PyTorch loading: ``ShardDataset``, its resumable DDP loader, and the mixing report.

Importing ``shardlake`` never imports torch; importing ``shardlake.torch`` does.
"""

from .dataset import ShardDataset, ShardLoader, train_valid
from .mixing import MixingReport, batch_mixing, js_distance, plan_mixing
from .plan import Layout, Leg, LegPlan, PlanParams, Rows, plan_epoch, plan_leg
from .reader import ReadOptions

__all__ = [
    "Layout",
    "Leg",
    "LegPlan",
    "MixingReport",
    "PlanParams",
    "ReadOptions",
    "Rows",
    "ShardDataset",
    "ShardLoader",
    "batch_mixing",
    "js_distance",
    "plan_epoch",
    "plan_leg",
    "plan_mixing",
    "train_valid",
]
