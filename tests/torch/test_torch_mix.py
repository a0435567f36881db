"""Weighted mixing (``ShardDataset.mix``), exact evaluation and batch keys, in one process."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from shardlake.errors import UsageError
from shardlake.torch import MixMember, ShardDataset

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("loader_engine")]

BATCH = 8


@pytest.fixture(scope="module")
def roots(mix_roots: tuple[str, str, str]) -> tuple[str, str, str]:
    return mix_roots


def keyed(ds: ShardDataset, batches: list[dict]) -> list[list[tuple[str, str]]]:
    """Each batch as (source, key) pairs, from its ``__index__``."""
    return [
        list(zip(ds.sources_of(b["__index__"]), ds.keys_of(b["__index__"]), strict=True))
        for b in batches
    ]


def mix3(roots: tuple[str, str, str], **options: object) -> ShardDataset:
    a, b, c = roots
    return ShardDataset.mix(
        [
            MixMember(a, weight=0.7, name="a"),
            MixMember(b, weight=0.3, name="b"),
            MixMember(c, repeat=2, name="c"),
        ],
        batch_size=BATCH,
        include_index=True,
        **options,  # type: ignore[arg-type]
    )


def test_counts_follow_weights_repeat_and_choose(roots: tuple[str, str, str]) -> None:
    ds = mix3(roots, num_workers=0, seed=3)
    # a + b + c = 80 + 40 + 12 samples; c asks for 24 (repeat=2), a and b share the other 108.
    assert ds.source_sizes == [80, 40, 12]
    assert ds.source_counts == [round(0.7 * 108), round(0.3 * 108), 24]
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        batches = keyed(ds, list(ds.loader()))
        seen = Counter(pair for batch in batches for pair in batch)
        per_source = Counter(s for s, _ in seen.elements())
        planned = sum(len(b) for b in batches) - sum(ds.source_counts)
        assert planned < BATCH  # padding replays only to fill the last batch
        assert abs(per_source["a"] - 76) <= planned and abs(per_source["b"] - 32) <= planned
        assert {k for (s, k) in seen if s == "c"} == set(ds.table.keys[120:])
        assert all(n >= 2 for (s, _), n in seen.items() if s == "c")  # up-sampled: each twice
        assert all(n <= 2 for (s, _), n in seen.items() if s == "a")  # down-sampled: <= once
    record = ds.loader().run_record()
    assert [s["samples_per_epoch"] for s in record["sources"]] == ds.source_counts
    assert [s["name"] for s in record["sources"]] == ["a", "b", "c"]
    choose = ShardDataset.mix(
        [MixMember(roots[0], choose=10), MixMember(roots[1], choose=50)], batch_size=BATCH
    )
    assert choose.source_counts == [10, 50]
    with pytest.raises(UsageError, match="at most one of weight"):
        MixMember(roots[0], weight=1, repeat=2)


def test_samples_interleave_and_shares_stay_within_tolerance(roots: tuple[str, str, str]) -> None:
    """Per batch, source a's share follows a hypergeometric law around p = 76/132; every batch
    stays within 4 standard deviations of the binomial (a looser bound) and most batches mix."""
    ds = mix3(roots, num_workers=2, seed=0)
    batches = keyed(ds, list(ds.loader()))
    p = ds.source_counts[0] / sum(ds.source_counts)
    sigma = math.sqrt(p * (1 - p) / BATCH)
    shares = [sum(s == "a" for s, _ in b) / BATCH for b in batches]
    assert all(abs(x - p) <= 4 * sigma for x in shares), shares
    assert sum(len({s for s, _ in b}) > 1 for b in batches) >= 0.8 * len(batches)
    # Deterministic: the same arguments give the same batches; another seed others.
    assert keyed(ds, list(mix3(roots, num_workers=2, seed=0).loader())) == batches
    assert keyed(ds, list(mix3(roots, num_workers=2, seed=1).loader())) != batches


def test_mix_resume_exact_with_same_and_other_workers(roots: tuple[str, str, str]) -> None:
    full = keyed(mix3(roots, num_workers=2), list(mix3(roots, num_workers=2).loader()))
    ds = mix3(roots, num_workers=2)
    loader = ds.loader()
    first = []
    for batch in loader:
        first.append(batch)
        if len(first) == 5:
            break
    state = loader.state_dict()
    again = mix3(roots, num_workers=2).loader()
    again.load_state_dict(state)
    rest = keyed(ds, list(again))
    assert keyed(ds, first) + rest == full  # identical remaining order
    other = mix3(roots, num_workers=1).loader()
    other.load_state_dict(state)
    moved = keyed(ds, list(other))
    want = Counter(p for b in full for p in b)
    got = Counter(p for b in keyed(ds, first) + moved for p in b)
    assert set(got) == set(want)  # one epoch: every chosen sample, repeats as planned
    assert abs(sum(got.values()) - sum(want.values())) < 2 * BATCH


def test_exact_pass_of_40_samples_on_two_ranks_with_batch_32(roots: tuple[str, str, str]) -> None:
    seen: Counter[str] = Counter()
    steps = []
    for rank in (0, 1):
        ds = ShardDataset(
            roots[1], batch_size=32, exact=True, rank=rank, world_size=2, include_index=True
        )
        batches = list(ds.loader(num_workers=2))
        steps.append(len(batches))
        for b in batches:
            assert b["__valid__"].dtype == torch.bool and b["__valid__"].shape == (32,)
            seen.update(
                k for k, ok in zip(ds.keys_of(b["__index__"]), b["__valid__"], strict=True) if ok
            )
    assert steps == [1, 1]
    assert seen == Counter(ShardDataset(roots[1], batch_size=32).table.keys)  # each once


def test_index_beside_the_batch_keeps_the_to_device_loop(roots: tuple[str, str, str]) -> None:
    ds = ShardDataset(roots[2], batch_size=4, include_index=True, include_key=False, num_workers=0)
    keyed_ds = ShardDataset(roots[2], batch_size=4, include_key=True, num_workers=0)
    for batch, want in zip(ds.loader(), keyed_ds.loader(), strict=True):
        moved = {k: v.to("cpu") for k, v in batch.items()}  # every value is a tensor
        assert ds.keys_of(moved["__index__"]) == want["__key__"]


def test_mixing_report_counts_samples_per_source(roots: tuple[str, str, str]) -> None:
    from shardlake.torch import plan_mixing

    ds = mix3(roots, num_workers=2)
    report = plan_mixing(ds).to_json()
    batches = keyed(ds, list(ds.loader()))
    assert report["sources"] == dict(Counter(s for b in batches for s, _ in b))
    assert sum(report["sources"].values()) - sum(ds.source_counts) < BATCH  # padding only


def test_source_is_a_deprecated_alias_of_mix_member() -> None:
    import shardlake.torch

    with pytest.warns(DeprecationWarning, match="use shardlake.torch.MixMember"):
        assert shardlake.torch.Source is shardlake.torch.MixMember
