"""``shardlake demo``: the whole life of a dataset in a couple of minutes, on any laptop.

1. synthesise a corpus of driving frames (``shardlake.tools.synth``), one directory per log;
2. pack it into a root as version ``v1`` (verified shards + manifests, published atomically);
3. create disjoint ``train``/``valid`` keysets on ``v1`` (one log held out for validation);
4. record more logs and pack them *incrementally* as ``v2`` with ``--base v1``: the old
   partitions are reused, not rebuilt;
5. bind keysets to ``v2`` and train a small model for a few steps with DDP (gloo, CPU), every
   rank streaming its batches from the shards through ``shardlake.torch.ShardDataset``;
6. print versions, samples and throughput.

``store="s3"`` puts the root in a loopback S3 endpoint (moto) that the demo starts and stops
itself, so the same steps run against a real HTTP object store with nothing to set up.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import shardlake

from ..errors import UsageError
from ..progress.bar import plural
from .localhost import use_loopback_for_ddp

if TYPE_CHECKING:
    from ..pack import PackReport

STORES = ("local", "s3")


@dataclass
class DemoConfig:
    store: str = "local"
    workdir: str | None = None
    partitions: int = 6  # logs in the first batch
    samples: int = 24  # frames per log
    extra_partitions: int = 2  # logs in the incremental second batch
    steps: int = 20  # training steps per rank
    nproc: int = 2  # DDP ranks
    batch_size: int = 8  # per-rank batch
    num_workers: int = 1  # DataLoader workers per rank
    small_frames: bool = False  # tiny arrays (CI); default frames are full-size (~240 KB npz)
    keep: bool = False
    seed: int = 0
    out: TextIO = field(default_factory=lambda: sys.stdout, repr=False)

    def check(self) -> None:
        if self.store not in STORES:
            raise UsageError(f"--store must be one of {', '.join(STORES)}")
        if self.partitions < 2:
            raise UsageError("--partitions must be >= 2 (one log is held out for validation)")
        for name in ("samples", "steps", "nproc", "batch_size"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 1")
        if self.extra_partitions < 1 or self.num_workers < 0:
            raise UsageError("extra_partitions must be >= 1 and num_workers >= 0")


class _Say:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.t0 = time.perf_counter()

    def __call__(self, line: str) -> None:
        self.out.write(f"[{time.perf_counter() - self.t0:6.1f}s] {line}\n")
        self.out.flush()


@contextlib.contextmanager
def _root(cfg: DemoConfig, workdir: Path) -> Iterator[tuple[str, dict[str, Any] | None]]:
    if cfg.store == "local":
        yield str((workdir / "root").resolve()), None
        return
    from .loopback import MissingServerError, moto_s3_server

    # set_env: the DDP ranks are spawned processes; they inherit the endpoint settings.
    with contextlib.ExitStack() as stack:
        try:
            s3 = stack.enter_context(moto_s3_server(set_env=True))
        except MissingServerError as exc:
            raise UsageError(f"demo with store 's3': {exc}") from exc
        yield s3.url("demo"), dict(s3.storage_options)


def _synth(dest: Path, cfg: DemoConfig, partitions: int, seed: int) -> Any:
    from .synth import synth_corpus

    if cfg.small_frames:
        return synth_corpus(dest, partitions, cfg.samples, seed=seed, neighbors=4, lanes=8)
    return synth_corpus(dest, partitions, cfg.samples, seed=seed)


def _second_batch(src: Path, cfg: DemoConfig) -> list[str]:
    """New logs, written beside the existing ones without touching them (so they are reused)."""
    existing = {p.name for p in src.iterdir()}
    for attempt in range(100):
        staging = src.parent / f"batch2-{attempt}"
        result = _synth(staging, cfg, cfg.extra_partitions, seed=cfg.seed + 1000 + attempt)
        if not existing & set(result.partitions):
            for name in result.partitions:
                (staging / name).rename(src / name)
            shutil.rmtree(staging)
            return list(result.partitions)
        shutil.rmtree(staging)  # a log name collided with batch 1: draw another
    raise RuntimeError("could not draw distinct log names for the second batch")


def _in_list(values: list[str]) -> str:
    return "(" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + ")"


def _keysets(
    root: str,
    so: dict[str, Any] | None,
    version: str,
    valid_logs: list[str],
    say: _Say,
    step: str,
) -> dict[str, Any]:
    lake = shardlake.open(root, **(so or {}))
    where_valid = f"log_file_id IN {_in_list(valid_logs)}"
    train = lake.keysets.create(f"train-{version}", version=version, where=f"NOT ({where_valid})")
    valid = lake.keysets.create(f"valid-{version}", version=version, where=where_valid)
    report = lake.keysets.check_disjoint(train.name, valid.name)
    if not report.disjoint:
        raise RuntimeError(f"keysets overlap: {report.to_json()}")
    say(
        f"{step}keysets on {version}: {train.name} = {plural(len(train), 'sample')}, {valid.name} = "
        f"{plural(len(valid), 'sample')} (WHERE {where_valid}); disjoint: yes"
    )
    return {"train": train.info(), "valid": valid.info()}


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Run the demo; returns a summary (also printed, line by line, to ``cfg.out``)."""
    cfg.check()
    say = _Say(cfg.out)
    started = time.perf_counter()
    temp = cfg.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="shardlake-demo-") if temp else str(cfg.workdir))
    workdir.mkdir(parents=True, exist_ok=True)
    src = workdir / "source"
    if src.exists() and any(src.iterdir()):
        raise UsageError(f"{src} is not empty: give the demo a fresh --workdir")
    summary: dict[str, Any] = {"store": cfg.store, "workdir": str(workdir)}
    try:
        with _root(cfg, workdir) as (root, so):
            summary["root"] = root
            say(f"shardlake demo: store {cfg.store}, root {root}")
            _run(cfg, src, root, so, say, summary)
    finally:
        if temp and not cfg.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    say(
        f"done in {summary['seconds']}s"
        + (f"; files kept in {workdir}" if not temp or cfg.keep else "")
    )
    return summary


