"""gc's lock is a lease: a lost reply never makes gc refuse itself, a dead holder's lock expires
or is broken by the operator, and a publish racing a live gc is refused with the real cause."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from support.lifecycle import pack_small

import shardlake
from shardlake import Store
from shardlake.cli.main import main
from shardlake.errors import AlreadyExistsError, ConflictError, GcHoldsRootError
from shardlake.format.layout import COMMITS_DIR, commit_key
from shardlake.lifecycle.gc import new_lock
from shardlake.meta.commits import commit_state, read_commit, read_state
from shardlake.meta.state import RootState
from shardlake.testing import synth_corpus
from shardlake.testing.fixtures import StoreLocation

JUNK = "data/junk/x/shard-000000.tar"


class LostLockReply(Store):
    """The gc-lock commit lands, but its reply is lost and the read-back says "exists"."""

    lost = 0

    def create(self, key: str, data: bytes) -> None:
        super().create(key, data)
        if key.startswith(COMMITS_DIR + "/") and b'"gc-lock"' in data and not self.lost:
            self.lost += 1
            raise AlreadyExistsError(f"{key}: exists (the retried create found it)")


def _root(tmp_path: Path) -> StoreLocation:
    src = tmp_path / "src"
    synth_corpus(src, 2, 2, seed=25, neighbors=2, lanes=4)
    location = StoreLocation("local", str(tmp_path / "root"))
    pack_small(location, src)
    return location


def _hold(store: Store, expires_in: float, owner: str = "alice@host pid 1") -> RootState:
    state = read_state(store)
    lock = replace(new_lock(), owner=owner, expires_at=time.time() + expires_in)
    locked = RootState(state.seq + 1, state.versions, state.retired, state.latest, lock)
    return commit_state(store, state, locked, "gc-lock", {})


def test_lost_reply_on_gcs_own_lock_is_settled_by_reading_back(tmp_path: Path) -> None:
    location = _root(tmp_path)
    store = LostLockReply(location.url)
    store.write(JUNK, b"x")
    report = shardlake.open(store).gc(grace_s=0)
    assert store.lost == 1 and [o.key for o in report.garbage] == [JUNK]
    assert read_state(store).gc_lock is None  # and it released its own lock
    lock = read_commit(store, read_state(store).seq - 1).gc_lock
    assert lock is not None and "pid" in lock.owner and lock.expires_at > time.time()


def test_dead_holders_lock_expires_and_a_live_one_outlasting_the_deadline_fails_publishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDLAKE_RETRY_DEADLINE", "1")  # how long a publish waits for gc
    location = _root(tmp_path)
    store = location.open()
    src = tmp_path / "src"
    _hold(store, 600)
    started = time.monotonic()
    past = r"gc holds the root until .* \(owner alice@host pid 1\), and it held the root past"
    with pytest.raises(GcHoldsRootError, match=past + r" this run's retry deadline \(1s waited"):
        pack_small(location, src, tag="v2")
    assert 1 <= time.monotonic() - started < 30  # it waited for the lease, then gave up
    assert "v2" not in read_state(store).versions
    with pytest.raises(GcHoldsRootError, match=past):
        store.write(JUNK, b"x")
        shardlake.open(store).gc(grace_s=0)
    # The holder died: once its lease has expired the next gc takes the root over.
    _hold(store, -1)
    assert [o.key for o in shardlake.open(store).gc(grace_s=0).garbage] == [JUNK]
    pack_small(location, src, tag="v2")
    assert read_state(store).latest == "v2"


def test_publish_racing_a_live_gc_waits_for_it(tmp_path: Path) -> None:
    location = _root(tmp_path)
    src = tmp_path / "src"
    outcome: list[str] = []
    threads: list[threading.Thread] = []

    def run_pack() -> None:
        try:
            pack_small(location, src, tag="v2")
            outcome.append("published")
        except ConflictError as exc:  # pragma: no cover - the failure the test looks for
            outcome.append(str(exc))

    class PackDuringDelete(Store):
        def delete(self, key: str) -> None:
            if key == JUNK and not threads:  # a deletion under the lock (not the probe)
                threads.append(threading.Thread(target=run_pack))
                threads[0].start()
                time.sleep(1.0)  # the pack reaches its publish and finds the lock
            super().delete(key)

    store = PackDuringDelete(location.url)
    store.write(JUNK, b"x")
    assert [o.key for o in shardlake.open(store).gc(grace_s=0).garbage] == [JUNK]
    threads[0].join(60)
    assert outcome == ["published"]
    state = read_state(store)
    assert state.latest == "v2"
    # It published after gc's unlock, never under the lock.
    ops = [json.loads(store.read(commit_key(seq)))["op"] for seq in range(1, state.seq + 1)]
    assert ops[-3:] == ["gc-lock", "gc-unlock", "publish"], ops


def test_break_lock_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    location = _root(tmp_path)
    store = location.open()
    assert main(["gc", location.url, "--break-lock", "--yes"]) != 0
    assert "no gc lock is held" in capsys.readouterr().err
    _hold(store, 3600)
    # No terminal to ask on: refused without --yes.
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    assert main(["gc", location.url, "--break-lock"]) != 0
    assert "--yes" in capsys.readouterr().err and read_state(store).gc_locked()
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    assert main(["gc", location.url, "--break-lock"]) == 1 and read_state(store).gc_locked()
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    assert main(["gc", location.url, "--break-lock"]) == 0
    assert "broke the gc lock" in capsys.readouterr().out and not read_state(store).gc_locked()
    _hold(store, 3600)
    assert main(["gc", location.url, "--break-lock", "--yes", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["broken"]["owner"] == "alice@host pid 1"
    assert read_state(store).gc_lock is None


@pytest.mark.parametrize("op", ["pack", "remove", "prune", "export", "forget", "gc"])
def test_every_commit_waits_for_a_gc_that_lets_go_within_the_deadline(
    tmp_path: Path, op: str
) -> None:
    """A gc holds the root for 1.5 s (then its lease lapses, as a killed gc's would): each
    operation that commits waits for it and then commits, instead of failing."""
    location = _root(tmp_path)
    store = location.open()
    lake = shardlake.open(store)
    pack_small(location, tmp_path / "src", tag="v2")
    key = lake.dataset("v2").manifests(columns=["key"]).column("key")[0].as_py()
    dest = shardlake.open(str(tmp_path / "copy"))
    if op == "export":
        lake.export(dest, version="v1")
        store = dest.store
    _hold(store, 1.5)
    started = time.monotonic()
    if op == "pack":
        pack_small(location, tmp_path / "src", tag="v3")
    elif op == "remove":
        lake.remove("v3", keys=[key])
    elif op == "prune":  # references nothing new: commits at once, under the lock
        lake.prune(["v1"])
    elif op == "export":
        lake.export(dest, version="v2")
    elif op == "forget":
        lake.forget(keys=[key], reason="ticket-49")
    else:
        store.write(JUNK, b"x")
        assert [o.key for o in shardlake.open(store).gc(grace_s=0).garbage] == [JUNK]
    waited = time.monotonic() - started
    state = read_state(store)
    if op == "prune":
        assert "v1" in state.retired and waited < 1.0
    else:
        assert waited >= 1.0, waited  # it waited for the lock's end
        assert state.latest == {"pack": "v3", "remove": "v3"}.get(op, "v2")
    last = {"pack": "publish", "remove": "publish", "gc": "gc-unlock"}.get(op, op)
    assert json.loads(store.read(commit_key(state.seq)))["op"] == (
        "retire" if op == "prune" else last
    )
