"""What the loader saves next to a checkpoint, as values a plain ``torch.load`` (``weights_only``)
reads back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = [
    "plain",
]


def plain(value: Any) -> Any:
    """``value`` as str, int, float, bool, None, lists and dicts (tensors kept), so that a
    plain ``torch.load`` (``weights_only``) reads back what ``torch.save`` wrote
    (``torch.__version__`` is a ``TorchVersion``; numpy scalars and tuples creep in)."""
    if isinstance(value, torch.Tensor) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, str):
        return str(value)
    raise TypeError(f"{type(value).__name__} {value!r} is not a plain checkpoint value")
