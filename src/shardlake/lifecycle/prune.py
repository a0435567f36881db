"""``prune-version``: prune version tags (their bytes go at the next ``gc``)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from ..meta.commits import read_state
from ..meta.gcwait import commit_beside_gc
from ..meta.state import RootState
from ..meta.versions import prune_versions
from ..store import Store

__all__ = [
    "PruneReport",
    "prune",
]


@dataclass(frozen=True)
class PruneReport:
    """What a prune did: the tags it pruned, the live tags left and what ``latest`` names."""

    pruned: list[str]
    live: list[str]
    latest: str | None
    # pruned tag -> the keysets still bound to it (gc keeps its bytes until they are deleted)
    pinned: dict[str, list[str]] = field(default_factory=dict)

    @property
    def retired(self) -> list[str]:
        """Deprecated alias of :attr:`pruned` (removed in the next release)."""
        warnings.warn(
            "PruneReport.retired is deprecated: use PruneReport.pruned",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.pruned

    @classmethod
    def of(
        cls, pruned: list[str], state: RootState, pinned: dict[str, list[str]] | None = None
    ) -> PruneReport:
        return cls(pruned, list(state.versions), state.latest, pinned or {})

    def to_json(self) -> dict[str, Any]:
        return {
            "pruned": self.pruned,
            "retired": self.pruned,  # the old name, kept one release for scripts that read it
            "latest": self.latest,
            "live": self.live,
            "pinned_by_keysets": self.pinned,
        }


def prune(store: Store, tags: Sequence[str], *, force: bool = False) -> PruneReport:
    """Prune ``tags`` in one commit; their bytes go at the next ``gc``. Pruning the version
    ``latest`` points to needs ``force`` (``latest`` then moves to the newest remaining
    version). Unknown tags are refused."""
    if not tags:
        raise UsageError("name at least one version tag to prune", options=("tags",))
    tags = list(dict.fromkeys(tags))
    store.ensure_create_enforced()
    # A prune references nothing new: it may commit while gc holds the root, and only a race
    # with gc's own commits is retried.
    state = commit_beside_gc(
        store,
        read_state(store),
        lambda _current: prune_versions(store, list(tags), force=force),
        what="nothing was pruned - re-run it",
        wait=False,
    )
    return PruneReport.of(tags, state, _pinning_keysets(store, tags))


def _pinning_keysets(store: Store, tags: Sequence[str]) -> dict[str, list[str]]:
    """For each of ``tags`` some live keyset is bound to, those keysets' names."""
    from ..meta.keysets import list_keysets

    out: dict[str, list[str]] = {}
    for keyset in list_keysets(store):
        if keyset.version_tag in tags:
            out.setdefault(keyset.version_tag, []).append(keyset.name)
    return {tag: sorted(names) for tag, names in out.items()}
