"""Pack npz+sidecar source trees into verified, versioned shard datasets (see ``packer``)."""

from ..source.npz import load_npz
from ..source.tree import PartitionRule, discover, inspect_source, read_path_list
from .build import Recipe, build_partition
from .options import PackOptions
from .packer import InlineExecutor, PackReport, pack
from .revisions import verify_sample

__all__ = [
    "InlineExecutor",
    "PackOptions",
    "PackReport",
    "PartitionRule",
    "Recipe",
    "build_partition",
    "discover",
    "inspect_source",
    "load_npz",
    "pack",
    "read_path_list",
    "verify_sample",
]
