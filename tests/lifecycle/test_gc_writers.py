"""gc beside long-running writers (issue 49): a loop of ``gc --grace 0s`` never takes what a
running pack, writer, write_bag or import-wds holds a lease on; their publishes wait for it
instead of failing; a gc that deletes nothing commits nothing; a killed writer's lease lapses
and the next gc collects what it left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dask
import dask.bag as db
import numpy as np
import pytest
import webdataset as wds
from support.writer import make_samples

import shardlake
from shardlake import GcReport, Store, WriteOptions, open_store
from shardlake.cli.main import main
from shardlake.errors import NotFoundError, ObjectsGoneError
from shardlake.format.layout import commit_key
from shardlake.testing import synth_corpus
from shardlake.testing.fixtures import StoreLocation

pytestmark = pytest.mark.timeout(300)

SHARD = 1500  # several shards per partition


class GcLoop:
    """``gc --grace 0s`` on a thread, over and over (at most ``runs`` passes or ``seconds``)."""

    def __init__(
        self,
        location: StoreLocation,
        runs: int = 400,
        seconds: float = 120.0,
        junk: bool = False,
    ) -> None:
        self.location, self.runs, self.seconds, self.junk = location, runs, seconds, junk
        self.reports: list[GcReport] = []
        self.errors: list[BaseException] = []
        self.passes = 0
        self._done = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gc-loop", daemon=True)

    def _run(self) -> None:
        root = shardlake.open(self.location.url, **self.location.storage_options)
        ends = time.monotonic() + self.seconds
        while not self._stop.is_set() and self.passes < self.runs and time.monotonic() < ends:
            rooted = root.store.exists("shardlake.json")  # not before the first pack
            try:
                if self.junk and rooted:  # garbage for every pass
                    root.store.write(f"data/junk{self.passes}/x/shard-000000.tar", b"x")
                self.reports.append(root.gc(grace_s=0))
            except NotFoundError as exc:
                if rooted:  # else: "no shardlake root" is right
                    self.errors.append(exc)
            except BaseException as exc:  # noqa: BLE001 - the test asserts there are none
                self.errors.append(exc)
            with self._done:
                self.passes += 1
                self._done.notify_all()
            time.sleep(0.01)

    def one_more_pass(self) -> None:
        """Return once a gc pass that started after this call has ended."""
        with self._done:
            target = self.passes + 2  # the pass running now may have listed before this call
            assert self._done.wait_for(lambda: self.passes >= target or self._stop.is_set(), 60)

    def __enter__(self) -> GcLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


def _gc_between_shards_and_manifest(loop: GcLoop) -> Callable[..., Any]:
    """A store layer: before a job creates its first manifest (its shards are written and no
    version references them yet), wait until a whole gc pass has run."""
    held: list[str] = []

    def layer(request: Any, send: Callable[[], Any]) -> Any:
        if request.op == "create" and "/manifest-" in request.key and not held:
            held.append(request.key)
            loop.one_more_pass()
        return send()

    return layer


def _write_tars(directory: Path) -> None:
    directory.mkdir()
    with wds.ShardWriter(str(directory / "train-%06d.tar"), maxcount=3, verbose=0) as sink:
        for i in range(6):
            sink.write({"__key__": f"{i:05d}", "ego.npy": np.full((3, 2), i, np.float32)})


def _ops(store: Store) -> list[str]:
    seq = 1
    out = []
    while store.exists(commit_key(seq)):
        out.append(json.loads(store.read(commit_key(seq)))["op"])
        seq += 1
    return out


@pytest.fixture
def sync_dask() -> Iterator[None]:
    with dask.config.set(scheduler="sync"):  # the bag's builds run here, through the layer
        yield


@pytest.mark.parametrize("store_kind", ["local", "seaweedfs", "gcs"])
def test_every_writer_publishes_beside_a_gc_loop(
    store_location: StoreLocation, tmp_path: Path, sync_dask: None
) -> None:
    src = tmp_path / "src"
    synth_corpus(src, 2, 4, seed=49, neighbors=2, lanes=4)
    tars = tmp_path / "wds"
    _write_tars(tars)
    samples = make_samples(partitions=2, per_partition=4, seed=49)
    options = WriteOptions(shard_size=SHARD)
    with GcLoop(store_location) as loop:
        store = store_location.open().with_layers(_gc_between_shards_and_manifest(loop))
        shardlake.open(store).pack(str(src), tag="pack", shard_size=SHARD, executor="inline")
        store = store_location.open().with_layers(_gc_between_shards_and_manifest(loop))
        with shardlake.open(store).writer("writer", options=options) as writer:
            for key, arrays, meta in samples:
                writer.write(key, arrays, meta)
        store = store_location.open().with_layers(_gc_between_shards_and_manifest(loop))
        bag = db.from_sequence([(f"bag/{k}", a, m) for k, a, m in samples], npartitions=2)
        shardlake.open(store).write_bag(bag, "bag", options=options)
        store = store_location.open().with_layers(_gc_between_shards_and_manifest(loop))
        shardlake.open(store).import_wds(str(tars), "wds", key_prefix="wds/", options=options)
    assert not loop.errors, loop.errors
    # The race was real: gc passes ran while each job's shards were unreferenced, and kept them
    # for the job's live lease, whatever the grace.
    held = [r for r in loop.reports if r.leased]
    assert len(held) >= 4 and {lease.op for r in held for lease in r.leases} >= {
        "pack",
        "write",
        "write_bag",
        "import-wds",
    }
    root = shardlake.open(store_location.url, **store_location.storage_options)
    store = store_location.open()
    # Nothing was ever garbage, so no gc committed: every commit is a job's publish.
    deleted = [(o.key, r.leases) for r in loop.reports for o in r.garbage]
    assert _ops(store) == ["publish"] * 4, deleted
    for tag in ("pack", "writer", "bag", "wds"):
        assert root.scrub(tag).ok
    root.gc(grace_s=0)
    final = root.gc(grace_s=0, dry_run=True)
    assert final.garbage == [] and final.leftovers == [] and final.leases == []
    assert store.list("leases") == []  # every job removed its lease


def test_publishes_beside_a_gc_loop_that_deletes_every_pass(tmp_path: Path) -> None:
    """Each pass finds garbage, so gc takes the root again and again: publishes wait for it
    (and retry after its commits) and get through."""
    location = StoreLocation("local", str(tmp_path / "root"))
    src = tmp_path / "src"
    synth_corpus(src, 2, 3, seed=54, neighbors=2, lanes=4)
    samples = make_samples(partitions=2, per_partition=3, seed=54)
    root = shardlake.open(location.url)
    root.pack(str(src), tag="v1", executor="inline")
    with GcLoop(location, runs=60, junk=True) as loop:
        for n in range(2):
            with root.writer(f"w{n}", options=WriteOptions(shard_size=SHARD)) as writer:
                for key, arrays, meta in samples:
                    writer.write(f"n{n}/{key}", arrays, meta)
        root.remove("v2", keys=[f"n1/{samples[0][0]}"])  # from latest, w1
    assert not loop.errors, loop.errors
    ops = _ops(location.open())
    assert ops.count("gc-lock") >= 3 and ops.count("publish") == 4, ops
    for tag in ("w0", "w1", "v2"):
        assert root.scrub(tag).ok


def _write_until_killed(root: str) -> str:
    """A writer in a subprocess that builds one partition and then hangs: its lease and shards
    are in the root when it is SIGKILLed."""
    return f"""
