#!/usr/bin/env python
"""Train on a weighted mix of two dataset versions, validate exactly, resume from a checkpoint.

This is the script docs/migration.md arrives at: a ``np.load``-per-sample ``Dataset`` with a
``DistributedSampler`` switched to ``shardlake.torch``. Run it on 2 CPU ranks::

    python examples/train_mix.py --root s3://bucket/driving --mix v1=0.7 --mix v2=0.3 \\
        --train-where "log_file_id <> 'valid-log'" \\
        --valid-version v2 --valid-where "log_file_id = 'valid-log'" \\
        --out runs/mix --nproc 2 --epochs 4 --batch-size 16

Rerunning with ``--resume`` continues from ``<out>/checkpoint.pt`` (model, optimizer and the
loader's position, saved every ``--checkpoint-every`` steps and at each epoch end): the batches
after the checkpoint are exactly those an uninterrupted run would have seen.
``--stop-after-steps N`` ends the run after N training steps (a stand-in for a preemption).

``<out>/log.jsonl`` gets one line per epoch (rank 0): training loss, the exact validation loss
(every validation sample once, over all ranks), the number of validation samples and the run
record (versions, selections, per-source samples per epoch).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from shardlake.tools.localhost import use_loopback_for_ddp
from shardlake.torch import MixMember, ShardDataset, masked_sum

INPUTS = ("ego_agent_past", "ego_current_state")
TARGET = "ego_agent_future"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True, help="dataset root URL (any store)")
    p.add_argument("--mix", action="append", required=True, help="VERSION=WEIGHT, repeatable")
    p.add_argument("--train-where", default=None, help="SQL selection of training samples")
    p.add_argument("--valid-version", required=True)
    p.add_argument("--valid-where", required=True, help="SQL selection of validation samples")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps (0: epoch ends only)")
    p.add_argument("--stop-after-steps", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    return p


class Planner(nn.Module):
    """A stand-in model: past trajectory + current state -> future trajectory."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(31 * 3 + 10, 64), nn.ReLU(), nn.Linear(64, 80 * 3))

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x = torch.cat([batch[k].flatten(1) for k in INPUTS], dim=1)
        return self.net(x).view(-1, 80, 3)


def normalise(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Augmentation/normalisation stay where they were: after loading, on the device."""
    return {k: (v.float() / 10.0 if v.is_floating_point() else v) for k, v in batch.items()}


def per_sample_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    pred = model(batch)
    return ((pred - batch[TARGET]) ** 2).flatten(1).mean(dim=1)


def datasets(args: argparse.Namespace) -> tuple[ShardDataset, ShardDataset]:
    sources = []
    for item in args.mix:
        version, _, weight = item.partition("=")
        sources.append(
            MixMember(args.root, version=version, where=args.train_where, weight=float(weight))
        )
    train = ShardDataset.mix(
        sources, batch_size=args.batch_size, seed=args.seed, num_workers=args.num_workers
    )
    valid = ShardDataset(
        args.root,
        args.valid_version,
        where=args.valid_where,
        batch_size=args.batch_size,
        exact=True,  # every validation sample exactly once; padding has __valid__ = False
        num_workers=args.num_workers,
    )
    return train, valid


def validate(model: nn.Module, loader: Any, device: torch.device) -> tuple[float, int]:
    model.eval()
    total = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for batch in loader:
            batch = normalise({k: v.to(device) for k, v in batch.items()})
            total += masked_sum(per_sample_loss(model, batch), batch["__valid__"])
    model.train()
    return float(total[0] / total[1]), int(total[1])


def save(path: Path, model: nn.Module, opt: Any, loader: Any, step: int) -> None:
    if dist.get_rank() == 0:
        tmp = path.with_suffix(".tmp")
        state = {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "loader": loader.state_dict(),  # the data position: epoch + steps consumed
            "run": loader.run_record(),
            "step": step,
        }
        torch.save(state, tmp)
        os.replace(tmp, path)
    dist.barrier()


def train(rank: int, world: int, args: argparse.Namespace) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    device = torch.device("cpu")
    train_ds, valid_ds = datasets(args)
    loader, valid_loader = train_ds.loader(), valid_ds.loader()
    model = DDP(Planner().to(device))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    ckpt, step = args.out / "checkpoint.pt", 0
    if args.resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        step = state["step"]
    for epoch in range(loader.epoch, args.epochs):
        loader.set_epoch(epoch)  # keeps a resumed position inside this epoch
        losses = []
        for batch in loader:
            batch = normalise({k: v.to(device) for k, v in batch.items()})
            loss = per_sample_loss(model, batch).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            step += 1
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                save(ckpt, model, opt, loader, step)
            if step == args.stop_after_steps:
                del model, opt  # see the end of this function
                gc.collect()
                dist.destroy_process_group()
                return
        valid_loss, valid_count = validate(model, valid_loader, device)
        save(ckpt, model, opt, loader, step)
        if rank == 0:
            line = {
                "epoch": epoch,
                "steps": step,
                "train_loss": sum(losses) / max(1, len(losses)),
                "valid_loss": valid_loss,
                "valid_samples": valid_count,
                "run": loader.run_record(),
            }
            with open(args.out / "log.jsonl", "a") as f:
                f.write(json.dumps(line) + "\n")
    # DDP's reducer holds the gloo group (and modules with hooks sit in cycles): freed now,
    # destroy_process_group() joins gloo's threads here, not at interpreter exit, where a gloo
    # thread releasing a tensor aborts the rank ("terminate called without an active exception").
    del model, opt
    gc.collect()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if "RANK" in os.environ:  # under torchrun
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return 0
    use_loopback_for_ddp()
    torch.multiprocessing.spawn(train, args=(args.nproc, args), nprocs=args.nproc, join=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
