"""What ranks agree on: rank/world discovery, the start-of-pass check, per-step error agreement,
and the reduction of masked (exact evaluation) metrics across ranks."""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.distributed as dist

from .. import errors as _errors
from ..errors import PlanError, ShardlakeError
from ..progress.bar import plural

__all__ = [
    "RankSync",
    "dist_info",
    "distributed",
    "masked_mean",
    "masked_sum",
    "pop_valid",
    "rank_and_world",
    "valid_rows",
]


def dist_info() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group, ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class RankSync:
    """The loader's collectives, on a gloo group (created on first use, by every rank)."""

    def __init__(self) -> None:
        self._group: weakref.ref[Any] | None = None

    def group(self) -> Any:
        # Held weakly: torch.distributed owns its groups, and destroy_process_group() must free
        # ours even while a loader lives. Freeing a gloo group joins its threads, which release
        # the collectives' tensors (taking the GIL) after the collective has returned; a thread
        # still alive when the interpreter finalizes dies taking the GIL and aborts the process
        # ("terminate called without an active exception").
        group = None if self._group is None else self._group()
        if group is None:
            # Our CPU flags need gloo; a NCCL default group gets a gloo side group.
            group = (
                dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
            )
            self._group = weakref.ref(group)
        return group

    def check_same(self, mine: Any) -> None:
        """Raise on every rank unless all ranks pass an equal ``mine``."""
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine, group=self.group())
        if any(g != gathered[0] for g in gathered):
            first = gathered[0]
            bad = [i for i, g in enumerate(gathered) if g != first]
            raise PlanError(
                f"ranks disagree on version/selection/cursor: rank 0 has {first}, ranks {bad} "
                f"differ (rank {bad[0]}: {gathered[bad[0]]}); every rank must open the same "
                "version and selection and load the same loader state"
            )

    def agree(self, error: BaseException | None, ended: bool) -> None:
        """All ranks learn whether any failed (or ran out early) and raise the same error."""
        group = self.group()
        flags = torch.tensor([1 if error is not None else 0, 1 if ended else 0], dtype=torch.int64)
        dist.all_reduce(flags, group=group)
        failed, ended_count = int(flags[0]), int(flags[1])
        world = dist.get_world_size()
        if failed:
            info = (type(error).__name__, str(error)) if error is not None else None
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, info, group=group)
            rank = next(i for i, g in enumerate(gathered) if g is not None)
            name, message = gathered[rank]
            cls = getattr(_errors, name, None)
            if not (isinstance(cls, type) and issubclass(cls, ShardlakeError)):
                cls = RuntimeError
            raise cls(f"rank {rank}: {name}: {message}") from error
        if 0 < ended_count < world:
            raise PlanError(
                f"{ended_count} of {plural(world, 'rank')} ran out of batches before the others; ranks "
                "must use the same version, selection, batch_size and loader state"
            )


def masked_sum(values: torch.Tensor, valid: torch.Tensor, group: Any = None) -> torch.Tensor:
    """``[sum of values where valid, count of valid]`` over all ranks (float64, on CPU).

    ``values`` holds one number per sample (e.g. a per-sample loss); ``valid`` is the batch's
    ``"__valid__"``. Accumulate the result over a pass; ``total[0] / total[1]`` is the metric
    over exactly the selected samples, the same as one process computing it alone.
    """
    mask = valid.to(device=values.device, dtype=torch.bool).reshape(-1)
    flat = values.detach().reshape(len(mask), -1).sum(dim=1)
    out = torch.stack([flat[mask].sum().double(), mask.sum().double()]).cpu()
    if distributed():
        dist.all_reduce(out, group=group)
    return out


def pop_valid(batch: dict[str, Any], device: Any = None) -> torch.Tensor:
    """Take the batch's ``"__valid__"`` out and return it (on ``device``): False marks the
    padding of an exact pass. A batch without one (a plain DataLoader's, or a loader that is
    not exact) gets all True, so one validation loop serves both. Index every per-sample
    metric with it before summing (``loss[valid]``); the model still runs on the whole batch,
    so every rank steps in lockstep."""
    valid = batch.pop("__valid__", None)
    if valid is None:
        first = next((v for v in batch.values() if isinstance(v, torch.Tensor) and v.ndim), None)
        if first is None:
            raise _errors.UsageError("pop_valid: the batch has no tensor to tell its size by")
        valid = torch.ones(first.shape[0], dtype=torch.bool)
    return torch.as_tensor(valid, dtype=torch.bool).to(device or "cpu")


def valid_rows(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``values[valid]`` along the first dimension (a per-sample metric without the padding of
    an exact pass); ``values`` itself, not a copy, when every row is valid: a pass without
    padding then computes its sums exactly as before, in the same order, bit for bit."""
    if bool(valid.all()):
        return values
    return values[valid.to(values.device)]


def masked_mean(values: torch.Tensor, valid: torch.Tensor, group: Any = None) -> float:
    """The mean of ``values`` over the valid samples of all ranks' batches (one batch)."""
    total = masked_sum(values, valid, group)
    return float(total[0] / total[1]) if total[1] > 0 else float("nan")


def rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """This process's rank and the world size: as given, else from torch.distributed."""
    d_rank, d_world = dist_info()
    rank = d_rank if rank is None else rank
    world_size = d_world if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise PlanError(f"rank {rank} is outside world_size {world_size}")
    return rank, world_size
