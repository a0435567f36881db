"""``Selection``: which samples of one dataset version a reader, keyset or split works on.

One object for the three ways to choose samples: a sandboxed SQL ``where`` over the manifest
columns, an explicit key list, or a published keyset (bound to the version's hash). Keysets,
the torch loader's sources and the train/valid split all resolve their choice through it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import SHOW_MAX, SelectionError
from ..progress.bar import plural
from . import sql

if TYPE_CHECKING:
    from ..meta.keysets import KeysetObject
    from ..torch import ShardDataset
    from .dataset import Dataset

__all__ = [
    "Selection",
    "in_listed_order",
    "keyset_selection",
    "require_disjoint",
]


@dataclass(frozen=True)
class Selection:
    """A choice of samples of one version: everything, a ``where``, ``keys`` or a ``keyset``.

    At most one of ``where``, ``keys`` and ``keyset``; none selects every sample.

    Parameters
    ----------
    dataset
        The version the selection applies to.
    where
        A sandboxed SQL boolean expression over the manifest columns (see :mod:`shardlake.query.sql`).
    keys
        Sample keys; duplicates select once.
    keyset
        The name of a keyset of the same root; it must be bound to this version.
    """

    dataset: Dataset
    where: str | None = None
    keys: tuple[str, ...] | None = None
    keyset: str | None = None
    _wanted: list[str] | None = field(default=None, init=False, repr=False, compare=False)
    _wanted_array: pa.Array | None = field(default=None, init=False, repr=False, compare=False)
    # The keyset's keys, where its object was read already (keyset_selection).
    _listing: Callable[[], pa.Array] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.where, self.keys, self.keyset)) > 1:
            raise SelectionError("select with at most one of where, keys and keyset")
        if self.keys is not None:
            object.__setattr__(self, "keys", tuple(self.keys))

    def __repr__(self) -> str:
        return f"Selection({self.dataset!r}, {self.describe()!r})"

    def describe(self) -> dict[str, Any]:
        """How the samples were chosen, as recorded in run and loader state documents."""
        if self.where is not None:
            return {"where": self.where}
        if self.keyset is not None:
            return {"keyset": self.keyset}
        if self.keys is not None:
            return {"keys": len(self.keys)}
        return {"all": True}

    def wanted_keys(self) -> list[str] | None:
        """The keys asked for (keyset or ``keys``, first occurrence order); None for a ``where``
        or everything."""
        if self._wanted is None and (self.keys is not None or self.keyset is not None):
            object.__setattr__(self, "_wanted", list(dict.fromkeys(self._listed())))
        return None if self._wanted is None else list(self._wanted)

    def _listed(self) -> Sequence[str]:
        if self.keyset is None:
            return self.keys or ()
        if self._listing is not None:
            return [str(k) for k in self.wanted_key_array().to_pylist()]  # type: ignore[union-attr]
        from ..meta.keysets import load_keyset

        keyset = load_keyset(self.dataset.store, self.keyset)
        keyset.check_version(self.dataset.version)
        return keyset.keys

    def mask(self, table: pa.Table) -> pa.BooleanArray:
        """The rows of a manifest ``table`` (of this version) that the selection takes."""
        if self.where is not None:
            return sql.select_mask(table, self.where)
        value_set = self._listed_array()
        if value_set is None:
            return pa.repeat(pa.scalar(True), table.num_rows)
        return pc.fill_null(pc.is_in(table.column("key"), value_set=value_set), False)

    def wanted_key_array(self) -> pa.Array | None:
        """:meth:`wanted_keys` as an Arrow string array (made once; a keyset read already
        gives it without a Python string a key)."""
        return self._listed_array()

    def _listed_array(self) -> pa.Array | None:
        if self._wanted_array is None and self._listing is not None:
            object.__setattr__(self, "_wanted_array", self._listing())
        if self._wanted_array is None:
            wanted = self.wanted_keys()
            if wanted is None:
                return None
            object.__setattr__(self, "_wanted_array", pa.array(wanted, pa.string()))
        return self._wanted_array

    def rows(
        self, columns: Sequence[str] | None = None, *, allow_missing: int | None = 0
    ) -> pa.Table:
        """The selected manifest rows (all columns, or ``columns``), in manifest order.

        ``allow_missing``: how many listed keys may be absent from the version (exactly; None
        accepts any number). An empty result is refused with :class:`SelectionError`.
        """
        # Only the columns asked for and those the selection reads are decoded (a catalog's
        # other columns, e.g. 64-character source digests, are most of its bytes).
        needed = self._reads(columns)
        if needed is not None:
            table = self.dataset.manifests(needed)
            try:
                mask = self.mask(table)
            except SelectionError:
                mask = None  # a name it reads was missed: every column gives rows or the message
            if mask is not None:
                return self._taken(table.filter(mask), columns, allow_missing)
        return self.rows_in(self.dataset.manifests(), columns, allow_missing=allow_missing)

    def _reads(self, columns: Sequence[str] | None) -> list[str] | None:
        """The columns :meth:`rows` of ``columns`` decodes; None: every column."""
        if not columns:
            return None
        if self.where is None:
            return [*columns, "key"]
        names = sql.referenced_names(self.where)
        return None if names is None else [*columns, *names]

    def rows_in(
        self,
        table: pa.Table,
        columns: Sequence[str] | None = None,
        *,
        allow_missing: int | None = 0,
    ) -> pa.Table:
        """:meth:`rows` of ``table``: this version's manifest rows, read already (with the
        columns the selection reads: ``key``, or those of its ``where``)."""
        return self._taken(table.filter(self.mask(table)), columns, allow_missing)

    def _taken(
        self, selected: pa.Table, columns: Sequence[str] | None, allow_missing: int | None
    ) -> pa.Table:
        if allow_missing is not None:
            self._check_missing(selected, allow_missing)
        if selected.num_rows == 0:
            raise SelectionError(
                f"{self._what()} is empty: it matches no sample in {self._version_name()}"
            )
        return selected if columns is None else selected.select(list(columns))

    def missing(self, selected: pa.Table | None = None) -> list[str]:
        """Listed keys the version lacks (always empty for ``where`` or everything)."""
        listed = self._listed_array()
        if listed is None or len(listed) == 0:
            return []
        if selected is None:
            selected = self._selected()
        if selected.num_rows == len(listed):
            return []  # each listed key selected (keys are unique within a version)
        keys = selected.column("key")
        present = keys.combine_chunks() if keys.num_chunks else pa.array([], pa.string())
        found = pc.is_in(listed, value_set=present.cast(listed.type))
        return [str(k) for k in listed.filter(pc.invert(found)).to_pylist()]

    def _selected(self) -> pa.Table:
        table = self.dataset.manifests()
        return table.filter(self.mask(table))

    def _check_missing(self, selected: pa.Table, allowed: int) -> None:
        missing = self.missing(selected)
        if len(missing) != allowed:
            shown = ", ".join(repr(k) for k in missing[:SHOW_MAX])
            raise SelectionError(
                f"{len(missing)} selected key(s) are not in {self._version_name()}"
                + (f" (allowed exactly {allowed})" if allowed else "")
                + (f": {shown}" if shown else ""),
                options=("allow_missing",) if missing else (),
            )

    def key_list(self) -> list[str]:
        """The selected keys, in manifest order."""
        return [str(k) for k in self.rows(["key"]).column("key").to_pylist()]

    def complement(self) -> Selection:
        """Every other sample of the version, as a key selection."""
        taken = set(self.key_list())
        every = self.dataset.manifests(columns=["key"]).column("key").to_pylist()
        return Selection(self.dataset, keys=tuple(k for k in every if k not in taken))

    def __len__(self) -> int:
        return int(self._selected().num_rows)

    def to_torch(self, *, batch_size: int, **options: Any) -> ShardDataset:
        """A :class:`shardlake.torch.ShardDataset` over exactly this selection (see
        :meth:`shardlake.Dataset.to_torch` for ``options``)."""
        chosen = {"where": self.where, "keys": self.keys, "keyset": self.keyset}
        chosen = {name: value for name, value in chosen.items() if value is not None}
        return self.dataset.to_torch(batch_size=batch_size, **chosen, **options)

    def _what(self) -> str:
        kind, value = next(iter(self.describe().items()))
        return "the selection" if kind == "all" else f"the selection ({kind} {value!r})"

    def _version_name(self) -> str:
        version = self.dataset.version
        return f"version {version.tag!r} of {self.dataset.store.url}"


def in_listed_order(table: pa.Table, listed: Sequence[str] | pa.Array | None) -> pa.Table:
    """The rows of ``table`` (with a ``key`` column) in the order of ``listed`` (a key list's
    or a keyset's order, first occurrences) instead of the manifest's; unchanged when
    ``listed`` is None. Keys ``listed`` lacks go last, in their order. ``listed`` holds each
    key once (:meth:`Selection.wanted_keys`)."""
    if listed is None or len(listed) == 0 or table.num_rows < 2:
        return table
    value_set = listed if isinstance(listed, pa.Array) else pa.array(listed, pa.string())
    keys = table.column("key")
    places = pc.index_in(keys, value_set=value_set.cast(keys.type))
    ranks = pc.fill_null(places, len(value_set)).to_numpy().astype(np.int64, copy=False)
    if bool(np.all(ranks[1:] > ranks[:-1])):
        return table
    return table.take(pa.array(np.argsort(ranks, kind="stable")))


def keyset_selection(dataset: Dataset, held: KeysetObject) -> Selection:
    """The selection of keyset object ``held`` (read already, refused unless bound to
    ``dataset``'s version); its keys are decoded only when the selection needs them."""
    held.head.check_version(dataset.version)
    selection = Selection(dataset, keyset=held.head.name)
    object.__setattr__(selection, "_listing", lambda: held.key_array(dataset.store))
    return selection


def require_disjoint(a: Selection, b: Selection, what: str = "the two selections") -> None:
    """Refuse two selections of different versions or sharing a key (:class:`SelectionError`)."""
    if a.dataset.version.hash != b.dataset.version.hash:
        raise SelectionError(f"{what} resolve different versions; give a version tag")
    overlap = set(a.key_list()) & set(b.key_list())
    if overlap:
        raise SelectionError(
            f"{what} share {plural(len(overlap), 'key')}, e.g. {sorted(overlap)[:3]}"
        )
