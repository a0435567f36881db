"""Batch assembly: byte copies for samples sharing the first header, checked copies otherwise."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from shardlake.errors import IntegrityError, UsageError
from shardlake.format.codec import Encoder
from shardlake.torch.collate import BatchBuilder, PayloadDecoder


def _sample(seed: int, **extra: Any) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "pos": rng.standard_normal((3, 4)).astype(np.float32),
        "ids": rng.integers(0, 9, 5).astype(np.int64),
        "flag": np.array(seed % 2 == 0),
        "empty": np.zeros((0, 2), np.float16),
        "name": np.array(f"log-{seed}"),
        **extra,
    }


def _build(samples: list[dict[str, Any]], drop: tuple[str, ...] = ()) -> dict[str, Any]:
    encoder = Encoder()
    items = [(i, encoder.encode(s)[1]) for i, s in enumerate(samples)]
    decoder = PayloadDecoder(lambda row: items[row][1], lambda row: f"shard-0 row {row}")
    return BatchBuilder(len(items), drop, shared=False).build(decoder, items, None, {})


def test_batch_equals_stacked_samples_whatever_the_headers() -> None:
    # Sample 1 has an extra array (dropped): another header, so it takes the checked path.
    samples = [_sample(0), _sample(1, version=np.array([2], np.uint32)), _sample(2)]
    batch = _build(samples, drop=("version",))
    assert list(batch) == ["pos", "ids", "flag", "empty", "name"]
    for name in ("pos", "ids", "flag", "empty"):
        want = torch.from_numpy(np.stack([s[name] for s in samples]))
        assert batch[name].dtype == want.dtype and torch.equal(batch[name], want), name
    assert batch["name"] == ["log-0", "log-1", "log-2"]


@pytest.mark.parametrize(
    ("odd", "message"),
    [
        ({"pos": np.zeros((3, 5), np.float32)}, "array 'pos' is <f4\\[3, 5\\]"),
        ({"ids": np.zeros(5, np.int32)}, "array 'ids' is <i4"),
    ],
)
def test_a_sample_that_does_not_stack_is_named(odd: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:  # not damage: a usage error
        _build([_sample(0), {**_sample(1), **odd}])
    assert "shard-0 row 1" in str(info.value)


def test_a_missing_array_is_named() -> None:
    short = {k: v for k, v in _sample(1).items() if k != "ids"}
    with pytest.raises(UsageError, match="no array 'ids'"):
        _build([_sample(0), short])


def test_a_corrupt_header_is_an_integrity_error_naming_the_sample() -> None:
    import zstandard

    bad = zstandard.ZstdCompressor(write_checksum=True).compress(b"\xff" * 8 + b"{}")
    decoder = PayloadDecoder(lambda row: bad, lambda row: f"shard-0 row {row}")
    with pytest.raises(IntegrityError, match="shard-0 row 0"):
        BatchBuilder(1, (), shared=False).build(decoder, [(0, bad)], None, {})


def test_a_worker_hands_over_one_tensor_per_batch_and_the_views_come_back() -> None:
    from shardlake.torch.loader import pack_batch, unpack_batch

    samples = [_sample(0), _sample(1), _sample(2)]
    batch = _build(samples)
    batch["index"] = torch.arange(3)  # a tensor of its own allocation travels as it is
    packed = pack_batch(batch)
    tensors = [v for v in packed.values() if isinstance(v, torch.Tensor)]
    assert len(tensors) == 1 and tensors[0] is batch["index"]
    back = unpack_batch(packed)
    assert list(back) == list(batch)
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            assert back[name].dtype == value.dtype and torch.equal(back[name], value), name
        else:
            assert back[name] == value
    storages = {back[k].untyped_storage().data_ptr() for k in ("pos", "ids", "flag", "empty")}
    assert len(storages) == 1


def test_local_pool_reuses_a_buffer_only_once_no_view_of_it_is_alive() -> None:
    from shardlake.torch.collate import LocalBufferPool, new_batch_tensors

    pool = LocalBufferPool(2, torch.UntypedStorage)
    specs = [((4, 3), torch.float32), ((4,), torch.int64)]
    (a, _), _ = new_batch_tensors(specs, False, pool)
    kept = a[1]  # a view the user keeps
    del a
    (b, _), _ = new_batch_tensors(specs, False, pool)
    assert b.untyped_storage().data_ptr() != kept.untyped_storage().data_ptr()
    first = kept.untyped_storage().data_ptr()
    del kept
    (c, _), _ = new_batch_tensors(specs, False, pool)
    assert c.untyped_storage().data_ptr() == first  # free again: reused, not allocated
    assert len(pool.buffers) == 2