def _run(
    cfg: DemoConfig,
    src: Path,
    root: str,
    so: dict[str, Any] | None,
    say: _Say,
    summary: dict[str, Any],
) -> None:
    t = time.perf_counter()
    first = _synth(src, cfg, cfg.partitions, cfg.seed)
    mb = sum(f.stat().st_size for f in first.files) / 1e6
    say(
        f"1. synthesised {plural(first.samples, 'frame')} in {plural(cfg.partitions, 'log')} ({mb:.1f} MB of npz) "
        f"in {time.perf_counter() - t:.1f}s"
    )
    workers = max(1, min(2, os.cpu_count() or 1))
    packed: dict[str, PackReport] = {}
    rep = shardlake.open(root, **(so or {})).pack(src, tag="v1", workers=workers)
    packed["v1"] = rep
    say(f"2. pack: {rep.summary()}")
    say(
        f"   {rep.version.samples / max(rep.seconds, 1e-9):.0f} samples/s, {mb / max(rep.seconds, 1e-9):.1f} MB/s of npz, every sample verified"
    )

    valid_logs = [first.partitions[-1]]
    summary["keysets_v1"] = _keysets(root, so, "v1", valid_logs, say, "3. ")

    new_logs = _second_batch(src, cfg)
    say(f"4. recorded {len(new_logs)} more logs ({plural(len(new_logs) * cfg.samples, 'frame')})")
    rep = shardlake.open(root, **(so or {})).pack(src, tag="v2", base="v1", workers=workers)
    packed["v2"] = rep
    say(f"   pack --base v1: {rep.summary()}")
    if len(rep.reused) != cfg.partitions:
        raise RuntimeError(
            f"expected {plural(cfg.partitions, 'partition')} reused, got {len(rep.reused)}"
        )

    summary["versions"] = _version_rows(root, so, packed, say)

    # Validation: the held-out log of batch 1 plus the last new log.
    summary["keysets_v2"] = _keysets(root, so, "v2", [*valid_logs, new_logs[-1]], say, "   ")
    n_valid = int(summary["keysets_v2"]["valid"]["samples"])
    summary["train"] = _train(cfg, root, so, n_valid, say)


def _version_rows(
    root: str, so: dict[str, Any] | None, packed: dict[str, PackReport], say: _Say
) -> list[dict[str, Any]]:
    """One summary row per published version, from the pack report that made it."""
    rows = []
    for info in shardlake.open(root, **(so or {})).versions():
        tag, vhash, latest = info.tag, info.hash, info.is_latest
        rep_v = packed[tag]
        rows.append(
            {
                "tag": tag,
                "hash": vhash,
                "latest": latest,
                "samples": rep_v.version.samples,
                "partitions": rep_v.version.partitions,
                "built": len(rep_v.built),
                "reused": len(rep_v.reused),
                "pack_seconds": round(rep_v.seconds, 2),
            }
        )
        say(
            f"   version {tag}{' (latest)' if latest else ''}: {vhash}, "
            f"{plural(rep_v.version.samples, 'sample')} in {plural(rep_v.version.partitions, 'partition')}"
        )
    return rows


