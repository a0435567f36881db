"""The stateless permutation behind plan shape 3: a bijection of [0, n) for any n, a function
of its seed alone, and any stretch of it computed on its own equals that stretch of the whole."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from shardlake.torch.permute import Permutation

SIZES = [0, 1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 31, 97, 255, 256, 257, 1000, 4093, 65536, 65537]


@pytest.mark.parametrize("n", SIZES)
def test_a_bijection_of_every_size(n: int) -> None:
    perm = Permutation(n, "seed")
    order = perm.order()
    assert order.dtype == np.int64
    assert sorted(order.tolist()) == list(range(n))
    assert np.array_equal(perm.inverse(order), np.arange(n))


def test_a_large_prime_size_is_a_bijection() -> None:
    n = 1_000_003
    order = Permutation(n, "big").order()
    seen = np.zeros(n, dtype=bool)
    seen[order] = True
    assert bool(seen.all()) and len(order) == n


def test_deterministic_and_seeded() -> None:
    a = Permutation(10_007, "run|epoch 0").order()
    assert np.array_equal(a, Permutation(10_007, "run|epoch 0").order())
    b = Permutation(10_007, "run|epoch 1").order()
    assert not np.array_equal(a, b)
    # Another size with the same seed is another permutation, not a truncation.
    c = Permutation(10_008, "run|epoch 0").order()
    assert not np.array_equal(a, c[:10_007])


def test_a_stretch_equals_the_slice_of_the_whole() -> None:
    n = 12_345
    perm = Permutation(n, "ranks")
    whole = perm.order()
    world = 7
    bounds = np.linspace(0, n, world + 1).astype(int)
    parts = [Permutation(n, "ranks").order(a, b) for a, b in itertools.pairwise(bounds)]
    assert np.array_equal(np.concatenate(parts), whole)
    picked = np.array([0, 5, 12_344, 77, 5])
    assert np.array_equal(perm(picked), whole[picked])


def test_it_mixes() -> None:
    """Not the identity, nor a rotation: neighbours land far apart, and items of the first
    tenth are spread over the whole order."""
    n = 100_000
    order = Permutation(n, "mix").order()
    assert np.mean(np.abs(np.diff(order))) > n / 5
    first_tenth = np.flatnonzero(order < n // 10)
    counts = np.bincount(first_tenth * 10 // n, minlength=10)
    assert counts.min() > 0.8 * n / 100


def test_positions_outside_are_refused() -> None:
    perm = Permutation(10, "x")
    with pytest.raises(ValueError):
        perm(np.array([10]))
    with pytest.raises(ValueError):
        perm(np.array([-1]))
    with pytest.raises(ValueError):
        Permutation(-1, "x")
