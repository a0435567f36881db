"""PyTorch loading: ``ShardDataset`` (one source or a weighted mix of ``Source``s), its
resumable DDP loader, exact evaluation helpers and the mixing report.

Importing ``shardlake`` never imports torch; importing ``shardlake.torch`` does.
"""

from ..read.options import ReadOptions
from .dataset import INDEX_KEY, VALID_KEY, ShardDataset, train_valid
from .ddp import masked_mean, masked_sum
from .loader import ShardLoader
from .mixing import MixingReport, batch_mixing, js_distance, plan_mixing
from .options import LoaderOptions
from .plan import Cursor, Layout, Leg, LegPlan, PlanParams, Rows, plan_epoch, plan_leg
from .sources import Source

__all__ = [
    "INDEX_KEY",
    "VALID_KEY",
    "Cursor",
    "Layout",
    "Leg",
    "LegPlan",
    "LoaderOptions",
    "MixingReport",
    "PlanParams",
    "ReadOptions",
    "Rows",
    "ShardDataset",
    "ShardLoader",
    "Source",
    "batch_mixing",
    "js_distance",
    "masked_mean",
    "masked_sum",
    "plan_epoch",
    "plan_leg",
    "plan_mixing",
    "train_valid",
]
