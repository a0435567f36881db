#!/usr/bin/env python
"""Train a small trajectory model with DDP from a shardlake dataset — or from a list of npz files.

This example exists for one job: proving that switching a training run from per-sample ``.npz``
files to shardlake shards changes nothing about the model. Train once per data path with the same
settings, then compare the two run directories with ``shardlake compare-runs``::

    # the old path: a map-style npz Dataset + DistributedSampler
    python examples/train_ddp.py --out runs/npz --nproc 2 --epochs 10 \\
        --npz-list train.txt --valid-npz-list valid.txt

    # the shard path: shardlake.torch.ShardDataset reading a version (any store URL)
    python examples/train_ddp.py --out runs/shards --nproc 2 --epochs 10 \\
        --dataset-root s3://bucket/driving --dataset-version v2 \\
        --train-keyset train --valid-keyset valid

    shardlake compare-runs runs/npz runs/shards --plateau 5 --k 2

Exactly one data path per run: ``--dataset-root`` (with one of ``--train-keyset`` /
``--train-where`` and one of ``--valid-keyset`` / ``--valid-where``) or ``--npz-list`` (with
``--valid-npz-list``). Mixing flags of the two paths is refused (exit 2). An npz list is a text
file with one path per line, or a JSON list of paths (the training lists people already have).

The model predicts ``ego_agent_future`` (80×3) from ``ego_agent_past`` (31×3) and
``ego_current_state`` (10) with a two-layer MLP and an MSE loss. The run directory gets:

* ``args.json`` — every flag, plus the values that were resolved at run time (world size, the
  validation worker count after inheriting ``--num-workers``, sample counts, the dataset's run
  record). ``compare-runs`` refuses two runs whose loss-shifting settings differ.
* ``train_log.tsv`` — one row per epoch: ``epoch, train_loss, valid_loss, valid_ade, seconds,
  train_samples_per_s``.

Validation losses are means over every sample the ranks yield. Both paths pad so that every rank
runs the same number of steps (``DistributedSampler`` repeats samples to even out the ranks; the
shard loader replays a few to fill whole batches), so with a validation set that is a multiple of
``world size × --valid-batch-size`` both average exactly the same samples; otherwise a handful of
repeats differ. That is also why ``compare-runs`` insists on equal validation settings.

Launch: ``--nproc N`` spawns N gloo ranks on this machine (CPU is enough). Under ``torchrun`` the
ranks come from the environment and ``--nproc`` is ignored.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from shardlake.tools.localhost import use_loopback_for_ddp

INPUTS = ("ego_agent_past", "ego_current_state")
TARGET = "ego_agent_future"
ARRAYS = (*INPUTS, TARGET)
LOG_COLUMNS = (
    "epoch",
    "train_loss",
    "valid_loss",
    "valid_ade",
    "seconds",
    "train_samples_per_s",
)


# --- arguments ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="DDP training example: shardlake shards or a plain npz list (exactly one).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", required=True, help="run directory (args.json, train_log.tsv)")
    shards = p.add_argument_group("shard path (shardlake.torch.ShardDataset)")
    shards.add_argument("--dataset-root", metavar="URL", help="dataset root: path, s3://, gs://")
    shards.add_argument("--dataset-version", metavar="TAG", help="version tag (default: latest)")
    shards.add_argument("--train-keyset", metavar="NAME", help="keyset selecting training samples")
    shards.add_argument("--train-where", metavar="SQL", help="WHERE selecting training samples")
    shards.add_argument(
        "--valid-keyset", metavar="NAME", help="keyset selecting validation samples"
    )
    shards.add_argument("--valid-where", metavar="SQL", help="WHERE selecting validation samples")
    npz = p.add_argument_group("npz path (map-style Dataset + DistributedSampler)")
    npz.add_argument("--npz-list", metavar="FILE", help="training npz paths (lines or JSON list)")
    npz.add_argument("--valid-npz-list", metavar="FILE", help="validation npz paths")
    run = p.add_argument_group("training")
    run.add_argument("--nproc", type=int, default=2, help="ranks to spawn (ignored under torchrun)")
    run.add_argument("--epochs", type=int, default=2)
    run.add_argument("--batch-size", type=int, default=16, help="per-rank training batch size")
    run.add_argument("--valid-batch-size", type=int, default=None, help="default: --batch-size")
    run.add_argument("--num-workers", type=int, default=0, help="DataLoader workers per rank")
    run.add_argument(
        "--valid-num-workers",
        type=int,
        default=None,
        help="validation workers per rank (default: inherit --num-workers)",
    )
    run.add_argument("--lr", type=float, default=1e-3)
    run.add_argument("--hidden", type=int, default=64)
    run.add_argument("--seed", type=int, default=0, help="model init and shuffling seed")
    run.add_argument("--max-steps", type=int, default=None, help="stop each epoch after N steps")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    shard_flags = {
        "--dataset-root": args.dataset_root,
        "--dataset-version": args.dataset_version,
        "--train-keyset": args.train_keyset,
        "--train-where": args.train_where,
        "--valid-keyset": args.valid_keyset,
        "--valid-where": args.valid_where,
    }
    npz_flags = {"--npz-list": args.npz_list, "--valid-npz-list": args.valid_npz_list}
    used_shard = [f for f, v in shard_flags.items() if v is not None]
    used_npz = [f for f, v in npz_flags.items() if v is not None]
    if used_shard and used_npz:
        parser.error(
            f"exactly one data path per run: {', '.join(used_npz)} (npz path) conflicts with "
            f"{', '.join(used_shard)} (shard path)"
        )
    if not used_shard and not used_npz:
        parser.error("no data: give --dataset-root (shard path) or --npz-list (npz path)")
    if used_npz:
        if args.npz_list is None or args.valid_npz_list is None:
            parser.error("the npz path needs both --npz-list and --valid-npz-list")
        args.data_path = "npz"
    else:
        if args.dataset_root is None:
            parser.error(f"{', '.join(used_shard)} need --dataset-root")
        for split in ("train", "valid"):
            keyset, where = getattr(args, f"{split}_keyset"), getattr(args, f"{split}_where")
            if (keyset is None) == (where is None):
                parser.error(f"give exactly one of --{split}-keyset and --{split}-where")
        args.data_path = "shards"
    for name in ("epochs", "batch_size", "nproc", "hidden"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.num_workers < 0 or (args.valid_num_workers is not None and args.valid_num_workers < 0):
        parser.error("worker counts must be >= 0")
    # Resolved values are what compare-runs checks, so record them, not the raw defaults.
    args.valid_num_workers_inherited = args.valid_num_workers is None
    if args.valid_num_workers is None:
        args.valid_num_workers = args.num_workers
    if args.valid_batch_size is None:
        args.valid_batch_size = args.batch_size
    return args


# --- the npz path: what users have today ---------------------------------------------------------


def read_npz_list(path: str) -> list[str]:
    text = Path(path).read_text()
    if text.lstrip().startswith("["):
        paths = json.loads(text)
    else:
        paths = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not paths:
        raise SystemExit(f"{path}: no npz paths")
    return [str(p) for p in paths]


class NpzFrames(Dataset[dict[str, torch.Tensor]]):
    """One sample per npz file: the arrays the model needs, as tensors."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        with np.load(self.paths[index], allow_pickle=False) as npz:
            return {name: torch.from_numpy(npz[name]) for name in ARRAYS}


