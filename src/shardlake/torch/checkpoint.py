"""What the loader saves next to a checkpoint, as values a plain ``torch.load`` (``weights_only``)
reads back.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..errors import PlanError, VersionRedactedError
from ..read.receipts import find_redaction
from ..store import Store
from .plan_types import PLAN_SHAPES

__all__ = [
    "ResumedOnSuccessorWarning",
    "check_state",
    "plain",
    "saved_plan_shape",
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


class ResumedOnSuccessorWarning(UserWarning):
    """A loader state saved on a version ``forget`` redacted is resumed on its successor."""


def check_state(store: Store | None, state: Mapping[str, Any], mine: Mapping[str, Any]) -> None:
    """Refuse a loader state saved for another version, selection or seed (``mine``: this
    loader's ``version_hash``, ``selection_digest`` and ``seed``). A state saved on a version a
    forget redacted continues on its successor (this loader's version): the epoch and step
    carry over, the forgotten samples are not in it (docs/loader.md, "Resume")."""
    saved = state.get("version_hash")
    if saved != mine["version_hash"] and store is not None:
        redaction = find_redaction(store, str(saved))
        if redaction is not None and redaction.new == mine["version_hash"]:
            if state.get("seed") == mine["seed"]:
                warnings.warn(
                    f"resuming on {redaction.tag}@{redaction.new}: {redaction.describe()}",
                    ResumedOnSuccessorWarning,
                    stacklevel=4,
                )
                return
        elif redaction is not None:
            raise VersionRedactedError(
                f"loader state was saved on a redacted version: {redaction.describe()}; "
                f"open the loader on {redaction.tag} to continue",
                forget_id=redaction.forget_id,
                successor=f"{redaction.tag}@{redaction.new}",
            )
    for name, value in mine.items():
        if state.get(name) != value:
            raise PlanError(
                f"loader state was saved with {name} {state.get(name)!r}, this loader has "
                f"{value!r}; resume with the same version, selection and seed"
            )


def saved_plan_shape(state: Mapping[str, Any]) -> int:
    """The plan shape a loader state was saved with: 1 when it names none (states saved before
    shape 2), so that it resumes exactly the batches it would have had."""
    shape = int(state.get("plan_shape", 1))
    if shape not in PLAN_SHAPES:
        raise PlanError(
            f"loader state was saved with plan shape {shape}; this shardlake knows "
            f"{', '.join(map(str, PLAN_SHAPES))}"
        )
    return shape