import time
import numpy as np
import shardlake

options = shardlake.WriteOptions(shard_size=600)
with shardlake.open({root!r}).writer("killed", options=options) as writer:
    for i in range(6):
        writer.write(f"log0/{{i:06d}}", {{"x": np.full((8, 8), i, np.float32)}})
    writer.finish_partition("log0")
    time.sleep(600)
"""


def test_a_killed_writers_lease_lapses_and_gc_collects_its_objects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    synth_corpus(src, 1, 2, seed=50, neighbors=2, lanes=4)
    root = str(tmp_path / "root")
    assert main(["pack", str(src), root, "--tag", "v1"]) == 0
    capsys.readouterr()
    store = open_store(root)
    before = set(store.list(""))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "SHARDLAKE_LEASE_TTL": "8s"}
    proc = subprocess.Popen([sys.executable, "-c", _write_until_killed(root)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not any("/manifest-" in k for k in set(store.list("data")) - before):
            assert proc.poll() is None and time.monotonic() < deadline, "the writer never built"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    killed_at = time.time()
    left = set(store.list("")) - before
    data = {k for k in left if k.startswith("data/")}
    assert data and len([k for k in left if k.startswith("leases/")]) == 1
    # The lease outlives its writer by up to its duration: gc keeps the objects meanwhile.
    assert main(["gc", root, "--grace", "0s", "--dry-run", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (lease,) = doc["leases"]
    assert lease["op"] == "write" and lease["tag"] == "killed" and lease["ttl_s"] == 8
    assert f"pid {proc.pid}" in lease["owner"] and lease["expires_at"] > killed_at
    assert doc["would_delete"] == [] and doc["kept_leased"] == len(data)
    assert main(["gc", root, "--grace", "0s", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert f"live lease {lease['id']} (write of killed by " in text
    assert f"kept {len(data)} object" in text and " of 1 running writer (live leases)" in text
    # Not renewed, it lapses: then its writer's leftovers are ordinary garbage.
    time.sleep(max(0.0, lease["expires_at"] - time.time()) + 0.2)
    assert main(["gc", root, "--grace", "0s", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {o["key"] for o in doc["deleted"]} == data
    assert doc["lapsed_leases"] == [lease["id"]] and doc["leases"] == []
    # Left: gc's lock and unlock commits (and the probe record of its create check).
    assert {k.split("/")[0] for k in set(store.list("")) - before} <= {"commits", "_shardlake"}
    assert shardlake.open(root).scrub("v1").ok


def test_a_write_whose_objects_gc_took_names_the_gc_and_the_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A gc that ignores leases (an older release) deletes a running pack's shards: the pack
    says gc removed them, with gc's grace and the pack's lease, never "no such key"."""
    import shardlake.lifecycle.gc as gc_module
    from shardlake.meta.leases import LeaseSet

    src = tmp_path / "src"
    synth_corpus(src, 2, 3, seed=51, neighbors=2, lanes=4)
    root = str(tmp_path / "root")
    assert main(["pack", str(src), root, "--tag", "v1"]) == 0
    capsys.readouterr()
    src = tmp_path / "src2"  # new content: new revisions
    synth_corpus(src, 2, 4, seed=52, neighbors=2, lanes=4)
    monkeypatch.setattr(gc_module.LeaseSet, "read", classmethod(lambda cls, store: LeaseSet([])))
    took: list[int] = []

    def old_gc_before_the_manifest(request: Any, send: Callable[[], Any]) -> Any:
        if request.op == "create" and "/manifest-" in request.key and not took:
            took.append(len(shardlake.open(root).gc(grace_s=0).garbage))
        return send()

    store = open_store(root).with_layers(old_gc_before_the_manifest)
    with pytest.raises(ObjectsGoneError) as caught:
        shardlake.open(store).pack(str(src), tag="v2", executor="inline")
    text = str(caught.value)
    assert took and took[0] > 0
    assert "gc removed them (commit 2: grace 0s, by " in text, text
    assert "this run's lease " in text and "(pack of v2 by " in text, text
    assert "covered them: that gc did not honour leases" in text, text
    assert "no such key" not in text and "nothing was published" in text
    assert caught.value.missing and all(k.startswith("data/") for k in caught.value.missing)
    # The lease went with the failed run; the next run (gc now respects leases) publishes.
    monkeypatch.undo()
    assert open_store(root).list("leases") == []
    assert main(["pack", str(src), root, "--tag", "v2"]) == 0


def test_an_export_keeps_its_copies_from_a_gc_at_the_destination(tmp_path: Path) -> None:
    src = tmp_path / "src"
    synth_corpus(src, 2, 3, seed=53, neighbors=2, lanes=4)
    root = str(tmp_path / "root")
    assert main(["pack", str(src), root, "--tag", "v1"]) == 0
    dest = str(tmp_path / "copy")
    seen: list[GcReport] = []

    def gc_before_the_record(request: Any, send: Callable[[], Any]) -> Any:
        # Every shard and manifest is copied, nothing references them yet: gc --grace 0s.
        if request.key.startswith("versions/") and request.op in ("create", "write") and not seen:
            seen.append(shardlake.open(dest).gc(grace_s=0))
        return send()

    report = shardlake.open(root).export(open_store(dest).with_layers(gc_before_the_record))
    assert report.committed and seen
    (gc,) = seen
    assert gc.garbage == [] and len(gc.leased) >= 4 and [r.op for r in gc.leases] == ["export"]
    assert shardlake.open(dest).scrub("v1").ok and open_store(dest).list("leases") == []
