"""Helpers for the ``test_torch_*`` tests (no tests here): tiny corpora, reference batches, DDP ranks."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

import shardlake
from shardlake.testing import synth_corpus


def make_root(
    base: Path,
    counts: list[int],
    *,
    fmt: str = "v2",
    seed: int = 1,
    shard_size: int = 150_000,
    lanes: int = 4,
) -> tuple[Path, Path]:
    """Synthesize a tiny corpus and pack it; ``(source, root)``."""
    source, root = base / "src", base / "root"
    synth_corpus(source, len(counts), counts, seed=seed, format=fmt, neighbors=4, lanes=lanes)
    shardlake.open(str(root)).pack(source, tag="v1", executor="inline", shard_size=shard_size)
    return source, root


def npz_sample(source: Path, key: str, drop: tuple[str, ...] = ("version",)) -> dict[str, Any]:
    """What users load today: ``np.load`` of the source npz (0-d strings as ``str``)."""
    with np.load(source / f"{key}.npz") as z:
        arrays = {name: z[name] for name in z.files}
    return {
        k: v.item() if v.ndim == 0 and v.dtype.kind in "US" else v
        for k, v in arrays.items()
        if k not in drop
    }


def reference_batch(source: Path, keys: list[str]) -> Any:
    return default_collate([npz_sample(source, k) for k in keys])


def assert_batch_equal(got: dict[str, Any], want: dict[str, Any]) -> None:
    got = {k: v for k, v in got.items() if k != "__key__"}
    assert list(got) == list(want)
    for name, value in want.items():
        if isinstance(value, torch.Tensor):
            assert isinstance(got[name], torch.Tensor), name
            assert got[name].dtype == value.dtype, name
            assert got[name].shape == value.shape, name
            assert torch.equal(got[name], value), name
        else:
            assert got[name] == value, name


def flip_byte(root: Path, shard_key: str, offset: int) -> None:
    path = root / shard_key
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def copy_root(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# --- DDP ranks (run by torch.multiprocessing.spawn) -------------------------------------------


def rank_main(rank: int, world: int, cfg: dict[str, Any]) -> None:
    """One rank: iterate epochs/steps per ``cfg`` and write what it saw to ``out/<rank>.json``."""
    import torch.distributed as dist

    from shardlake.torch import ShardDataset

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{cfg['init_file']}", rank=rank, world_size=world
    )
    out: dict[str, Any] = {"rank": rank, "epochs": [], "error": None}
    try:
        url = cfg["roots"][rank] if "roots" in cfg else cfg["root"]

        def new_loader() -> Any:
            ds = ShardDataset(
                url,
                batch_size=cfg["batch_size"],
                num_workers=cfg["workers"],
                include_key=True,
                seed=cfg["seeds"][rank] if "seeds" in cfg else 0,
                max_pad_fraction=cfg.get("max_pad_fraction", 0.5),
            )
            return ds.loader()

        loader = new_loader()
        if cfg.get("load_state"):
            with open(cfg["load_state"]) as f:
                loader.load_state_dict(json.load(f))
        for _epoch in range(cfg.get("epochs", 1)):
            steps: list[list[str]] = []
            epoch = loader.epoch
            for batch in loader:
                steps.append(list(batch["__key__"]))
                if cfg.get("stop_after") is not None and len(steps) == cfg["stop_after"]:
                    state = loader.state_dict()
                    if rank == 0:
                        with open(cfg["save_state"], "w") as f:
                            json.dump(state, f)
                    break
            out["epochs"].append({"epoch": epoch, "steps": steps})
            if cfg.get("stop_after") is not None:
                # A restarted job: a fresh loader (new workers) continues from the state.
                loader = new_loader()
                loader.load_state_dict(json.loads(json.dumps(state)))
                rest = [list(b["__key__"]) for b in loader]
                out["epochs"].append({"epoch": epoch, "steps": rest, "resumed": True})
                break
        out["record"] = loader.run_record()
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out["error"] = {"type": type(exc).__name__, "message": str(exc)}
        out["traceback"] = traceback.format_exc()
    finally:
        with open(Path(cfg["out"]) / f"{rank}.json", "w") as f:
            json.dump(out, f)
        dist.destroy_process_group()


def gloo_threads() -> list[str]:
    """Names of this process's threads that gloo started (Linux: /proc names every thread)."""
    names = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that just ended
            names.append((task / "comm").read_text().strip())
    return sorted(n for n in names if "gloo" in n)