def npz_loader(
    args: argparse.Namespace, paths: list[str], *, train: bool, rank: int, world: int
) -> tuple[DataLoader[Any], DistributedSampler[Any]]:
    ds = NpzFrames(paths)
    sampler = DistributedSampler(
        ds, num_replicas=world, rank=rank, shuffle=train, seed=args.seed, drop_last=False
    )
    loader = DataLoader(
        ds,
        batch_size=args.batch_size if train else args.valid_batch_size,
        sampler=sampler,
        num_workers=args.num_workers if train else args.valid_num_workers,
        persistent_workers=False,
    )
    return loader, sampler


# --- the shard path ------------------------------------------------------------------------------


def shard_dataset(args: argparse.Namespace, *, train: bool, rank: int, world: int) -> Any:
    from shardlake.torch import ShardDataset

    split = "train" if train else "valid"
    keyset, where = getattr(args, f"{split}_keyset"), getattr(args, f"{split}_where")
    return ShardDataset(
        args.dataset_root,
        version=args.dataset_version or "latest",
        keyset=keyset,
        where=where,
        batch_size=args.batch_size if train else args.valid_batch_size,
        seed=args.seed,
        shuffle=train,
        rank=rank,
        world_size=world,
        num_workers=args.num_workers if train else args.valid_num_workers,
    )


def shard_batches(loader: Any, epoch: int) -> Iterable[dict[str, Any]]:
    loader.set_epoch(epoch)  # every epoch a different, reproducible order (valid: unshuffled)
    return loader


# --- model and loop ------------------------------------------------------------------------------


class TrajectoryMLP(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(31 * 3 + 10, hidden), nn.ReLU(), nn.Linear(hidden, 80 * 3)
        )

    def forward(self, past: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([past.flatten(1), current.flatten(1)], dim=1))