# --- training -----------------------------------------------------------------------------------


def _train(
    cfg: DemoConfig, root: str, so: dict[str, Any] | None, n_valid: int, say: _Say
) -> dict[str, Any]:
    import torch.multiprocessing as mp

    results = Path(tempfile.mkdtemp(prefix="shardlake-demo-train-"))
    use_loopback_for_ddp()
    say(
        f"5. training: {cfg.nproc} DDP ranks (gloo) × {plural(cfg.steps, 'step')} × batch {cfg.batch_size}, "
        f"{plural(cfg.num_workers, 'loader worker')} per rank, keyset train-v2 of v2"
    )
    spawned_at = time.time()
    try:
        mp.start_processes(  # type: ignore[attr-defined,no-untyped-call]
            _train_rank,
            args=(cfg.nproc, asdict_light(cfg), root, so, str(results), n_valid),
            nprocs=cfg.nproc,
            join=True,
            start_method="spawn",
        )
        joined_at = time.time()
        ranks = [json.loads((results / f"rank{r}.json").read_text()) for r in range(cfg.nproc)]
    finally:
        shutil.rmtree(results, ignore_errors=True)
    phases = _phases(ranks, spawned_at, joined_at)
    r0 = ranks[0]
    # Throughput over all ranks, first batch to last (the time to first batch is reported apart).
    wall = max(r["seconds"] for r in ranks)
    samples = sum(r["samples"] for r in ranks)
    mbytes = sum(r["bytes"] for r in ranks) / 1e6
    out = {
        "ranks": cfg.nproc,
        "steps_per_rank": r0["steps"],
        "samples": samples,
        "epochs_started": r0["epochs"],
        "seconds": round(wall, 2),
        "samples_per_s": round(samples / wall, 1) if wall > 0 else None,
        "decoded_mb_per_s": round(mbytes / wall, 1) if wall > 0 else None,
        "time_to_first_batch_s": round(max(r["first_batch_s"] for r in ranks), 2),
        "first_loss": r0["first_loss"],
        "last_loss": r0["last_loss"],
        "loss_window": r0["loss_window"],
        "valid_loss": r0["valid_loss"],
        "valid_samples": r0["valid_samples"],
        "version_hash": r0["version_hash"],
        "phases_s": phases,
    }
    say(
        f"   {plural(samples, 'sample')} in {out['seconds']}s of training (first batch to last "
        f"step) over {plural(cfg.nproc, 'rank')}: "
        f"{out['samples_per_s']} samples/s, {out['decoded_mb_per_s']} MB/s decoded; "
        f"time to first batch {out['time_to_first_batch_s']}s"
    )
    say(
        f"   train loss (mean of {plural(out['loss_window'], 'step')}) {out['first_loss']:.4f} first -> "
        f"{out['last_loss']:.4f} last; "
        f"valid loss {out['valid_loss']:.4f} on {plural(out['valid_samples'], 'sample')} (keyset valid-v2)"
    )
    say(
        f"   where the {sum(phases.values()):.1f}s of step 5 went: "
        + ", ".join(f"{seconds:.1f}s {_PHASES[name]}" for name, seconds in phases.items())
    )
    return out


# The training step's phases, in order: what the time between two of the ranks' clocks was.
_PHASES = {
    "start": "starting the rank processes (a Python each, spawned)",
    "setup": "importing torch, joining the DDP group and building the model",
    "first_batch": "opening the version and keyset and reading the first batch",
    "train": "training",
    "validate": "the validation pass",
    "finish": "ending the ranks",
}


def _phases(ranks: list[dict[str, Any]], spawned_at: float, joined_at: float) -> dict[str, float]:
    """Seconds of each phase of the training step, by the slowest rank's wall clock."""
    marks = [spawned_at] + [
        max(r[name] for r in ranks)
        for name in ("entered_at", "ready_at", "first_batch_at", "trained_at", "validated_at")
    ]
    marks.append(max(joined_at, marks[-1]))
    return {
        name: round(max(0.0, b - a), 2)
        for name, a, b in zip(_PHASES, marks[:-1], marks[1:], strict=True)
    }


