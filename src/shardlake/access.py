"""Random access without a DataLoader: sandboxed queries, single samples, key lists, npz output.

Built on :class:`shardlake.dataset.Dataset` (key lookup, batched payload reads); adds what the
CLI (``query``, ``get``) and the lifecycle commands need: sandboxed queries, bit-exact npz
writing and sidecar reconstruction.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from . import sql
from .dataset import Dataset
from .errors import NotFoundError
from .format.manifest import CORE_COLUMNS, SIDECAR_CLASH_PREFIX
from .format.npz import load_npz as load_npz  # the one strict reader (re-exported)

Arrays = dict[str, np.ndarray[Any, Any]]


def query(ds: Dataset, where: str | None, columns: Sequence[str] | None = None) -> pa.Table:
    """Manifest rows of ``ds`` satisfying the sandboxed ``where`` (see :mod:`shardlake.sql`)."""
    return sql.select(ds.manifests(), where, columns)


def npz_bytes(arrays: Mapping[str, np.ndarray[Any, Any]], *, compress: bool = True) -> bytes:
    """An ``.npz`` holding ``arrays`` in their order, bit-exact (no pickling, any array name)."""
    buf = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    # Level 1: several times faster than zlib's default and within a few % of its size here.
    with zipfile.ZipFile(buf, "w", compression=method, compresslevel=1 if compress else None) as zf:
        for name, array in arrays.items():
            with zf.open(name + ".npy", "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.asarray(array), allow_pickle=False)
    return buf.getvalue()


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
        name = column
        # Sidecar fields named like core columns were stored as "sidecar.<name>".
        if (
            column.startswith(SIDECAR_CLASH_PREFIX)
            and column[len(SIDECAR_CLASH_PREFIX) :] in CORE_COLUMNS
        ):
            name = column[len(SIDECAR_CLASH_PREFIX) :]
        parts = name.split(".")
        node = doc
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                break
            node = child
        else:
            node[parts[-1]] = value
    return doc


def sidecar_json(row: Mapping[str, Any]) -> bytes | None:
    doc = sidecar_of(row)
    return None if doc is None else json.dumps(doc, sort_keys=True).encode()


def require_keys(ds: Dataset, keys: Sequence[str]) -> None:
    """Raise :class:`NotFoundError` listing (up to 20) keys ``ds`` lacks."""
    known = set(ds.manifests(columns=["key"]).column("key").to_pylist())
    missing = [k for k in keys if k not in known]
    if missing:
        raise NotFoundError(
            f"{ds.store.url}: version {ds.version.tag!r} lacks {len(missing)} key(s): "
            + ", ".join(repr(k) for k in missing[:20])
        )
