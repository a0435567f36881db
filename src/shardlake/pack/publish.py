"""The last pack stage: publish a version document and its commit record (see ``packer``)."""

from __future__ import annotations

from ..errors import ConflictError, ObjectsGoneError, OutcomeUnknownError
from ..meta.commits import read_state
from ..meta.gcwait import GcWait
from ..meta.leases import Lease, gone_error
from ..meta.publish import VersionBody, publish_version
from ..meta.state import RootState
from ..meta.versions import StoredVersion
from ..progress.bar import plural
from ..store import Store

__all__ = ["publish"]

PUBLISH_ATTEMPTS = 10
NOTHING = "nothing was published by this run - re-run it (finished revisions are reused)"


def publish(
    store: Store,
    body: VersionBody,
    state: RootState,
    lease: Lease | None = None,
    operation: str = "pack",
) -> StoredVersion:
    """Publish, tolerating unrelated commits that landed while the (possibly hours-long) pack ran.

    Another commit since ``state`` is retried against the new state: the version document is
    self-contained, so it does not depend on what else was published meanwhile, and
    :func:`~shardlake.meta.publish.publish_version` checks the tag still free and the base
    still live against each state it commits on (a taken tag is a conflict: exactly one of two
    racing packs of the same tag wins). A gc holding the root is waited for (up to the store's
    retry deadline, :class:`~shardlake.meta.gcwait.GcWait`); such waits are not attempts.
    ``lease`` (the run's) is named if objects the version references are gone. ``operation``
    names the run in a conflict (``pack``, ``writer``, ``write_bag``).
    """
    tag = body.tag
    since = state.seq
    if lease is not None:  # what publish writes: its version record and catalog objects
        lease.cover([f"versions/{tag}/", "catalog/"])
    gc_wait = GcWait(store)
    attempts = 0
    while True:
        state = gc_wait.until_free(state, what=NOTHING)
        try:
            return publish_version(store, body, state, operation=operation)
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
            fresh = read_state(store)
            if fresh.seq == state.seq:
                raise  # no later commit: the state itself refused it (tag taken, base pruned)
            if attempts >= PUBLISH_ATTEMPTS:
                raise ConflictError(
                    f"{store.url}: the commit log kept moving ({plural(PUBLISH_ATTEMPTS, 'attempt')}); "
                    "nothing was published - re-run (finished revisions are reused)"
                ) from exc
            state = fresh
            if not state.gc_locked():  # a gc lock is waited for (until_free), not an attempt
                attempts += 1
