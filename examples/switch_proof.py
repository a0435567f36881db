#!/usr/bin/env python
"""Prove that switching a DistributedSampler training script to shardlake changes nothing.

The script is shaped like Diffusion-Planner's trainer (``train_predictor.py`` -> ``train.py``):
JSON lists of npz paths, a map-style Dataset returning ``dict(np.load(path))``, a
``DistributedSampler`` + ``DataLoader(drop_last=True)`` for training and an unshuffled one for
validation, ``seed + rank`` seeding, dropout and a random augmentation drawn from torch's
global generator, a validation pass before training and after every epoch, and
``sampler.set_epoch(epoch + 1)`` at the end of an epoch. ``--data_path shardlake`` runs the
same loop on a :class:`~shardlake.torch.ShardDataset`: that switch is the one of
docs/migration.md, line for line.

Two runs prove a switch (docs/migration.md, "Prove the switch")::

    python examples/switch_proof.py --data_path npz --out runs/npz \\
        --train_set_list train.json --valid_set_list valid.json
    python examples/switch_proof.py --data_path shardlake --loader_order torch --out runs/torch \\
        --dataset_root /data/root --dataset_version v1 --train_keyset train --valid_keyset valid
    shardlake compare-runs runs/npz runs/torch --strict          # -> identical

``--loader_order torch`` reproduces DistributedSampler + DataLoader exactly, so the step
losses (``steps-rank<r>.tsv``), ``train_log.tsv`` and the final weights (``weights.pt``) are
equal bit for bit. The default order (``shardlake``, the fast plan) is then compared by its
noise band (``shardlake compare-runs runs/npz runs/fast``); with ``--exact_valid`` its
validation counts every frame once (masked by ``__valid__``).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from shardlake.tools.localhost import use_loopback_for_ddp

LOG_COLUMNS = ("epoch", "train_loss", "valid_loss", "valid_ade")


def get_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--data_path", choices=("npz", "shardlake"), required=True)
    p.add_argument("--train_set_list", default="", help="npz: JSON list of training npz paths")
    p.add_argument("--valid_set_list", default="", help="npz: JSON list of validation npz paths")
    p.add_argument("--dataset_root", default="", help="shardlake: the dataset root URL")
    p.add_argument("--dataset_version", default="latest")
    p.add_argument("--train_keyset", default="train")
    p.add_argument("--valid_keyset", default="valid")
    p.add_argument("--loader_order", choices=("torch", "shardlake"), default="shardlake")
    p.add_argument("--exact_valid", action="store_true", help="shardlake: count each frame once")
    p.add_argument("--loader_engine", choices=("threads", "processes"), default=None)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=16, help="global: divided by the ranks")
    p.add_argument("--num_workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=3407)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--augment_prob", type=float, default=0.5)
    return p.parse_args(argv)


# --- the npz path: what the script had --------------------------------------------------------


class NpzFrames(Dataset[dict[str, Any]]):
    def __init__(self, list_path: str) -> None:
        self.data_list = json.loads(Path(list_path).read_text())

    def __len__(self) -> int:
        return len(self.data_list)

    def __getitem__(self, idx: int) -> dict[str, Any]:
        with np.load(self.data_list[idx]) as npz:
            return {k: npz[k] for k in npz.files if k != "version"}  # "version": a string


# --- the model and loop (the same on both paths) ----------------------------------------------


class Planner(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(31 * 3 + 10, 96), nn.ReLU(), nn.Dropout(dropout), nn.Linear(96, 80 * 3)
        )

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        past, cur = inputs["ego_agent_past"].float(), inputs["ego_current_state"].float()
        return self.net(torch.cat([past.flatten(1), cur.flatten(1)], dim=1)).view(-1, 80, 3)


def augment(inputs: dict[str, torch.Tensor], prob: float) -> dict[str, torch.Tensor]:
    """A stand-in for the recipe's state perturbation: draws from torch's global generator."""
    cur = inputs["ego_current_state"].float()
    hit = (torch.rand(cur.shape[0]) < prob).float()[:, None]
    inputs["ego_current_state"] = cur + hit * 0.05 * torch.randn_like(cur)
    return inputs


def all_sum(*values: float) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


@torch.no_grad()
def validate(model: nn.Module, loader: Any) -> tuple[float, float]:
    model.eval()
    sq = ade = count = 0.0
    from shardlake.torch import pop_valid

    for inputs in loader:
        valid = pop_valid(inputs)  # exact=True: False marks the padding; else all True
        inputs = {k: v.to("cpu") for k, v in inputs.items()}
        err = model(inputs) - inputs["ego_agent_future"].float()
        per_sq, per_ade = (err**2).mean(dim=(1, 2)), err[..., :2].norm(dim=-1).mean(dim=1)
        per_sq, per_ade = per_sq[valid], per_ade[valid]
        sq += float(per_sq.sum())
        ade += float(per_ade.sum())
        count += per_sq.shape[0]
    model.train()
    total_sq, total_ade, total = all_sum(sq, ade, count)
    return total_sq / total, total_ade / total


def loaders(args: argparse.Namespace, rank: int, world: int) -> tuple[Any, Any, Any, int]:
    """(train loader, valid loader, the train sampler or None, distinct training frames)."""
    per_rank = args.batch_size // world
    if args.data_path == "npz":
        train_set, valid_set = NpzFrames(args.train_set_list), NpzFrames(args.valid_set_list)
        train_sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True)
        train = DataLoader(
            train_set,
            sampler=train_sampler,
            batch_size=per_rank,
            num_workers=args.num_workers,
            drop_last=True,
        )
        valid_sampler = DistributedSampler(valid_set, num_replicas=world, rank=rank, shuffle=False)
        valid = DataLoader(
            valid_set, sampler=valid_sampler, batch_size=per_rank, num_workers=args.num_workers
        )
        return train, valid, train_sampler, len(train_set)
    from shardlake.torch import ShardDataset

    common = {
        "batch_size": per_rank,
        "num_workers": args.num_workers,
        "order": args.loader_order,
        "engine": args.loader_engine,
    }
    train_ds = ShardDataset(
        args.dataset_root, args.dataset_version, keyset=args.train_keyset, drop_last=True, **common
    )
    valid_ds = ShardDataset(
        args.dataset_root,
        args.dataset_version,
        keyset=args.valid_keyset,
        shuffle=False,
        exact=args.exact_valid,
        **common,
    )
    return train_ds.loader(), valid_ds.loader(), None, train_ds.samples


def run_rank(rank: int, world: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed + rank)  # as the recipe's set_seed(seed + global_rank)
    np.random.seed(args.seed + rank)
    train, valid, sampler, frames = loaders(args, rank, world)
    out = Path(args.out)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        record = {**vars(args), "world_size": world, "train_frames": frames}
        (out / "args.json").write_text(json.dumps(record, indent=2, sort_keys=True))
        (out / "train_log.tsv").write_text("\t".join(LOG_COLUMNS) + "\n")
        print(f"Dataset Prepared: {frames} train data", flush=True)
    model = DDP(Planner(args.dropout))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    steps = [f"{0}\t{-1}\tvalid\t{validate(model, valid)[0]!r}"]
    for epoch in range(args.epochs):
        if sampler is None:
            train.set_epoch(epoch)
        losses = []
        for step, inputs in enumerate(train):
            inputs = augment({k: v.to("cpu") for k, v in inputs.items()}, args.augment_prob)
            loss = nn.functional.mse_loss(model(inputs), inputs["ego_agent_future"].float())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            steps.append(f"{epoch}\t{step}\ttrain\t{loss.item()!r}")
        total, n = all_sum(sum(losses), float(len(losses)))
        valid_loss, valid_ade = validate(model, valid)
        steps.append(f"{epoch}\t{len(losses)}\tvalid\t{valid_loss!r}")
        if rank == 0:
            row = [str(epoch), repr(total / max(n, 1.0)), repr(valid_loss), repr(valid_ade)]
            with (out / "train_log.tsv").open("a") as fh:
                fh.write("\t".join(row) + "\n")
        if sampler is not None:
            sampler.set_epoch(epoch + 1)
    (out / f"steps-rank{rank}.tsv").write_text("\n".join(steps) + "\n")
    if rank == 0:
        torch.save(model.module.state_dict(), out / "weights.pt")
        checkpoint: dict[str, Any] = {"model": model.module.state_dict(), "epoch": args.epochs}
        if sampler is None:  # the loader's position and the exact data, next to the weights
            checkpoint.update(loader=train.state_dict(), run=train.run_record())
        torch.save(checkpoint, out / "checkpoint.pt")
    dist.barrier()
    del model, opt, train, valid
    gc.collect()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = get_args(argv)
    if args.batch_size % args.nproc:
        raise SystemExit(f"--batch_size {args.batch_size} is not divisible by {args.nproc} ranks")
    use_loopback_for_ddp()
    import torch.multiprocessing as mp

    mp.spawn(run_rank, args=(args.nproc, args), nprocs=args.nproc, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
