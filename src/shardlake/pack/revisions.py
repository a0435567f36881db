"""A partition revision's names: the data, sidecar and manifest revisions derived from the recipe
and the samples' digests, the seeded shuffle order, and the check that a sample decodes to what
was written.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import IntegrityError
from ..format.codec import Decoder, decode_safetensors
from ..format.layout import short_hash
from ..meta.state import canonical_json

if TYPE_CHECKING:
    from .build import Recipe

__all__ = [
    "data_revision",
    "manifest_revision",
    "meta_revision",
    "shuffle_order",
    "verify_sample",
]


def shuffle_order(keys: list[str], seed: int) -> list[str]:
    """The seeded shuffle of a partition's keys: sort by a keyed hash of each key.

    It depends only on the seed and the key itself, so adding a sample does not reorder the
    others and any implementation can reproduce it.
    """
    return sorted(keys, key=lambda k: (hashlib.sha256(f"{seed}\0{k}".encode()).digest(), k))


def data_revision(recipe: Recipe, partition_path: str, hashes: list[tuple[str, str]]) -> str:
    """``data_rev``: hash of the recipe and the sorted ``(key, source sha256)`` pairs."""
    body = "\n".join(f"{k}\0{h}" for k, h in sorted(hashes))
    return short_hash("data-rev", canonical_json(recipe.to_json()), partition_path, body, length=24)


def meta_revision(sidecars: list[tuple[str, dict[str, Any] | None]]) -> str:
    """``meta_rev``: hash of the included samples' sidecars (canonical JSON, by key)."""
    h = hashlib.sha256()
    for key, doc in sorted(sidecars, key=lambda kv: kv[0]):
        body = canonical_json(doc) if doc is not None else b"null"
        h.update(short_hash(key, body, length=64).encode())
    return short_hash("meta-rev", h.hexdigest(), length=24)


def manifest_revision(data_rev: str, meta_rev: str) -> str:
    return short_hash("manifest-rev", data_rev, meta_rev, length=24)


def _flat_bytes(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def verify_sample(
    st: bytes,
    payload: bytes,
    arrays: dict[str, np.ndarray[Any, Any]],
    decoder: Decoder,
    where: str,
) -> None:
    """Check that ``payload`` decodes to exactly ``arrays`` (names, order, dtypes, shapes, bytes).

    Cheap by construction: one zstd decompression, one memcmp against the encoded safetensors
    bytes, then each tensor's slice of those bytes against the source array's buffer. The npz is
    not read again.
    """
    if decoder.decompress(payload, where) != st:
        raise IntegrityError(f"{where}: payload does not decompress to the encoded bytes")
    decoded = decode_safetensors(st, where)
    if list(decoded) != list(arrays):
        raise IntegrityError(f"{where}: encoded array names/order differ from the source")
    for name, src in arrays.items():
        got = decoded[name]
        if got.dtype != src.dtype or got.shape != src.shape:
            raise IntegrityError(
                f"{where}: array {name!r} decodes as {got.dtype.str}{got.shape}, "
                f"source is {src.dtype.str}{src.shape}"
            )
        if not np.array_equal(_flat_bytes(got), _flat_bytes(src)):
            raise IntegrityError(f"{where}: array {name!r} bytes differ after encoding")