def _unpack(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    past = torch.as_tensor(batch["ego_agent_past"]).float()
    cur = torch.as_tensor(batch["ego_current_state"]).float()
    fut = torch.as_tensor(batch[TARGET]).float().flatten(1)
    return past, cur, fut


def _all_sum(*values: float) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def evaluate(model: nn.Module, batches: Iterable[dict[str, Any]]) -> tuple[float, float, int]:
    """Mean per-sample MSE and ADE (mean xy displacement) over every rank's validation samples."""
    model.eval()
    sq_sum = ade_sum = 0.0
    n = 0
    with torch.no_grad():
        for batch in batches:
            past, cur, fut = _unpack(batch)
            pred = model(past, cur)
            sq_sum += float(((pred - fut) ** 2).mean(dim=1).sum())
            disp = (pred - fut).view(-1, 80, 3)[..., :2].norm(dim=-1).mean(dim=1)
            ade_sum += float(disp.sum())
            n += past.shape[0]
    model.train()
    sq, ade, count = _all_sum(sq_sum, ade_sum, float(n))
    return sq / max(count, 1.0), ade / max(count, 1.0), int(count)


def run_rank(rank: int, world: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)  # ranks share the machine's cores; don't oversubscribe them
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)  # identical init on every rank (DDP also broadcasts rank 0's)
    model = DDP(TrajectoryMLP(args.hidden))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    out = Path(args.out)

    if args.data_path == "npz":
        train_paths, valid_paths = read_npz_list(args.npz_list), read_npz_list(args.valid_npz_list)
        train_loader, train_sampler = npz_loader(
            args, train_paths, train=True, rank=rank, world=world
        )
        valid_loader, _ = npz_loader(args, valid_paths, train=False, rank=rank, world=world)
        counts = {"train_samples": len(train_paths), "valid_samples": len(valid_paths)}
        run_record: Any = None
    else:
        train_ds = shard_dataset(args, train=True, rank=rank, world=world)
        valid_ds = shard_dataset(args, train=False, rank=rank, world=world)
        train_shards, valid_shards = train_ds.loader(), valid_ds.loader()
        run_record = {"train": train_shards.run_record(), "valid": valid_shards.run_record()}
        counts = {
            "train_samples": run_record["train"]["samples"],
            "valid_samples": run_record["valid"]["samples"],
        }

    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        record = {k: v for k, v in vars(args).items()}
        record.update(counts, world_size=world, model="mlp", optimizer="adam", loss="mse")
        record.update(inputs=list(INPUTS), targets=[TARGET], torch=torch.__version__)
        record["run_record"] = run_record
        (out / "args.json").write_text(json.dumps(record, indent=2, sort_keys=True, default=str))
        (out / "train_log.tsv").write_text("\t".join(LOG_COLUMNS) + "\n")

    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        if args.data_path == "npz":
            train_sampler.set_epoch(epoch)
            batches: Iterable[dict[str, Any]] = train_loader
            valid_batches: Iterable[dict[str, Any]] = valid_loader
        else:
            batches = shard_batches(train_shards, epoch)
            valid_batches = shard_batches(valid_shards, 0)
        loss_sum, seen = 0.0, 0
        for steps, batch in enumerate(batches, start=1):
            past, cur, fut = _unpack(batch)
            loss = nn.functional.mse_loss(model(past, cur), fut)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += loss.item() * past.shape[0]
            seen += past.shape[0]
            if args.max_steps is not None and steps >= args.max_steps:
                break
        train_sum, train_n = _all_sum(loss_sum, float(seen))
        seconds = time.perf_counter() - t0
        valid_loss, valid_ade, _ = evaluate(model, valid_batches)
        if rank == 0:
            row = [
                str(epoch),
                f"{train_sum / max(train_n, 1.0):.8g}",
                f"{valid_loss:.8g}",
                f"{valid_ade:.8g}",
                f"{seconds:.3f}",
                f"{train_n / seconds:.1f}",
            ]
            with (out / "train_log.tsv").open("a") as fh:
                fh.write("\t".join(row) + "\n")
            print(
                f"epoch {epoch}: train_loss {row[1]} valid_loss {row[2]} valid_ade {row[3]} "
                f"({int(train_n)} samples, {seconds:.1f}s)",
                flush=True,
            )
    dist.barrier()
    # DDP's reducer holds the process group, and modules with hooks sit in reference cycles:
    # free them now, so destroy_process_group() joins gloo's threads here. A group left to the
    # collector at interpreter exit can abort the rank ("terminate called without an active
    # exception", SIGABRT) when a gloo thread releases a tensor after finalization began.
    del model, opt
    gc.collect()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # launched by torchrun
        run_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return 0
    use_loopback_for_ddp()
    import torch.multiprocessing as mp

    mp.spawn(run_rank, args=(args.nproc, args), nprocs=args.nproc, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
