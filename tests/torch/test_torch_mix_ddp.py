"""A 3-source mix on two stores (local + moto S3) over 2 real gloo ranks x 2 DataLoader workers:
exactly-once coverage, shares, exact resume (same and other world size) and an exact validation
pass whose masked loss equals the single-process loss."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from support.torch import mix_rank_main, per_sample_loss, run_ranks

from shardlake import open_store
from shardlake.testing.fixtures import new_location, shared_servers
from shardlake.torch import MixMember, ShardDataset

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("loader_engine")]

BATCH = 8
K = 4  # steps before the preemption


@pytest.fixture(scope="module")
def run(
    tmp_path_factory: pytest.TempPathFactory, mix_roots: tuple[str, str, str]
) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("mixddp")
    a, b, c = mix_roots
    s3 = new_location("s3", "mix", shared_servers())
    local, remote = open_store(str(b)), s3.open()
    for key in local.list():
        local.copy_to(remote, key)
    sources = [
        {"url": str(a), "weight": 0.7, "name": "a"},
        {"url": s3.url, "storage_options": s3.storage_options, "weight": 0.3, "name": "b"},
        {"url": str(c), "repeat": 2, "name": "c"},
    ]
    cfg = {
        "sources": sources,
        "batch_size": BATCH,
        "workers": 2,
        "stop_after": K,
        "save_state": str(base / "state.json"),
        "valid": str(b),
        "valid_batch": 32,
    }
    results = run_ranks(2, cfg, base, main=mix_rank_main)
    for r in results:
        assert r["error"] is None, r.get("traceback")
    return {"results": results, "sources": sources, "state": cfg["save_state"], "valid": str(b)}


def mixed(run: dict[str, Any], **options: Any) -> ShardDataset:
    return ShardDataset.mix(
        [MixMember(**s) for s in run["sources"]],
        batch_size=BATCH,
        include_index=True,
        max_pad_fraction=0.5,
        **options,
    )


def pairs(ds: ShardDataset, batches: list[dict]) -> list[list[list[str]]]:
    return [
        [
            list(p)
            for p in zip(ds.sources_of(b["__index__"]), ds.keys_of(b["__index__"]), strict=True)
        ]
        for b in batches
    ]


def test_two_ranks_cover_the_epoch_once_and_resume_exactly(run: dict[str, Any]) -> None:
    results = run["results"]
    # The same plan, computed here for each rank without torch.distributed: the spawned ranks
    # (interrupted after K steps and resumed by fresh loaders) yielded exactly it.
    for r in results:
        ds = mixed(run, rank=r["rank"], world_size=2, num_workers=2)
        assert r["first"] + r["rest"] == pairs(ds, list(ds.loader()))
    assert len({len(r["first"] + r["rest"]) for r in results}) == 1  # equal steps per rank
    ds = mixed(run, rank=0, world_size=2, num_workers=2)
    epoch = ds.epoch_map(0)
    assert epoch is not None
    want = Counter((ds.sources_of([i])[0], ds.table.keys[i]) for i in epoch.tolist())
    got = Counter(tuple(p) for r in results for b in r["first"] + r["rest"] for p in b)
    assert set(got) == set(want) and all(got[p] >= n for p, n in want.items())
    assert sum(got.values()) - sum(want.values()) < 2 * BATCH  # padding of the last step only
    record = results[0]["record"]
    assert [s["samples_per_epoch"] for s in record["sources"]] == [76, 32, 24]
    assert record["sources"][1]["store"].startswith("s3://")


def test_one_rank_finishes_what_two_ranks_started(run: dict[str, Any]) -> None:
    results = run["results"]
    state = json.loads(Path(run["state"]).read_text())
    ds = mixed(run, rank=0, world_size=1, num_workers=1)
    loader = ds.loader()
    loader.load_state_dict(state)
    rest = pairs(ds, list(loader))
    epoch = ds.epoch_map(0)
    assert epoch is not None
    want = Counter((ds.sources_of([i])[0], ds.table.keys[i]) for i in epoch.tolist())
    got = Counter(tuple(p) for r in results for b in r["first"] for p in b)
    got.update(tuple(p) for b in rest for p in b)
    assert set(got) == set(want)
    assert sum(got.values()) - sum(want.values()) < 2 * BATCH + BATCH


def test_exact_validation_equals_the_single_process_loss(run: dict[str, Any]) -> None:
    results = run["results"]
    seen = Counter(k for r in results for k in r["valid_keys"])
    single = ShardDataset(run["valid"], batch_size=40, exact=True, include_key=True, num_workers=0)
    (batch,) = list(single.loader())
    assert seen == Counter(batch["__key__"])  # 40 samples, batch 32, 2 ranks: each once
    reference = per_sample_loss(batch).sum().item() / 40
    for r in results:
        total, count = r["valid_total"]
        assert count == 40
        assert total / count == pytest.approx(reference, rel=1e-12)
    assert torch.is_tensor(batch["__valid__"]) and bool(batch["__valid__"].all())
