"""A seeded, stateless pseudorandom permutation of ``[0, n)``: any position's image is computed
on its own (no table of ``n`` entries), so a rank evaluates the epoch order at its own positions
only. Pure: NumPy, no torch, no I/O.

A balanced Feistel network over ``[0, 4^h)`` (the smallest power of four at or above ``n``; at
least 4) is a bijection of that domain for any round function; *cycle-walking* (apply it again
while the image is ``>= n``) restricts it to a bijection of ``[0, n)``: the walk from a position
below ``n`` stays inside the cycle of the domain permutation that holds it, and stops at the
next member of that cycle below ``n``. The domain is at most ``4n``, so a walk takes four steps
on average. The round function is SplitMix64's finaliser of (half, round key); the round keys
come from a SHA-256 of the seed, so a permutation is a function of its seed text and ``n`` alone.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

__all__ = ["Permutation"]

ROUNDS = 6  # Luby-Rackoff: 4 rounds already make a pseudorandom permutation
_U64 = np.uint64
IntArray = np.ndarray[Any, np.dtype[np.int64]]


def _mix(x: np.ndarray[Any, np.dtype[np.uint64]]) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """SplitMix64's finaliser (arrays wrap modulo 2^64 silently, as intended)."""
    x = x ^ (x >> _U64(30))  # a new array: the caller's stays as it was
    x *= _U64(0xBF58476D1CE4E5B9)
    x ^= x >> _U64(27)
    x *= _U64(0x94D049BB133111EB)
    x ^= x >> _U64(31)
    return x


class Permutation:
    """A bijection of ``[0, n)`` chosen by ``seed`` (any text): ``perm(positions)`` maps an
    array of positions to their images, :meth:`inverse` back. ``perm.order(a, b)`` is the
    images of positions ``a .. b-1`` (a stretch of the permuted sequence)."""

    def __init__(self, n: int, seed: str) -> None:
        if n < 0:
            raise ValueError(f"Permutation of {n} items")
        self.n = int(n)
        self.seed = seed
        bits = max(1, (max(self.n, 1) - 1).bit_length())
        self.half = max(1, (bits + 1) // 2)  # bits of each half: domain 4^half >= n
        self.mask = _U64((1 << self.half) - 1)
        text = f"shardlake.permutation/1|{seed}|{self.n}"
        self.keys = [
            _U64(int.from_bytes(hashlib.sha256(f"{text}|{i}".encode()).digest()[:8], "little"))
            for i in range(ROUNDS)
        ]

    def _round(self, half: np.ndarray[Any, np.dtype[np.uint64]], i: int) -> Any:
        out = _mix(half ^ self.keys[i])
        out &= self.mask
        return out

    def _feistel(self, x: np.ndarray[Any, np.dtype[np.uint64]]) -> Any:
        shift = _U64(self.half)
        left, right = x >> shift, x & self.mask
        for i in range(ROUNDS):
            mixed = self._round(right, i)
            mixed ^= left
            left, right = right, mixed
        left <<= shift
        left |= right
        return left

    def _feistel_inverse(self, x: np.ndarray[Any, np.dtype[np.uint64]]) -> Any:
        shift = _U64(self.half)
        left, right = x >> shift, x & self.mask
        for i in reversed(range(ROUNDS)):
            mixed = self._round(left, i)
            mixed ^= right
            left, right = mixed, left
        left <<= shift
        left |= right
        return left

    def _walk(self, positions: Any, step: Any) -> IntArray:
        x = np.asarray(positions, dtype=np.int64)
        if x.size and (int(x.min()) < 0 or int(x.max()) >= self.n):
            raise ValueError(f"positions outside [0, {self.n})")
        out = step(x.astype(np.uint64))
        outside = np.flatnonzero(out >= _U64(self.n))
        while len(outside):  # cycle-walking: a few steps on average, the domain is < 4n
            again = step(out[outside])
            out[outside] = again
            outside = outside[again >= _U64(self.n)]
        done: IntArray = out.astype(np.int64)
        return done

    def __call__(self, positions: Any) -> IntArray:
        """The images of ``positions`` (each in ``[0, n)``)."""
        return self._walk(positions, self._feistel)

    def inverse(self, images: Any) -> IntArray:
        """The positions whose images are ``images``."""
        return self._walk(images, self._feistel_inverse)

    def order(self, start: int = 0, stop: int | None = None) -> IntArray:
        """The permuted sequence's items ``start .. stop-1`` (default: all ``n``)."""
        stop = self.n if stop is None else stop
        return self(np.arange(start, stop, dtype=np.int64))
