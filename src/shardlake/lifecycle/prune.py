"""``prune-version``: retire version tags (their bytes go at the next ``gc``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from ..meta.versions import RootState, retire_versions
from ..store import Store

__all__ = [
    "PruneReport",
    "prune",
]


@dataclass(frozen=True)
class PruneReport:
    """What a prune did: the tags it retired, the live tags left and what ``latest`` names."""

    retired: list[str]
    live: list[str]
    latest: str | None
    # retired tag -> the keysets still bound to it (gc keeps its bytes until they are deleted)
    pinned: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def of(
        cls, retired: list[str], state: RootState, pinned: dict[str, list[str]] | None = None
    ) -> PruneReport:
        return cls(retired, list(state.versions), state.latest, pinned or {})

    def to_json(self) -> dict[str, Any]:
        return {
            "retired": self.retired,
            "latest": self.latest,
            "live": self.live,
            "pinned_by_keysets": self.pinned,
        }


def prune(store: Store, tags: Sequence[str], *, force: bool = False) -> PruneReport:
    """Retire ``tags`` in one commit; their bytes go at the next ``gc``. Pruning the version
    ``latest`` points to needs ``force`` (``latest`` then moves to the newest remaining
    version). Unknown tags are refused."""
    if not tags:
        raise UsageError("name at least one version tag to retire", options=("tags",))
    tags = list(dict.fromkeys(tags))
    store.ensure_create_enforced()
    state = retire_versions(store, tags, force=force)
    return PruneReport.of(tags, state, _pinning_keysets(store, tags))


def _pinning_keysets(store: Store, tags: Sequence[str]) -> dict[str, list[str]]:
    """For each of ``tags`` some live keyset is bound to, those keysets' names."""
    from ..meta.keysets import list_keysets

    out: dict[str, list[str]] = {}
    for keyset in list_keysets(store):
        if keyset.version_tag in tags:
            out.setdefault(keyset.version_tag, []).append(keyset.name)
    return {tag: sorted(names) for tag, names in out.items()}
