"""A sample back in its source form: the bit-exact ``.npz`` bytes and the sidecar document.

Pure (no I/O): ``get --out``/``--out-dir`` and ``export --format npz`` write what these build.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..format.manifest import CORE_COLUMNS, SIDECAR_CLASH_PREFIX

__all__ = [
    "npz_bytes",
    "sidecar_json",
    "sidecar_of",
    "source_sha256",
]

# Every member's zip timestamp: np.savez stamps the current time, which would make the same
# arrays hash differently from one second to the next.
NPZ_DATE_TIME = (1980, 1, 1, 0, 0, 0)


def npz_bytes(arrays: Mapping[str, np.ndarray[Any, Any]], *, compress: bool = True) -> bytes:
    """An ``.npz`` holding ``arrays`` in their order, bit-exact (no pickling, any array name).

    Deterministic: the same arrays give the same bytes (fixed member timestamps); with
    ``compress=False`` it is the canonical npz form the writer hashes (:func:`source_sha256`).
    """
    return _npz(arrays, compress).getvalue()


def _npz(arrays: Mapping[str, np.ndarray[Any, Any]], compress: bool) -> io.BytesIO:
    buf = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    # Level 1: several times faster than zlib's default and within a few % of its size here.
    with zipfile.ZipFile(buf, "w", compression=method, compresslevel=1 if compress else None) as zf:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=NPZ_DATE_TIME)
            info.create_system = 3  # zipfile writes 0 on Windows: the same bytes everywhere
            info.compress_type = method
            info._compresslevel = 1 if compress else None  # type: ignore[attr-defined]
            with zf.open(info, "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.asarray(array), allow_pickle=False)
    return buf


def source_sha256(arrays: Mapping[str, np.ndarray[Any, Any]]) -> str:
    """The ``source_sha256`` of a sample given as arrays: SHA-256 of its canonical npz form.

    ``pack`` hashes the npz file it reads; a file written by ``npz_bytes(arrays,
    compress=False)`` hashes to this value, so both paths give the same ``data_rev``.
    """
    buf = _npz(arrays, compress=False)
    with buf.getbuffer() as view:  # no copy of the archive
        return hashlib.sha256(view).hexdigest()


def sidecar_of(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """Rebuild a sample's sidecar document from its manifest row (None if it had none).

    Flattened ``a.b`` columns nest again; NULL columns (fields other samples have) are dropped,
    so a sidecar's explicit ``null`` values do not come back.
    """
    if not row.get("has_sidecar"):
        return None
    doc: dict[str, Any] = {}
    for column, value in row.items():
        if column in CORE_COLUMNS or value is None:
            continue
        _put(doc, _field_name(column).split("."), value)
    return doc


def _field_name(column: str) -> str:
    # Sidecar fields named like core columns were stored as "sidecar.<name>".
    bare = column[len(SIDECAR_CLASH_PREFIX) :]
    return bare if column.startswith(SIDECAR_CLASH_PREFIX) and bare in CORE_COLUMNS else column


def _put(doc: dict[str, Any], parts: list[str], value: Any) -> None:
    node = doc
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            return
        node = child
    node[parts[-1]] = value


def sidecar_json(row: Mapping[str, Any]) -> bytes | None:
    """:func:`sidecar_of` as the JSON bytes ``get``/``export`` write (sorted keys)."""
    doc = sidecar_of(row)
    return None if doc is None else json.dumps(doc, sort_keys=True).encode()
