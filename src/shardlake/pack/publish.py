"""The last pack stage: publish a version document and its commit record (see ``packer``)."""

from __future__ import annotations

from ..errors import ObjectsGoneError, OutcomeUnknownError
from ..meta.gcwait import commit_beside_gc
from ..meta.leases import Lease, gone_error
from ..meta.publish import VersionBody, publish_version
from ..meta.state import RootState
from ..meta.versions import StoredVersion
from ..store import Store

__all__ = ["NOTHING", "publish"]

NOTHING = "nothing was published by this run - re-run it (finished revisions are reused)"


def publish(
    store: Store,
    body: VersionBody,
    state: RootState,
    lease: Lease | None = None,
    operation: str = "pack",
) -> StoredVersion:
    """Publish, tolerating unrelated commits that landed while the (possibly hours-long) pack ran.

    Another commit since ``state`` is retried against the new state
    (:func:`~shardlake.meta.gcwait.commit_beside_gc`): the version document is self-contained,
    so it does not depend on what else was published meanwhile, and
    :func:`~shardlake.meta.publish.publish_version` checks the tag still free and the base
    still live against each state it commits on (a taken tag is a conflict: exactly one of two
    racing packs of the same tag wins). A gc holding the root is waited for (up to the store's
    retry deadline, :class:`~shardlake.meta.gcwait.GcWait`); such waits are not attempts.
    ``lease`` (the run's) is named if objects the version references are gone. ``operation``
    names the run in a conflict (``pack``, ``writer``, ``write_bag``).
    """
    tag = body.tag
    if lease is not None:  # what publish writes: its version record and catalog objects
        lease.cover([f"versions/{tag}/", "catalog/"])
    try:
        return commit_beside_gc(
            store,
            state,
            lambda current: publish_version(store, body, current, operation=operation),
            what=NOTHING,
            beside_writers=True,
        )
    except OutcomeUnknownError as exc:
        raise OutcomeUnknownError(
            f"{store.url}: publishing version {tag!r}: outcome unknown; run `shardlake "
            f"versions` to see whether {tag} exists ({exc})"
        ) from exc
    except ObjectsGoneError as exc:
        raise gone_error(
            store, exc.missing, since_seq=state.seq, lease=lease, what=NOTHING
        ) from exc
