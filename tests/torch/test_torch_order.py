"""The loader's orders against the recipe they replace: ``order="torch"`` is exactly
DistributedSampler + DataLoader, and ``shuffle=False`` is the selection's own order (issue 50)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from support.torch import assert_batch_equal, reference_batch
from torch.utils.data import DataLoader, DistributedSampler

import shardlake
from shardlake.errors import InvalidURLError, UsageError
from shardlake.torch import MixMember, ShardDataset

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("loader_engine")]

COUNTS = [23, 18]  # 41 frames: prime, so most batch and world sizes leave a remainder


@pytest.fixture(scope="module")
def corpus(packed_root: Callable[..., tuple[Path, Path]]) -> tuple[Path, Path]:
    return packed_root(COUNTS, name="order", shard_size=40_000)


@pytest.fixture(scope="module")
def listed(corpus: tuple[Path, Path]) -> list[str]:
    """The frames in a list order unlike the manifest's (what a JSON list of paths holds)."""
    keys = ShardDataset(str(corpus[1]), batch_size=1, num_workers=0).table.keys
    order = np.random.default_rng(5).permutation(len(keys))
    return [keys[int(i)] for i in order]


def torch_batches(
    listed: list[str],
    world: int,
    rank: int,
    batch: int,
    *,
    epoch: int,
    shuffle: bool,
    seed: int = 0,
    drop_last: bool = False,
    sampler_drop_last: bool = False,
) -> list[list[str]]:
    """The keys of the batches DistributedSampler + DataLoader give ``rank`` over ``listed``."""
    sampler = DistributedSampler(
        listed,
        num_replicas=world,
        rank=rank,
        shuffle=shuffle,
        seed=seed,
        drop_last=sampler_drop_last,
    )
    sampler.set_epoch(epoch)
    loader = DataLoader(
        listed, sampler=sampler, batch_size=batch, drop_last=drop_last, collate_fn=list
    )
    return list(loader)


def our_batches(ds: ShardDataset, epoch: int, **loader: object) -> list[list[str]]:
    it = ds.loader(**loader)
    it.set_epoch(epoch)
    return [list(b["__key__"]) for b in it]


CASES = [
    # world, batch, workers, shuffle, seed, drop_last, sampler_drop_last
    (1, 16, 2, True, 0, True, False),  # DP's training loader: 41 frames at batch 16
    (2, 16, 2, False, 0, False, False),  # DP's validation loader: padded, short last batch
    (3, 4, 0, True, 7, False, False),
    (2, 5, 2, True, 0, True, True),
    (3, 6, 1, False, 0, False, True),
    (4, 32, 2, True, 3, False, False),  # more padding than a step: every rank one short batch
]


@pytest.mark.parametrize("world,batch,workers,shuffle,seed,drop_last,sampler_drop_last", CASES)
def test_torch_order_is_distributed_sampler_and_data_loader(
    corpus: tuple[Path, Path],
    listed: list[str],
    world: int,
    batch: int,
    workers: int,
    shuffle: bool,
    seed: int,
    drop_last: bool,
    sampler_drop_last: bool,
) -> None:
    for rank in range(world):
        ds = ShardDataset(
            str(corpus[1]),
            keys=listed,
            batch_size=batch,
            rank=rank,
            world_size=world,
            num_workers=workers,
            order="torch",
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            sampler_drop_last=sampler_drop_last,
            include_key=True,
        )
        for epoch in (0, 1):
            want = torch_batches(
                listed,
                world,
                rank,
                batch,
                epoch=epoch,
                shuffle=shuffle,
                seed=seed,
                drop_last=drop_last,
                sampler_drop_last=sampler_drop_last,
            )
            assert our_batches(ds, epoch) == want, (rank, epoch)
        assert len(ds) == sum(len(b) for b in want)


def test_torch_order_batches_are_the_npz_batches_and_exact_marks_the_repeats(
    corpus: tuple[Path, Path], listed: list[str]
) -> None:
    source, root = corpus
    ds = ShardDataset(
        str(root), keys=listed, batch_size=8, world_size=2, rank=1, order="torch",
        shuffle=False, include_key=True,
    )  # fmt: skip
    for batch in ds.loader():
        assert_batch_equal(batch, reference_batch(source, list(batch["__key__"])))
    # exact=True: DistributedSampler's repeat (41 frames over 2 ranks: one) is marked invalid.
    counted: list[str] = []
    for rank in (0, 1):
        exact = ShardDataset(
            str(root), keys=listed, batch_size=8, world_size=2, rank=rank, order="torch",
            exact=True, include_key=True,
        )  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "NumPy array is not writable"
            for batch in exact.loader():
                counted += [
                    k for k, ok in zip(batch["__key__"], batch["__valid__"], strict=True) if ok
                ]
    assert sorted(counted) == sorted(listed)