def destroy_rank_main(rank: int, world: int, cfg: dict[str, Any]) -> None:
    """One rank: a failing pass, then ``destroy_process_group()`` while the loader is still
    referenced; writes whether the group was freed and which gloo threads are left."""
    import weakref

    import torch.distributed as dist

    from shardlake.torch import ShardDataset

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{cfg['init_file']}", rank=rank, world_size=world
    )
    group = weakref.ref(dist.group.WORLD)
    loader = ShardDataset(cfg["roots"][rank], batch_size=cfg["batch_size"]).loader(
        num_workers=cfg["workers"]
    )
    error = None
    try:
        for _ in loader:
            pass
    except Exception as exc:  # noqa: BLE001 - reported to the test
        error = type(exc).__name__
    dist.destroy_process_group()
    out = {"error": error, "group_freed": group() is None, "gloo_threads": gloo_threads()}
    with open(Path(cfg["out"]) / f"{rank}.json", "w") as f:
        json.dump(out, f)
    del loader


def run_ranks(world: int, cfg: dict[str, Any], tmp: Path, main: Any = None) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    out = tmp / f"out-{os.urandom(4).hex()}"
    out.mkdir()
    cfg = {**cfg, "out": str(out), "init_file": str(out / "init")}
    mp.spawn(main or rank_main, args=(world, cfg), nprocs=world, join=True)
    return [json.loads((out / f"{r}.json").read_text()) for r in range(world)]


def per_sample_loss(batch: dict[str, Any]) -> torch.Tensor:
    """A stand-in for a model's per-sample loss: a fixed function of each sample's arrays."""
    return batch["ego_current_state"].double().sum(dim=1) + batch["goal_pose"].double().sum(dim=1)


def mix_rank_main(rank: int, world: int, cfg: dict[str, Any]) -> None:
    """One rank of a mix: train steps (optionally preempted and resumed) and an exact pass."""
    import torch.distributed as dist

    from shardlake.torch import MixMember, ShardDataset, masked_sum

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{cfg['init_file']}", rank=rank, world_size=world
    )
    out: dict[str, Any] = {"rank": rank, "error": None}
    try:
        sources = [MixMember(**s) for s in cfg["sources"]]

        def new_loader() -> Any:
            ds = ShardDataset.mix(
                sources,
                batch_size=cfg["batch_size"],
                num_workers=cfg["workers"],
                include_index=True,
                max_pad_fraction=0.5,
            )
            return ds, ds.loader()

        ds, loader = new_loader()
        first: list[Any] = []
        for batch in loader:
            first.append(
                list(
                    zip(
                        ds.sources_of(batch["__index__"]),
                        ds.keys_of(batch["__index__"]),
                        strict=True,
                    )
                )
            )
            if len(first) == cfg["stop_after"]:
                state = loader.state_dict()
                break
        if rank == 0:
            with open(cfg["save_state"], "w") as f:
                json.dump(state, f)
        ds, loader = new_loader()  # a restarted job
        loader.load_state_dict(json.loads(json.dumps(state)))
        rest = [
            list(zip(ds.sources_of(b["__index__"]), ds.keys_of(b["__index__"]), strict=True))
            for b in loader
        ]
        out.update(first=first, rest=rest, record=loader.run_record())
        valid = ShardDataset(
            cfg["valid"],
            batch_size=cfg["valid_batch"],
            exact=True,
            include_index=True,
            num_workers=cfg["workers"],
        )
        total = torch.zeros(2, dtype=torch.float64)
        seen: list[str] = []
        for batch in valid.loader():
            total += masked_sum(per_sample_loss(batch), batch["__valid__"])
            seen += [
                k
                for k, ok in zip(valid.keys_of(batch["__index__"]), batch["__valid__"], strict=True)
                if ok
            ]
        out.update(valid_total=total.tolist(), valid_keys=seen)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out["error"] = {"type": type(exc).__name__, "message": str(exc)}
        out["traceback"] = traceback.format_exc()
    finally:
        with open(Path(cfg["out"]) / f"{rank}.json", "w") as f:
            json.dump(out, f)
        dist.destroy_process_group()
