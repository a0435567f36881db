"""The last pack stage: publish a version document and its commit record (see ``packer``)."""

from __future__ import annotations

from typing import Any

from ..errors import ConflictError, ObjectsGoneError, OutcomeUnknownError
from ..meta.commits import read_state
from ..meta.gcwait import GcWait
from ..meta.leases import Lease, gone_error
from ..meta.publish import publish_version
from ..meta.state import RootState
from ..meta.versions import StoredVersion
from ..progress.bar import plural
from ..store import Store

__all__ = ["publish"]

PUBLISH_ATTEMPTS = 10
NOTHING = "nothing was published by this run - re-run it (finished revisions are reused)"


def publish(
    store: Store,
    tag: str,
    body: dict[str, Any],
    state: RootState,
    base: str | None,
    lease: Lease | None = None,
    operation: str = "pack",
) -> StoredVersion:
    """Publish, tolerating unrelated commits that landed while the (possibly hours-long) pack ran.

    Another commit since ``state`` is retried against the new state as long as the tag is still
    free and the base is still live: the version document is self-contained, so it does not
    depend on what else was published meanwhile. A taken tag is a conflict: exactly one of two
    racing packs of the same tag wins. A gc holding the root is waited for (up to the store's
    retry deadline, :class:`~shardlake.meta.gcwait.GcWait`); such waits are not attempts.
    ``lease`` (the run's) is named if objects the version references are gone. ``operation``
    names the run in a conflict (``pack``, ``writer``, ``write_bag``).
    """
    since = state.seq
    if lease is not None:  # what publish writes: its version record and catalog objects
        lease.cover([f"versions/{tag}/", "catalog/"])
    gc_wait = GcWait(store)
    state = gc_wait.until_free(state, what=NOTHING)
    attempts = 0
    while True:
        try:
            return publish_version(store, tag, body, state)
        except OutcomeUnknownError as exc:
            raise OutcomeUnknownError(
                f"{store.url}: publishing version {tag!r}: outcome unknown; run `shardlake "
                f"versions` to see whether {tag} exists ({exc})"
            ) from exc
        except ObjectsGoneError as exc:
            raise gone_error(
                store, exc.missing, since_seq=since, lease=lease, what=NOTHING
            ) from exc
        except ConflictError as exc:
            state = read_state(store)
            if state.gc_locked():
                state = gc_wait.until_free(state, what=NOTHING)
            else:
                attempts += 1
            if tag in state.versions or tag in state.retired:
                raise ConflictError(
                    f"{store.url}: version tag {tag!r} was published by another writer while "
                    f"this {operation} ran; nothing was published by this run"
                ) from exc
            if base is not None and base not in state.versions:
                raise ConflictError(
                    f"{store.url}: base version {base!r} was pruned while this {operation} ran; "
                    "nothing was published - re-run (finished revisions are reused)"
                ) from exc
            if attempts >= PUBLISH_ATTEMPTS:
                raise ConflictError(
                    f"{store.url}: the commit log kept moving ({plural(PUBLISH_ATTEMPTS, 'attempt')}); "
                    "nothing was published - re-run (finished revisions are reused)"
                ) from exc