def test_torch_order_refuses_a_mix_and_a_layout_change(corpus: tuple[Path, Path]) -> None:
    root = str(corpus[1])
    with pytest.raises(UsageError, match="order='torch'"):
        ShardDataset.mix(
            [MixMember(root), MixMember(root, repeat=0.5)], batch_size=4, order="torch"
        )
    with pytest.raises(UsageError, match="order"):
        ShardDataset(root, batch_size=4, order="random")
    with pytest.raises(UsageError, match="exact"):
        ShardDataset(root, batch_size=4, exact=True, drop_last=True)


@pytest.mark.parametrize("workers", [0, 2])
def test_unshuffled_order_is_the_list_or_keysets_order(
    corpus: tuple[Path, Path], listed: list[str], workers: int, tmp_path: Path
) -> None:
    root = str(corpus[1])
    ds = ShardDataset(
        root, keys=listed, batch_size=4, shuffle=False, num_workers=workers, include_key=True,
        max_pad_fraction=1,
    )  # fmt: skip
    flat = [k for b in ds.loader() for k in b["__key__"]]
    assert flat == listed + listed[:3]  # 41 -> 44: the padding repeats the first frames
    # A keyset made from a JSON list keeps the list's order (CLI, as the migration guide does).
    half = listed[::2]
    (tmp_path / "list.json").write_text(json.dumps(half))
    made = shardlake.open(root).keysets.create(
        f"half{workers}", key_file=str(tmp_path / "list.json")
    )
    assert made.keys == half
    by_keyset = ShardDataset(
        root, "v1", keyset=f"half{workers}", batch_size=3, exact=True, num_workers=workers,
        include_key=True,
    )  # fmt: skip
    got = [
        k
        for b in by_keyset.loader()
        for k, ok in zip(b["__key__"], b["__valid__"], strict=True)
        if ok
    ]
    assert got == half
    # Plain iteration (DataLoader over the dataset, no workers) is the same order.
    assert [k for b in DataLoader(by_keyset, batch_size=3) for k in b["__key__"]][:21] == half


def test_any_batch_size_plans_and_drop_last_counts_no_repeat(corpus: tuple[Path, Path]) -> None:
    """40 frames at batch 16 and 74 at batch 32 raised PlanError from len(); now they plan."""
    root = str(corpus[1])
    for batch, world in ((16, 1), (32, 1), (16, 2), (7, 3)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            padded = ShardDataset(root, batch_size=batch, world_size=world, rank=0)
            assert len(padded) % batch == 0 and len(padded.loader()) == len(padded) // batch
        dropped = [
            [k for b in ShardDataset(
                root, batch_size=batch, world_size=world, rank=r, drop_last=True, include_key=True
            ).loader() for k in b["__key__"]]
            for r in range(world)
        ]  # fmt: skip
        seen = [k for keys in dropped for k in keys]
        assert len(seen) == len(set(seen)) == 41 // (batch * world) * batch * world
    with pytest.warns(UserWarning, match="replaying"):
        len(ShardDataset(root, batch_size=32, world_size=2, rank=0))


@pytest.mark.parametrize("url", ["", "   "])
def test_a_blank_root_is_refused_naming_the_argument(url: str) -> None:
    with pytest.raises(InvalidURLError, match=r"ShardDataset\(url\) is empty"):
        ShardDataset(url, "v1", batch_size=4)
    with pytest.raises(InvalidURLError, match=r"shardlake.open\(url\) is empty"):
        shardlake.open(url)
    with pytest.raises(InvalidURLError, match=r"MixMember\(url\) is empty"):
        MixMember(url)


def test_pop_valid_serves_exact_and_plain_batches() -> None:
    from shardlake.torch import pop_valid

    marked = {"x": torch.zeros(3, 2), "__valid__": torch.tensor([True, False, True])}
    assert pop_valid(marked).tolist() == [True, False, True] and "__valid__" not in marked
    assert pop_valid({"x": torch.zeros(4, 2)}).tolist() == [True] * 4
    # valid_rows: the same tensor (no copy, the same sums) when nothing is padding.
    from shardlake.torch import valid_rows

    x = torch.arange(12.0).view(3, 4)[:, 1:]  # a strided view, as a metric slice often is
    assert valid_rows(x, torch.ones(3, dtype=torch.bool)) is x
    assert valid_rows(x, torch.tensor([True, False, True])).tolist() == [[1, 2, 3], [9, 10, 11]]


def test_exact_batches_from_a_mapped_plan_raise_no_numpy_warning(
    corpus: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan mapped from the node-local cache is read-only: the batch's "__valid__" must be
    a copy, not torch.from_numpy of it ("The given NumPy array is not writable")."""
    monkeypatch.setenv("SHARDLAKE_CATALOG_CACHE", str(tmp_path / "cache"))
    for _ in range(2):  # the first run writes the plan, the second maps it
        exact = ShardDataset(str(corpus[1]), batch_size=6, exact=True, world_size=2, rank=1)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            valid = [bool(v) for b in exact.loader() for v in b["__valid__"]]
        assert sum(valid) == 18  # rank 1: steps 0-2 real, step 3 all padding (41 of 48)
