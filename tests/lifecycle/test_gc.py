"""gc: deletes exactly the unreferenced objects older than the grace period, and never what a
concurrently published version references."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from support.lifecycle import pack_small

import shardlake
from shardlake import Store, open_store
from shardlake.cli.main import main
from shardlake.errors import (
    ConflictError,
    FormatError,
    GcHoldsRootError,
    KeyNotFoundError,
    PackWorkerError,
)
from shardlake.format.layout import COMMITS_DIR, ROOT_INDEX, ROOT_MARKER, commit_key
from shardlake.lifecycle.common import version_closure
from shardlake.lifecycle.gc import parse_duration
from shardlake.meta.commits import read_commit, read_state
from shardlake.meta.versions import load_version
from shardlake.testing import synth_corpus
from shardlake.testing.fixtures import StoreLocation


def _pack(location: StoreLocation, src: Path, tag: str, **kw: object) -> None:
    pack_small(location, src, tag=tag, **kw)


def _expected_garbage(store: Store, live: list[str]) -> set[str]:
    keep: set[str] = set()
    for tag in live:
        keep |= set(version_closure(store, load_version(store, tag)))
    return {
        k
        for k in store.list("")
        if k not in keep
        and k not in (ROOT_MARKER, ROOT_INDEX)
        and not k.startswith((COMMITS_DIR + "/", "keysets/", "_shardlake/"))
    }


def test_parse_duration() -> None:
    assert (
        parse_duration("6h") == 21600
        and parse_duration("90") == 90
        and parse_duration("2d") == 172800
    )
    assert parse_duration("1.5m") == 90
    with pytest.raises(ValueError):
        parse_duration("soon")


@pytest.mark.parametrize("store_kind", ["local", "seaweedfs", "gcs"])
def test_gc_dry_run_grace_and_delete(
    store_location: StoreLocation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    synth_corpus(src, 3, 3, seed=21, neighbors=2, lanes=4)
    _pack(store_location, src, "v1")
    root, opts = store_location.url, store_location.storage_options
    store = open_store(root, opts)
    v1 = shardlake.open(root, **opts).dataset()
    pid = v1.entries[0].id
    shardlake.open(store).remove("v2", partitions=[pid])
    shardlake.open(store).prune(["v1"])
    # Leftovers of a crashed writer: an uncommitted version document and a stray revision.
    store.write("versions/ghost/0123456789abcdef0123456789abcdef.json", b"{}")
    store.write("data/deadbeef0000/rev/shard-000000.tar", b"x" * 1000)
    expected = _expected_garbage(store, ["v2"])
    assert "versions/ghost/0123456789abcdef0123456789abcdef.json" in expected
    assert any(k.startswith(f"data/{pid}/") for k in expected)
    sizes = {i.key: i.size for i in store.list_info("")}
    # The grace period needs object mtimes from every backend.
    assert all(i.mtime is not None and i.mtime > 0 for i in store.list_info(""))

    # Everything was just written: the default 6 h grace keeps it all.
    assert main(["gc", root, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["count"] == 0 and out["kept_young"] == len(expected)
    before = set(store.list(""))
    assert main(["gc", root, "--grace", "0", "--dry-run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {o["key"] for o in out["would_delete"]} == expected
    assert out["bytes"] == sum(sizes[k] for k in expected)
    assert set(store.list("")) == before  # dry run deletes nothing
    assert main(["gc", root, "--grace", "0", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert f"would delete {len(expected)} objects" in text

    seq = read_state(store).seq
    assert main(["gc", root, "--grace", "0"]) == 0
    capsys.readouterr()
    # gc's lock and unlock commits; the state is otherwise unchanged.
    assert set(store.list("")) == (before - expected) | {commit_key(seq + 1), commit_key(seq + 2)}
    assert read_commit(store, seq + 1).gc_lock and read_commit(store, seq + 1).latest == "v2"
    assert read_state(store).gc_lock is None and read_state(store).latest == "v2"
    assert shardlake.open(store).scrub("v2").ok
    assert shardlake.open(store).gc(grace_s=0).garbage == []  # idempotent


def test_keyset_pins_a_retired_version(tmp_path: Path) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    src = tmp_path / "src"
    synth_corpus(src, 2, 3, seed=22, neighbors=2, lanes=4)
    _pack(location, src, "v1")
    store = open_store(location.url)
    v1 = load_version(store, "v1")
    shardlake.open(store).keysets.create("frozen", where="true")
    shardlake.open(store).remove("v2", partitions=[v1.entries[0].id])
    shardlake.open(store).prune(["v1"])
    report = shardlake.open(store).gc(grace_s=0)
    assert report.garbage == []
    assert any("(keyset)" in label for label in report.live_versions)
    assert set(version_closure(store, v1)) <= set(store.list(""))


def test_staging_leftovers_are_collected_after_grace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    src = tmp_path / "src"
    synth_corpus(src, 1, 2, seed=23, neighbors=2, lanes=4)
    _pack(location, src, "v1")
    data_dir = next((tmp_path / "root" / "data").iterdir())
    old = data_dir / ".shardlake-tmp-abc-shard-000009.tar"
    young = data_dir / ".shardlake-tmp-def-shard-000010.tar"
    old.write_bytes(b"partial")
    young.write_bytes(b"partial")
    past = time.time() - 7 * 3600
    os.utime(old, (past, past))
    report = shardlake.open(location.url).gc(dry_run=True)
    assert [x.path for x in report.leftovers] == [str(old)] and old.exists()
    assert [x.path for x in report.young_leftovers] == [str(young)]
    # The totals count the leftovers, those that go and those the grace keeps.
    assert main(["gc", location.url, "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"would delete staging leftover {old}" in out
    assert out[-1].startswith("would delete 0 objects and 1 staging leftover(s), ")
    assert "kept 0 unreferenced objects and 1 staging leftover(s) younger than 6h" in out[-1]
    assert main(["gc", location.url, "--dry-run", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["leftovers"] == [str(old)] and doc["kept_young_leftovers"] == 1
    report = shardlake.open(location.url).gc()
    assert [x.path for x in report.leftovers] == [str(old)]
    assert [x.path for x in report.young_leftovers] == [str(young)]
    assert not old.exists() and young.exists()
    assert main(["gc", location.url]) == 0
    assert "deleted 0 objects and 0 staging leftover(s)" in capsys.readouterr().out


@pytest.mark.parametrize("store_kind", ["s3"])
def test_unfinished_multipart_upload_of_a_killed_writer_is_aborted(
    store_location: StoreLocation, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    synth_corpus(src, 1, 2, seed=29, neighbors=2, lanes=4)
    store = pack_small(store_location, src)
    bucket, _, prefix = store.root.partition("/")
    key = f"{prefix}/data/abc/def/shard-000000.tar"
    # What a SIGKILLed streaming writer leaves: an upload that was started and never completed.
    upload = store.fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)
    store.fs.call_s3(
        "upload_part", Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"x"
    )
    other = store.fs.call_s3("create_multipart_upload", Bucket=bucket, Key="elsewhere/obj")
    # Inside the root, but not a name shardlake writes: another tool's upload, never aborted.
    foreign = store.fs.call_s3(
        "create_multipart_upload", Bucket=bucket, Key=f"{prefix}/team-a/model.pt"
    )

    def pending() -> set[str]:
        page = store.fs.call_s3("list_multipart_uploads", Bucket=bucket)
        return {u["UploadId"] for u in page.get("Uploads", [])}

    # (moto reports a fixed 2010 start time for every upload, so grace is exercised by the
    # local temp-file test above; here the upload is always "old".)
    report = shardlake.open(store).gc(grace_s=0, dry_run=True)
    assert [x.upload_id for x in report.leftovers] == [upload["UploadId"]]
    report = shardlake.open(store).gc(grace_s=0)
    assert [x.path for x in report.leftovers] == [f"{bucket}/{key}"]
    assert pending() == {other["UploadId"], foreign["UploadId"]}  # not ours to abort


def _age(root: Path, seconds: float) -> None:
    past = time.time() - seconds
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(dirpath, name), (past, past))


def test_gc_racing_pack_never_deletes_what_the_new_version_references(tmp_path: Path) -> None:
    """gc (default grace) races a pack that reuses an old, unreferenced revision.

    Setup: partition P's revision is complete on disk but referenced by no live version and
    older than the grace period, so gc deletes it; a pack of the same source would reuse it.
    Whatever the interleaving, the pack either publishes a version whose every object exists,
    or fails with a clear error and succeeds when re-run. It must never publish a version with
    missing objects.
    """
    root_dir = tmp_path / "root"
    location = StoreLocation("local", str(root_dir))
    src = tmp_path / "src"
    synth_corpus(src, 3, 3, seed=24, neighbors=2, lanes=4)
    for trial in range(6):
        if trial == 0:
            _pack(location, src, "base")
        store = open_store(location.url)
        latest = load_version(store)
        pid = latest.entries[trial % 3].id
        dropped = f"drop{trial}"
        shardlake.open(store).remove(dropped, partitions=[pid])
        shardlake.open(store).prune([t for t in read_state(store).versions if t != dropped])
        _age(root_dir, 7 * 3600)  # everything is now older than the 6 h grace
        outcomes: list[str] = []

        def run_pack(tag: str = f"again{trial}", outcomes: list[str] = outcomes) -> None:
            for _attempt in range(5):
                try:
                    _pack(location, src, tag)
                    outcomes.append("published")
                    return
                except (ConflictError, FormatError, KeyNotFoundError, PackWorkerError) as exc:
                    outcomes.append(type(exc).__name__)
            outcomes.append("gave up")

        gc_deleted: list[int] = []

        gc_errors: list[BaseException] = []

        def run_gc(
            gc_deleted: list[int] = gc_deleted, errors: list[BaseException] = gc_errors
        ) -> None:
            for _ in range(3):
                try:
                    gc_deleted.append(len(shardlake.open(location.url).gc().garbage))
                except ConflictError:
                    pass  # the pack committed meanwhile: a clear conflict, gc re-runs
                except BaseException as exc:  # noqa: BLE001 - surfaced by the assert below
                    errors.append(exc)

        threads = [threading.Thread(target=run_pack), threading.Thread(target=run_gc)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not gc_errors, gc_errors
        assert outcomes and outcomes[-1] == "published", outcomes
        store = open_store(location.url)
        for tag in read_state(store).versions:
            version = load_version(store, tag)
            missing = set(version_closure(store, version)) - set(store.list(""))
            assert not missing, (trial, tag, outcomes, sorted(missing)[:3])
            assert shardlake.open(store).scrub(tag).ok
        # The race was real: gc deleted the old revision in this trial.
        assert sum(gc_deleted) > 0, gc_deleted


def test_publishing_is_refused_while_gc_holds_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardlake.format.documents import GcLock
    from shardlake.meta.commits import commit_state
    from shardlake.meta.state import RootState

    monkeypatch.setenv("SHARDLAKE_RETRY_DEADLINE", "1")  # how long a publish waits for gc
    location = StoreLocation("local", str(tmp_path / "root"))
    src = tmp_path / "src"
    synth_corpus(src, 2, 2, seed=25, neighbors=2, lanes=4)
    _pack(location, src, "v1")
    store = open_store(location.url)
    keys = shardlake.open(store).dataset().manifests(columns=["key"]).column("key").to_pylist()
    state = read_state(store)
    lock = GcLock(id="test", expires_at=time.time() + 600)
    locked = RootState(state.seq + 1, state.versions, state.retired, state.latest, lock)
    commit_state(store, state, locked, "gc-lock", {})
    with pytest.raises(GcHoldsRootError, match="gc holds the root until .* past this run's"):
        shardlake.open(store).remove("v2", keys=[keys[0]])
    with pytest.raises(GcHoldsRootError, match="gc holds the root until"):
        store.write("data/junk/x/shard-000000.tar", b"x")
        shardlake.open(store).gc(grace_s=0)
    # Retiring keeps the lock (it references nothing new); readers are unaffected.
    assert shardlake.open(store).dataset().version.tag == "v1"
    # A crashed gc's lock expires.
    expired = RootState(
        locked.seq + 1,
        state.versions,
        state.retired,
        state.latest,
        GcLock(id="test", expires_at=time.time() - 1),
    )
    commit_state(store, read_state(store), expired, "gc-lock", {})
    assert shardlake.open(store).remove("v2", keys=[keys[0]])[0].tag == "v2"
    report = shardlake.open(store).gc(grace_s=0)
    assert [o.key for o in report.garbage] == ["data/junk/x/shard-000000.tar"]