def asdict_light(cfg: DemoConfig) -> dict[str, Any]:
    """The config without its output stream (streams do not cross process boundaries)."""
    return {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name != "out"}


def _train_rank(
    rank: int,
    world: int,
    cfg: dict[str, Any],
    root: str,
    so: dict[str, Any] | None,
    results: str,
    n_valid: int,
) -> None:
    entered_at = time.time()  # wall clock: the parent compares it with its own
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from ..torch import ShardDataset

    torch.set_num_threads(1)  # ranks share the machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(cfg["seed"])
        model = DistributedDataParallel(
            nn.Sequential(nn.Linear(30 * 3 + 10, 64), nn.ReLU(), nn.Linear(64, 3))
        )
        ready_at = time.time()
        started = time.perf_counter()  # time to first batch includes opening the dataset
        train = ShardDataset(
            root,
            "v2",
            keyset="train-v2",
            batch_size=cfg["batch_size"],
            seed=cfg["seed"],
            num_workers=cfg["num_workers"],
            storage_options=so,
        )
        doc = _train_steps(model, train.loader(), cfg["steps"], started)
        valid_loss, valid_samples = _valid_loss(model, root, so, n_valid, world)
        doc.update(
            valid_loss=valid_loss,
            valid_samples=valid_samples,
            version_hash=train.version_hash,
            entered_at=entered_at,
            ready_at=ready_at,
            validated_at=time.time(),
        )
        (Path(results) / f"rank{rank}.json").write_text(json.dumps(doc))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _step_inputs(batch: dict[str, Any]) -> tuple[Any, Any]:
    """The model's input and target of a batch: the ego's track but its last step, and its
    current state -> that last step. A target the data determines (the synthetic future is
    drawn apart from the past, so predicting it could only learn its mean): the loss falls."""
    import torch

    past = batch["ego_agent_past"]
    x = torch.cat([past[:, :-1].flatten(1), batch["ego_current_state"].flatten(1)], 1)
    return x.float(), past[:, -1].float()


def _train_steps(
    model: Any, loader: Iterable[dict[str, Any]], max_steps: int, t0: float
) -> dict[str, Any]:
    """Train ``max_steps`` steps (epochs restart the loader); counters and losses of the run
    (``first_batch_s`` counted from ``t0``)."""
    import torch
    from torch import nn

    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    steps = samples = nbytes = epochs = 0
    first_batch_s = math.nan
    first_batch_at = math.nan
    losses: list[float] = []
    t_first = t0
    while steps < max_steps:
        epochs += 1
        for batch in loader:
            if steps == 0:
                t_first = time.perf_counter()
                first_batch_s = t_first - t0
                first_batch_at = time.time()
            x, y = _step_inputs(batch)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            steps += 1
            samples += x.shape[0]
            nbytes += sum(v.nbytes for v in batch.values() if isinstance(v, torch.Tensor))
            if steps >= max_steps:
                break
    window = max(1, min(5, len(losses) // 3))
    return {
        "steps": steps,
        "samples": samples,
        "bytes": nbytes,
        "epochs": epochs,
        "seconds": time.perf_counter() - t_first,
        "first_batch_s": first_batch_s,
        "first_batch_at": first_batch_at,
        # Single batches are noisy: report the mean of the first and the last few steps.
        "first_loss": sum(losses[:window]) / window,
        "last_loss": sum(losses[-window:]) / window,
        "loss_window": window,
        "trained_at": time.time(),
    }


def _valid_loss(
    model: Any, root: str, so: dict[str, Any] | None, n_valid: int, world: int
) -> tuple[float, int]:
    """Mean loss over the held-out logs and their sample count: one exact pass (every sample
    once over the ranks, padding masked by ``__valid__``), summed across ranks by masked_sum."""
    import torch

    from ..torch import ShardDataset, masked_sum

    valid = ShardDataset(
        root,
        "v2",
        keyset="valid-v2",
        batch_size=max(1, math.ceil(n_valid / world)),
        exact=True,
        num_workers=0,
        storage_options=so,
    )
    sq = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for batch in valid.loader():
            x, y = _step_inputs(batch)
            sq += masked_sum(((model(x) - y) ** 2).mean(dim=1), batch["__valid__"])
    return float(sq[0]) / max(float(sq[1]), 1.0), int(sq[1])


__all__ = ["DemoConfig", "run_demo"]
