"""``root.keysets``: the keyset verbs of a root, grouped (create, list, get, rebase, delete,
check_disjoint), as delta-rs groups ``optimize`` and ``alter``."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..store import Store

if TYPE_CHECKING:
    from ..meta.keysets import Keyset
    from ..query.keyset_build import DisjointReport, KeysetReport

__all__ = [
    "Keysets",
    "deprecated",
]


def deprecated(old: str, new: str) -> None:
    """Warn once per call site that ``Root.<old>`` is now ``Root.<new>`` (kept one release)."""
    warnings.warn(f"Root.{old} is deprecated: use Root.{new}", DeprecationWarning, stacklevel=3)


class Keysets:
    """The keyset verbs of a root, grouped as ``root.keysets`` (as delta-rs groups
    ``optimize`` and ``alter``): named, immutable sets of sample keys bound to one version.

    Calling the group (``root.keysets()``) lists the keysets, as ``Root.keysets()`` did
    before it was a group; deprecated: use :meth:`list`.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def __repr__(self) -> str:
        return f"Keysets({self.store.url!r})"

    def __call__(self) -> list[Keyset]:
        warnings.warn(
            "Root.keysets() is deprecated: use Root.keysets.list()",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.list()

    def list(self) -> list[Keyset]:
        """Every keyset of the root."""
        from ..meta.keysets import list_keysets

        return list_keysets(self.store)

    def get(self, name: str) -> Keyset:
        """Keyset ``name`` (:class:`~shardlake.errors.NotFoundError` if there is none)."""
        from ..meta.keysets import load_keyset

        return load_keyset(self.store, name)

    def create(
        self,
        name: str,
        *,
        version: str = "latest",
        where: str | None = None,
        keys: Sequence[str] | None = None,
        allow_unmatched: int | None = None,
        strip_prefix: str | None = None,
        key_file: str | None = None,
    ) -> Keyset:
        """Select samples of ``version`` and publish them as keyset ``name`` (immutable).

        Exactly one of ``where``, ``keys`` and ``key_file`` (a local key list: text, or a JSON
        list of keys or ``.npz`` paths; ``-`` is stdin). ``strip_prefix`` maps absolute paths
        of the list to keys (default: the version's source namespace). ``allow_unmatched``:
        exactly this many entries may match no key.
        """
        from ..query.keyset_build import create_keyset

        self.store.require_writable("create keyset")
        return create_keyset(
            self.store,
            name,
            version=version,
            where=where,
            keys=keys,
            key_file=key_file,
            strip_prefix=strip_prefix,
            allow_unmatched=allow_unmatched,
        )

    def rebase(
        self, name: str, version: str, *, new_name: str, strict: bool = False
    ) -> KeysetReport:
        """Publish keyset ``new_name`` bound to ``version`` with the keys of keyset ``name``
        that version still has (``name`` is not modified); ``strict``: fail instead when a key
        is dropped or its payload changed."""
        from ..query.keyset_build import rebase_keyset

        self.store.require_writable("rebase keyset")
        return rebase_keyset(self.store, name, version, new_name=new_name, strict=strict)

    def delete(self, name: str) -> Keyset:
        """Retire keyset ``name`` (a tombstone, then its object goes); the next
        :meth:`Root.gc` releases what only it pinned. Returns the retired keyset."""
        from ..meta.keysets import delete_keyset

        self.store.require_writable("delete keyset")
        return delete_keyset(self.store, name)

    def check_disjoint(self, a: str, b: str) -> DisjointReport:
        """Compare keysets ``a`` and ``b`` (``overlap`` counts the keys in both)."""
        from ..query.keyset_build import keyset_overlap

        return keyset_overlap(self.store, a, b)
