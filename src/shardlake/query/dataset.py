"""``Dataset``: one version of a dataset root, opened for reading.

Its manifests (one parquet table per partition), sandboxed queries over them, selections, and
sample access (single ranged reads for :meth:`Dataset.get`, batched multi-range reads for
:meth:`Dataset.iter_samples`). :meth:`Dataset.to_torch` hands a selection to the loader.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import FormatError, IntegrityError, NotFoundError, UsageError
from ..format.codec import Decoder
from ..format.documents import PartitionEntry
from ..format.manifest import entry_mismatches
from ..meta.catalog import catalog_rows
from ..meta.versions import StoredVersion, load_version, load_version_by_hash
from ..read.manifests import read_entry_manifest
from ..read.payloads import PayloadRef, describe, fetch_payload, read_payloads
from ..source.pathlists import KeyMapping
from ..source.source_form import npz_bytes, sidecar_json
from ..store import Store
from . import sql

if TYPE_CHECKING:
    from ..meta.keysets import Keyset
    from ..torch import ShardDataset
    from .selection import Selection

__all__ = [
    "Dataset",
    "keyset_version",
    "resolve_version",
]

_MANIFEST_READERS = 16
_PAYLOAD_COLUMNS = ["key", "partition", "shard", "offset", "size", "crc32"]
# Payload bytes fetched per batched read in iter_samples (bounds memory).
BATCH_BYTES = 64 * 2**20


class Dataset:
    """One version of a dataset root, opened for reading.

    Get one from :meth:`shardlake.Root.dataset` . Thread-safe for
    reading; manifests are read once and cached.

    Parameters
    ----------
    store
        The root's store.
    version
        The published version to read.
    """

    @classmethod
    def open(cls, store: Store, version: str | None = None, keyset: str | None = None) -> Dataset:
        """``version`` (a tag or ``latest``) of the root in ``store``; not given: the version
        ``keyset`` is bound to, else ``latest``."""
        return cls(store, resolve_version(store, version, keyset))

    def __init__(self, store: Store, version: StoredVersion) -> None:
        self.store = store
        self.version = version
        self.entries: tuple[PartitionEntry, ...] = version.entries
        self._by_id = {e.id: e for e in self.entries}
        self._manifests: dict[str, pa.Table] = {}
        self._table: pa.Table | None = None  # every row, every column: read once per Dataset
        self._key_index: dict[str, tuple[str, int]] | None = None
        self._lock = threading.Lock()
        self._decoder = Decoder()

    def __repr__(self) -> str:
        return f"Dataset({self.store.url!r}, version={self.version.tag!r}, samples={self.version.samples})"

    @property
    def tag(self) -> str:
        """The version's tag."""
        return self.version.tag

    @property
    def hash(self) -> str:
        """The version's hash (of its version document)."""
        return self.version.hash

    def __len__(self) -> int:
        """The number of samples in the version."""
        return self.version.samples

    # --- partitions and manifests --------------------------------------------------------------

    def partition(self, pid: str) -> PartitionEntry:
        """The version's entry of partition ``pid`` (:class:`NotFoundError` if it has none)."""
        try:
            return self._by_id[pid]
        except KeyError:
            raise NotFoundError(
                f"{self.store.url}: version {self.version.tag!r} has no partition {pid!r}"
            ) from None

    def shard_key(self, pid: str, shard_index: int) -> str:
        """The store key of shard ``shard_index`` of partition ``pid``."""
        return self.partition(pid).shards[shard_index].key

    def manifest(self, pid: str) -> pa.Table:
        """The manifest of partition ``pid``, checked against the version entry naming it."""
        with self._lock:
            cached = self._manifests.get(pid)
        if cached is not None:
            return cached
        entry = self.partition(pid)
        table, meta = read_entry_manifest(self.store, entry)
        problems = entry_mismatches(entry, table, meta)
        if problems:
            raise FormatError(
                f"{self.store.key_url(entry.manifest)}: version {self.version.tag!r}: "
                + "; ".join(problems)
            )
        with self._lock:
            self._manifests[pid] = table
        return table

    def manifests(
        self, columns: Sequence[str] | None = None, pids: Iterable[str] | None = None
    ) -> pa.Table:
        """All (or the given) partitions' manifest rows as one table, from the version's catalog
        (see :mod:`shardlake.meta.catalog`); a few given partitions are read from their manifests.
        A column named twice is returned once."""
        columns = _column_list(columns, "manifests")
        if pids is None and (columns is None or self._table is not None):
            with self._lock:
                if self._table is None:
                    self._table = catalog_rows(self.store, self.version, None)
            table = self._table
            if columns is None:
                return table
            return table.select([c for c in columns if c in table.column_names])
        if pids is None or self.version.header.catalog is not None:
            return catalog_rows(
                self.store, self.version, columns, pids=None if pids is None else list(pids)
            )
        # Partition-id order, as the catalog reads them (one order for every read path).
        wanted = sorted(set(pids)) if pids is not None else sorted(e.id for e in self.entries)
        with ThreadPoolExecutor(max_workers=_MANIFEST_READERS) as pool:
            tables = list(pool.map(self.manifest, wanted))
        if columns is not None:
            cols = list(columns)
            tables = [t.select([c for c in cols if c in t.column_names]) for t in tables]
        if not tables:
            return pa.table({})
        return pa.concat_tables(tables, promote_options="permissive")

    # --- queries and selections --------------------------------------------------------------

    def query(self, where: str | None = None, columns: Sequence[str] | None = None) -> pa.Table:
        """Manifest rows satisfying ``where`` (a sandboxed SQL boolean expression; None: all).

        Parameters
        ----------
        where
            Boolean expression over the manifest columns, e.g. ``"NOT is_skipped"``; columns
            with dots need double quotes (``"skipping_info.label" = 3``).
        columns
            Columns to return (default: all).

        Returns
        -------
        pyarrow.Table
            The matching rows, in manifest order.
        """
        return sql.select(self.manifests(), where, _column_list(columns, "query"))

    def keys(self) -> list[str]:
        """Every sample key of the version, in manifest order."""
        return [str(k) for k in self.manifests(columns=["key"]).column("key").to_pylist()]

    def select(
        self,
        *,
        where: str | None = None,
        keys: Iterable[str] | None = None,
        keyset: str | None = None,
    ) -> Selection:
        """A :class:`~shardlake.Selection` of this version (at most one of the three)."""
        from .selection import Selection

        return Selection(
            self, where=where, keys=None if keys is None else tuple(keys), keyset=keyset
        )

    def require_keys(self, keys: Sequence[str]) -> None:
        """Raise :class:`NotFoundError` listing (up to 20) of ``keys`` the version lacks."""
        missing = self.select(keys=keys).missing()
        if missing:
            raise NotFoundError(
                f"{self.store.url}: version {self.version.tag!r} has no sample(s) "
                + ", ".join(repr(k) for k in missing[:20])
                + (f" ({len(missing)} in all)" if len(missing) > 20 else "")
            )

    def to_torch(self, *, batch_size: int, **options: Any) -> ShardDataset:
        """A :class:`shardlake.torch.ShardDataset` over this version (needs the torch extra).

        ``options`` are those of ``ShardDataset``: a selection (``where``, ``keys``,
        ``keyset``), ``seed``, ``shuffle``, ``num_workers``, ``rank``, ``world_size``, ...
        """
        from ..torch import ShardDataset  # torch is imported only when asked for

        return ShardDataset(self.store, self.version.tag, batch_size=batch_size, **options)

    # --- samples -----------------------------------------------------------------------------

    def _index(self) -> dict[str, tuple[str, int]]:
        if self._key_index is None:
            index: dict[str, tuple[str, int]] = {}
            table = self.manifests(columns=["key", "partition"])
            row_in: dict[str, int] = {}
            for key, pid in zip(
                table.column("key").to_pylist(), table.column("partition").to_pylist(), strict=True
            ):
                index[key] = (pid, row_in.get(pid, 0))
                row_in[pid] = row_in.get(pid, 0) + 1
            self._key_index = index
        return self._key_index

    def locate(self, key: str) -> dict[str, Any]:
        """The manifest row of ``key`` as a dict (core and sidecar columns).

        A key is its source path without ``.npz``, so it starts with its partition's path: only
        that partition's manifest is read. The full key index is the fallback for partition rules
        that do not nest that way.
        """
        for entry in self.entries:
            if entry.path and key.startswith(entry.path.rstrip("/") + "/"):
                table = self.manifest(entry.id)
                rows = table.filter(pc.equal(table.column("key"), key))
                if rows.num_rows:
                    return {name: rows.column(name)[0].as_py() for name in rows.column_names}
        try:
            pid, row = self._index()[key]
        except KeyError:
            raise NotFoundError(
                f"{self.store.url}: version {self.version.tag!r} has no sample {key!r}"
            ) from None
        table = self.manifest(pid)
        return {name: table.column(name)[row].as_py() for name in table.column_names}

    def read_payload(self, row: dict[str, Any]) -> bytes:
        """One sample's compressed payload by a single ranged read, checked against its CRC-32
        (re-read on a mismatch; see :mod:`shardlake.read.payloads`)."""
        return fetch_payload(self.store, self._ref(row))

    def _ref(self, row: dict[str, Any]) -> PayloadRef:
        shard = self.shard_key(row["partition"], row["shard"])
        return PayloadRef(
            shard, int(row["offset"]), int(row["size"]), int(row["crc32"]), row["key"]
        )

    def get(self, key: str) -> dict[str, np.ndarray[Any, Any]]:
        """The arrays of sample ``key``, fetched with one ranged read and checked.

        Parameters
        ----------
        key
            The sample key: its source path without ``.npz``.

        Returns
        -------
        dict[str, numpy.ndarray]
            The arrays in their stored order, bit-exact (dtype, shape and bytes as packed).

        Raises
        ------
        NotFoundError
            The version has no sample ``key``.
        IntegrityError
            The stored bytes do not match their checksum (after one re-read).
        """
        row = self.locate(key)
        return self._decoder.decode(self.read_payload(row), f"{self.store.url} key {key!r}")

    def iter_samples(
        self, keys: Iterable[str] | None = None, *, batch_bytes: int = BATCH_BYTES
    ) -> Iterator[tuple[str, dict[str, np.ndarray[Any, Any]]]]:
        """``(key, arrays)`` for ``keys`` (default: every sample, in manifest order), fetching
        payloads in batched multi-range reads of about ``batch_bytes``."""
        rows = self._all_rows() if keys is None else self._rows_of(list(keys))
        batch: list[dict[str, Any]] = []
        size = 0
        for row in rows:
            batch.append(row)
            size += int(row["size"])
            if size >= batch_bytes:
                yield from self._fetch(batch)
                batch, size = [], 0
        if batch:
            yield from self._fetch(batch)

    def iter_files(self, keys: Sequence[str]) -> Iterator[SampleFile]:
        """Each of ``keys`` as the files it was packed from: its arrays, a bit-exact ``.npz``
        and its ``.json`` sidecar (what ``get --out-dir`` and an npz export write)."""
        self.require_keys(keys)  # every key checked before the first one is yielded
        rows = {row["key"]: row for row in self.select(keys=keys).rows().to_pylist()}
        for key, arrays in self.iter_samples(keys):
            yield SampleFile(key, arrays, rows[key])

    def keys_from_file(self, path: str, *, strip_prefix: str | None = None) -> KeyMapping:
        """The keys a local key list names in this version (``-``: stdin): text, or a JSON list
        of keys or ``.npz`` paths; absolute paths map to keys by ``strip_prefix``, without one
        by the version's source namespace. Entries naming no key are in ``unmapped``."""
        from ..meta.keysets import read_key_list

        namespace = None if strip_prefix is not None else self.version.record.source_namespace
        return read_key_list(path, strip_prefix=strip_prefix, source=namespace)

    def _all_rows(self) -> Iterator[dict[str, Any]]:
        for entry in self.entries:
            yield from self.manifest(entry.id).select(_PAYLOAD_COLUMNS).to_pylist()

    def _rows_of(self, keys: list[str]) -> list[dict[str, Any]]:
        """The payload rows of ``keys``, in their order; one pass over the manifests."""
        if not keys:
            return []
        self.require_keys(keys)
        table = self.select(keys=keys).rows(_PAYLOAD_COLUMNS)
        by_key = {row["key"]: row for row in table.to_pylist()}
        return [by_key[key] for key in keys]

    def _fetch(
        self, rows: list[dict[str, Any]]
    ) -> Iterator[tuple[str, dict[str, np.ndarray[Any, Any]]]]:
        for result in read_payloads(self.store, [self._ref(r) for r in rows]):
            where = describe(self.store, result.ref)
            if result.error is not None:
                raise result.error
            if result.payload is None:
                raise IntegrityError(f"{where}: {result.problem} ({result.kind})")
            yield result.ref.key, self._decoder.decode(result.payload, where)


