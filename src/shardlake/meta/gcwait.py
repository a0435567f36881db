"""Commits wait for a gc that holds the root (its lock is a lease of about a minute).

While gc deletes, the root's state carries its lock and nothing may publish. A writer that
finds the lock waits, with backoff, until gc releases it or its lease lapses, for at most the
store's retry deadline (``SHARDLAKE_RETRY_DEADLINE``, the ``retry_deadline`` storage option);
only a gc that outlives that fails the commit, with a :class:`GcHoldsRootError` saying so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from ..errors import ConflictError, GcHoldsRootError, ObjectsGoneError
from ..progress.bar import plural
from ..store import Store
from .commits import read_state
from .state import RootState, describe_lock

__all__ = ["GcWait", "commit_beside_gc", "wait_for_gc"]

T = TypeVar("T")

FIRST_PAUSE_S = 0.1
MAX_PAUSE_S = 5.0


class GcWait:
    """One run's budget for waiting on gc: the store's retry deadline, shared by every wait of
    the run (a gc loop cannot hold a publish off forever by taking the root again and again)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.budget_s = store.retry.deadline
        self.waited_s = 0.0
        self.waits = 0

    def until_free(self, state: RootState | None = None, *, what: str) -> RootState:
        """The root's state once no gc holds it; :class:`GcHoldsRootError` past the budget."""
        state = read_state(self.store) if state is None else state
        pause = FIRST_PAUSE_S
        started = time.monotonic()
        if state.gc_locked():
            self.waits += 1
        while state.gc_locked():
            left = self.budget_s - self.waited_s - (time.monotonic() - started)
            if left <= 0:
                lock = describe_lock(state.gc_lock)
                raise GcHoldsRootError(
                    f"{self.store.url}: {lock}, and it held the root past this run's retry "
                    f"deadline ({self.budget_s:g}s waited; SHARDLAKE_RETRY_DEADLINE or the "
                    f"retry_deadline storage option); {what}",
                    options=("break_lock",),
                )
            lock_left = state.gc_lock.expires_at - time.time() if state.gc_lock else 0.0
            nap = max(0.01, min(pause, left, lock_left + 0.05))
            time.sleep(nap)
            pause = min(pause * 2, MAX_PAUSE_S)
            state = read_state(self.store)
        self.waited_s += time.monotonic() - started
        return state


def wait_for_gc(store: Store, state: RootState | None = None, *, what: str) -> RootState:
    """:meth:`GcWait.until_free` with a fresh budget."""
    return GcWait(store).until_free(state, what=what)


COMMIT_ATTEMPTS = 10


def _published(state: RootState) -> tuple[object, ...]:
    """What a state says about versions (gc's lock, renew and unlock commits change none of it)."""
    return (state.versions, state.retired, state.latest)


def commit_beside_gc(
    store: Store,
    state: RootState,
    commit: Callable[[RootState], T],
    *,
    what: str,
    wait: bool = True,
    beside_writers: bool = False,
) -> T:
    """``commit(state)``, run again on the new state when it lost a race to gc's own commits,
    or with ``beside_writers`` to any commit (pack and the writers: ``commit`` then checks what
    it needs of the new state, as ``publish_version`` checks the tag and the base).

    A conflict is retried only when the log moved (a conflict over an unmoved log is the
    state refusing the commit: the caller's), and without ``beside_writers`` only when the
    versions are what ``state`` said (only gc committed meanwhile). With ``wait`` a gc holding
    the root is waited for first (:class:`GcWait`; such rounds are not attempts); a prune,
    which references nothing new, passes ``wait=False``.
    """
    gc_wait = GcWait(store)
    last: ConflictError | None = None
    attempts = 0
    while attempts < COMMIT_ATTEMPTS:
        if wait:
            state = gc_wait.until_free(state, what=what)
        try:
            return commit(state)
        except ObjectsGoneError:
            raise
        except ConflictError as exc:
            fresh = read_state(store)
            if fresh.seq == state.seq:
                raise
            if not beside_writers and _published(fresh) != _published(state):
                raise  # another writer's commit: the caller's conflict
            if not (wait and fresh.gc_locked()):
                attempts += 1
            state, last = fresh, exc
    raise ConflictError(
        f"{store.url}: the commit log kept moving ({plural(COMMIT_ATTEMPTS, 'attempt')}); {what}"
    ) from last
