"""What a writer checks and encodes per sample: its key and partition (the base's partition rule),
its arrays and sidecar, and the record it becomes (payload and source digest).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SourceError
from ..format.codec import Decoder, Encoder, check_array
from ..source.sidecar import is_skipped, parse_sidecar
from ..source.source_form import source_sha256
from ..source.tree import PartitionRule
from .build import encode_verified

__all__ = [
    "EncodedRecord",
    "PARENT_RULE",
    "check_key",
    "encode_record",
    "partition_of_key",
    "rule_owner",
    "sample_arrays",
    "sample_sidecar",
]


# The partition rule a writer version records: a key's parent path (``partition=`` overrides).
PARENT_RULE = PartitionRule(depth=None, regex=r"^(?P<partition>.+)/[^/]+$")


def check_key(key: object, what: str = "key") -> str:
    """A sample key (or partition path) must be a relative ``/`` path: the npz path it exports to."""
    if not isinstance(key, str):
        raise SourceError(f"{what} {key!r} is not a string")
    bad = ""
    if not key:
        bad = "it is empty"
    elif key.startswith("/") or key.endswith("/"):
        bad = "it starts or ends with '/'"
    elif "\\" in key or any(ord(c) < 32 or ord(c) == 127 for c in key):
        bad = "it holds a backslash or a control character"
    elif any(part in ("", ".", "..") for part in key.split("/")):
        bad = "it has an empty, '.' or '..' path segment"
    if bad:
        raise SourceError(f"{what} {key!r} is not a valid relative path ({bad})")
    return key


def partition_of_key(
    key: str, partition: str | None = None, rule: PartitionRule | None = None
) -> str:
    """The partition path of ``key``. Over a base (``rule``: the base's partition rule) the one
    the rule gives, as pack over the base would; ``partition``, if given, must agree. Without a
    base: ``partition`` if given, else the key's parent path."""
    if rule is not None:
        owner = rule.partition_of(key + ".npz")
        if owner is None:
            raise SourceError(
                f"sample {key!r}: the base's {rule.describe()} puts the key in no partition "
                "(a writer over a base keeps its partition rule)"
            )
        if partition is not None and check_key(partition, "partition") != owner:
            raise SourceError(
                f"sample {key!r}: partition={partition!r}, but the base's {rule.describe()} "
                f"puts the key in partition {owner!r} (a writer over a base keeps its rule)"
            )
        return owner
    if partition is not None:
        return check_key(partition, "partition")
    parent = key.rpartition("/")[0]
    if not parent:
        raise SourceError(
            f"sample {key!r}: the key has no parent path to take the partition from; "
            "give partition= (or a key like 'log1/000123')"
        )
    return parent


def sample_arrays(key: str, arrays: object) -> dict[str, np.ndarray[Any, Any]]:
    """``arrays`` checked: a non-empty mapping of names to storable NumPy arrays."""
    where = f"sample {key!r}"
    if not isinstance(arrays, Mapping):
        raise SourceError(f"{where}: arrays must be a mapping of names to NumPy arrays")
    if not arrays:
        raise SourceError(f"{where}: no arrays (an empty write)")
    out: dict[str, np.ndarray[Any, Any]] = {}
    for name, array in arrays.items():
        if not isinstance(name, str) or not name:
            raise SourceError(f"{where}: array name {name!r} is not a non-empty string")
        if isinstance(array, np.generic):
            array = np.asarray(array)
        if not isinstance(array, np.ndarray):
            raise SourceError(
                f"{where}: array {name!r} is a {type(array).__name__}, not a NumPy array"
            )
        check_array(name, array, where)
        out[name] = array
    return out


def sample_sidecar(key: str, meta: object) -> dict[str, Any] | None:
    """``meta`` as pack would read it back from a ``.json`` sidecar (checked the same way)."""
    if meta is None:
        return None
    where = f"sample {key!r}"
    if not isinstance(meta, Mapping):
        raise SourceError(
            f"{where}: meta must be a JSON object (a dict), not {type(meta).__name__}"
        )
    try:
        data = json.dumps(dict(meta), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise SourceError(f"{where}: meta is not JSON ({exc})") from exc
    return parse_sidecar(data, where)


@dataclass
class EncodedRecord:
    """One checked, encoded and verified sample (``payload`` None: skipped by its sidecar)."""

    key: str
    partition: str
    sha256: str
    sidecar: dict[str, Any] | None
    payload: bytes | None
    raw_size: int


def encode_record(
    key: object,
    arrays: object,
    meta: object,
    partition: str | None,
    recipe_level: int,
    keep_skipped: bool,
    coders: tuple[Encoder, Decoder] | None = None,
    rule: PartitionRule | None = None,
) -> EncodedRecord:
    """Check, encode and verify one sample (what the writer and ``write_bag`` do per record);
    ``rule``: the base's partition rule (see :func:`partition_of_key`)."""
    skey = check_key(key)
    path = partition_of_key(skey, partition, rule)
    sidecar = sample_sidecar(skey, meta)
    checked = sample_arrays(skey, arrays)
    if is_skipped(sidecar) and not keep_skipped:
        return EncodedRecord(skey, path, "", sidecar, None, 0)
    encoder, decoder = coders or (Encoder(recipe_level), Decoder())
    st, payload = encode_verified(encoder, decoder, checked, f"sample {skey!r}")
    return EncodedRecord(skey, path, source_sha256(checked), sidecar, payload, len(st))


def rule_owner(path: str, rule: PartitionRule | None) -> str:
    """The partition ``rule`` puts the keys of partition ``path`` in: ``path`` itself, unless
    an older version holds a nested partition its rule does not make (``p0/sub`` under depth
    1 belongs to ``p0``)."""
    if rule is None:
        return path
    return rule.partition_of(path + "/x.npz") or path
