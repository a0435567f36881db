"""A source's selected manifest rows, and its keys read apart from row columns that came from
the node-local catalog cache (:mod:`shardlake.torch.sources`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import IntegrityError, SelectionError
from ..meta.catalog import load_catalog
from ..query.selection import in_listed_order

if TYPE_CHECKING:
    from ..meta.keysets import KeysetObject
    from ..query.dataset import Dataset

__all__ = ["NARROW_COLUMNS", "checked_keys", "keyset_keys", "read_rows"]

# Integer columns the catalog narrows as it decodes them (int32 where their values fit).
NARROW_COLUMNS = ("offset", "size", "raw_size", "crc32")


class RowColumns(Protocol):
    """What these functions read of :class:`~shardlake.torch.sources.SourceColumns`."""

    partition: np.ndarray[Any, Any]
    partition_names: list[str]

    def __len__(self) -> int: ...


def keyset_keys(held: KeysetObject, ds: Dataset, columns: RowColumns) -> pa.ChunkedArray:
    """A keyset selection's keys, its rows came from the node-local cache: the keyset's own,
    first occurrences in its order (the rows' order: each selected once, in listed order)."""
    keys = held.key_array(ds.store)
    if len(keys) != len(columns):
        raise IntegrityError(
            f"{held.where}: keyset {held.head.name!r} has {len(keys)} keys, its cached row "
            f"columns {len(columns)} rows; remove the node-local catalog cache "
            "($SHARDLAKE_CATALOG_CACHE) and report this"
        )
    return pa.chunked_array([keys])


def checked_keys(ds: Dataset, columns: RowColumns) -> pa.ChunkedArray:
    """The version's keys, read apart from its row columns (those came from the node-local
    cache): refused unless they come in the rows' order, partition by partition, so a key
    never labels another sample's arrays."""
    table = ds.manifests(["key", "partition"])
    names = pa.array(columns.partition_names, pa.string())
    part = pc.index_in(table.column("partition"), value_set=names)
    got = part.to_numpy(zero_copy_only=False) if len(table) else np.zeros(0, np.int64)
    if len(got) != len(columns) or not np.array_equal(got, columns.partition):
        raise IntegrityError(
            f"{ds.store.url}: version {ds.version.tag!r}: its keys do not come in the order of "
            "its cached row columns; remove the node-local catalog cache "
            "($SHARDLAKE_CATALOG_CACHE) and report this"
        )
    return table.column("key")


def read_rows(
    ds: Dataset,
    selected: Any,
    where: str | None,
    wanted: list[str],
    meta_columns: Sequence[str],
    everything: bool,
) -> pa.Table:
    # Without a where only the loader's columns and the keys are decoded (a catalog segment's
    # other columns, e.g. 64-character source digests, are most of its bytes), the partition
    # column as parquet's dictionary codes (no string a row), integer columns narrowed row
    # group by row group (no int64 copy of the whole column).
    if where is None:
        table = load_catalog(ds.store, ds.version).rows(
            wanted, partition_codes=True, narrow=NARROW_COLUMNS
        )
    else:
        table = ds.manifests()
    columns = table.column_names
    missing = [c for c in meta_columns if c not in columns]
    if missing:
        columns = ds.manifests().column_names
        raise SelectionError(
            f"unknown meta_columns {', '.join(missing)}; manifest columns: {', '.join(columns)}"
        )
    if everything and table.num_rows:
        return table  # nothing is filtered
    table = selected.rows_in(table, None if where else [c for c in wanted if c in columns])
    return in_listed_order(table, selected.wanted_key_array())
