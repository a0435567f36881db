"""The last pack stage: publish a version document and its commit record (see ``packer``)."""

from __future__ import annotations

from typing import Any

from ..errors import ConflictError, OutcomeUnknownError
from ..meta.commits import read_state
from ..meta.publish import publish_version
from ..meta.state import RootState, describe_lock
from ..meta.versions import StoredVersion
from ..store import Store

__all__ = ["publish"]

PUBLISH_ATTEMPTS = 10


def publish(
    store: Store, tag: str, body: dict[str, Any], state: RootState, base: str | None
) -> StoredVersion:
    """Publish, tolerating unrelated commits that landed while the (possibly hours-long) pack ran.

    Another commit since ``state`` is retried against the new state as long as the tag is still
    free and the base is still live: the version document is self-contained, so it does not
    depend on what else was published meanwhile. A taken tag is a conflict: exactly one of two
    racing packs of the same tag wins.
    """
    for _ in range(PUBLISH_ATTEMPTS):
        try:
            return publish_version(store, tag, body, state)
        except OutcomeUnknownError as exc:
            raise OutcomeUnknownError(
                f"{store.url}: publishing version {tag!r}: outcome unknown; run `shardlake "
                f"versions` to see whether {tag} exists ({exc})"
            ) from exc
        except ConflictError as exc:
            state = read_state(store)
            if state.gc_locked():
                raise ConflictError(
                    f"{store.url}: {describe_lock(state.gc_lock)}; nothing was published by this "
                    "run - re-run after that (finished revisions are reused), or break the gc "
                    "lock if that gc is dead",
                    options=("break_lock",),
                ) from exc
            if tag in state.versions or tag in state.retired:
                raise ConflictError(
                    f"{store.url}: version tag {tag!r} was published by another writer while "
                    "this pack ran; nothing was published by this run"
                ) from exc
            if base is not None and base not in state.versions:
                raise ConflictError(
                    f"{store.url}: base version {base!r} was pruned while this pack ran; "
                    "nothing was published - re-run (finished revisions are reused)"
                ) from exc
    raise ConflictError(
        f"{store.url}: the commit log kept moving ({PUBLISH_ATTEMPTS} attempts); nothing was "
        "published - re-run (finished revisions are reused)"
    )