class SampleFile:
    """One sample as files: ``key``, ``arrays``, ``npz`` (bit-exact ``.npz`` bytes) and
    ``sidecar`` (the ``.json`` sidecar's bytes, None without one)."""

    def __init__(self, key: str, arrays: dict[str, np.ndarray[Any, Any]], row: dict[str, Any]):
        self.key = key
        self.arrays = arrays
        self._row = row

    @property
    def npz(self) -> bytes:
        return npz_bytes(self.arrays)

    @property
    def sidecar(self) -> bytes | None:
        return sidecar_json(self._row)


def resolve_version(store: Store, version: str | None, keyset: str | None = None) -> StoredVersion:
    """``version``, or with ``None`` the version ``keyset`` is bound to (a keyset knows its
    version, even once pruned), else ``latest``. A ``keyset`` bound to another version than the
    one named is refused (it was silently ignored)."""
    if keyset is None:
        return load_version(store, version or "latest")
    from ..meta.keysets import load_keyset

    return keyset_version(store, version, load_keyset(store, keyset))


def keyset_version(store: Store, version: str | None, bound: Keyset) -> StoredVersion:
    """``version`` (None: the version keyset ``bound`` is bound to), refused unless ``bound``
    is bound to it."""
    if version is None:
        return load_version_by_hash(store, bound.version_tag, bound.version_hash)
    chosen = load_version(store, version)
    bound.check_version(chosen)
    return chosen


def _column_list(columns: Sequence[str] | None, where: str) -> list[str] | None:
    """``columns`` as a list with each name once (a name twice would give a table with two
    columns of one name, which Arrow cannot combine); a lone string is refused, not split."""
    if columns is None:
        return None
    if isinstance(columns, str):
        raise UsageError(f"{where}: columns must be a list of names, not the string {columns!r}")
    return list(dict.fromkeys(columns))
