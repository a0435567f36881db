"""forget: erase samples from every retained version and keyset, with a receipt."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.forget import build, raw_scan

import shardlake
from shardlake.cli.main import main
from shardlake.errors import ConflictError, UsageError, VersionRedactedError
from shardlake.testing.fixtures import StoreLocation


def option_flags(options: dict[str, object]) -> list[str]:
    return [a for k, v in options.items() for a in ("--storage-option", f"{k}={json.dumps(v)}")]


# local and moto here; SeaweedFS, fake-gcs-server and Azurite in tests/contract.
@pytest.mark.parametrize("store_kind", ["local", "s3"])
def test_forget_erases_everywhere_and_keeps_the_rest_bit_identical(
    store_location: StoreLocation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = shardlake.open(store_location.url, **store_location.storage_options)
    options = option_flags(store_location.storage_options)
    world = build(root, tmp_path / "src")
    assert raw_scan(root, world.payloads, world.forgotten)  # the payloads are there before
    before = {v.tag: v.hash for v in root.versions()}
    objects = sorted(root.store.list(""))

    keyfile = tmp_path / "erase.txt"
    keyfile.write_text("\n".join(world.forgotten) + "\n")
    args = ["forget", store_location.url, "--keys", str(keyfile), "--reason", "ticket-1", *options]
    assert main([*args, "--dry-run", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["dry_run"] and dry["keys"] == 3 and dry["bytes_to_rewrite"] > 0
    assert [v["tag"] for v in dry["versions"]] == world.tags
    assert sorted(root.store.list("")) == objects  # a dry run changes nothing

    assert main([*args, "--json", "--executor", "thread"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["keys"] == 3 and doc["forget_id"] and doc["receipt"]
    after = {v.tag: v.hash for v in root.versions()}
    assert list(after) == world.tags and all(after[t] != before[t] for t in world.tags)
    removed = {v["tag"]: v["removed"] for v in doc["versions"]}
    # v4 lists one forgotten key fewer (remove dropped it) but still held its bytes.
    assert removed == {"v1": 2, "v2": 2, "v3": 3, "v4": 2}
    assert doc["keysets"] == {"ks-v2": 2, "ks-v4": 2}

    forgotten = set(world.forgotten)
    for tag in world.tags:
        ds = root.dataset(tag)
        keys = set(ds.manifests(columns=["key"]).column("key").to_pylist())
        assert keys == set(world.snapshot[tag]) - forgotten
        for key in keys:  # every other sample is bit-identical
            got = ds.get(key)
            assert {n: v for n, v in _arrays(got).items()} == world.snapshot[tag][key], key
        assert ds.query("true", columns=["key"]).num_rows == len(keys)
        assert root.verify_offsets(tag).ok and root.scrub(tag).ok
    for name in ("ks-v2", "ks-v4"):
        keyset = root.keysets.get(name)
        assert not forgotten & set(keyset.keys)
        assert keyset.version_hash == after[keyset.version_tag]
    assert raw_scan(root, world.payloads, world.forgotten) == []
    assert main(["forget", "--check", store_location.url, *options]) == 0
    assert "OK" in capsys.readouterr().out
    assert root.check_forget(doc["forget_id"]).ok

    # The old hash names the forget and the successor.
    from shardlake.meta.versions import load_version_by_hash

    with pytest.raises(VersionRedactedError) as err:
        load_version_by_hash(root.store, "v2", before["v2"])
    assert doc["forget_id"] in str(err.value) and after["v2"] in str(err.value)

    receipt = json.loads(root.store.read(doc["receipt"]))
    assert receipt["reason"] == "ticket-1" and receipt["completed_at"]
    assert not any(k in json.dumps(receipt) for k in world.forgotten)  # digests only
    assert len(receipt["payload_digests"]) >= 3

    # Forgetting again finds nothing to do; gc finds nothing of the old versions to delete.
    again = root.forget(keys=world.forgotten, reason="ticket-1 again")
    assert again.versions == [] and len(again.unmatched) == 3
    assert root.gc(grace_s=0, dry_run=True).garbage == []


def _arrays(sample: dict[str, object]) -> dict[str, bytes]:
    from support.forget import _arrays as arrays

    return arrays(sample)  # type: ignore[arg-type]


def test_forget_needs_one_selection_and_a_reason(tmp_path: Path) -> None:
    root = shardlake.open(tmp_path / "root")
    with pytest.raises(UsageError, match="reason"):
        root.forget(keys=["a"])
    with pytest.raises(UsageError, match="exactly one"):
        root.forget(keys=["a"], where="true", reason="x")


_KILL_SCRIPT = """
import os, signal, sys
import shardlake
from shardlake.store import Store

LIMIT = int(sys.argv[3])
count = [0]


class Killing(Store):
    # SIGKILL right after the LIMIT-th change to the store (before it, for a shard upload):
    # every state a kill can leave lies between two such changes.
    def _tick(self):
        count[0] += 1
        if count[0] == LIMIT:
            os.kill(os.getpid(), signal.SIGKILL)

    def write(self, key, data):
        super().write(key, data)
        self._tick()

    def create(self, key, data):
        super().create(key, data)
        self._tick()

    def delete(self, key):
        super().delete(key)
        self._tick()

    def open_writer(self, key):
        self._tick()
        return super().open_writer(key)


root = shardlake.open(Killing(sys.argv[1]))
root.forget(keys=[sys.argv[2]], reason="kill test", executor="inline")
print(count[0])
"""


def _forget_killed_at(url: str, key: str, limit: int) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        [sys.executable, "-c", _KILL_SCRIPT, url, key, str(limit)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_forget_killed_at_random_points_then_rerun_completes(tmp_path: Path) -> None:
    root = shardlake.open(tmp_path / "root")
    world = build(root, tmp_path / "src", executor="inline")
    candidates = sorted(set(world.snapshot["v4"]) - set(world.forgotten))
    rng = random.Random(46)
    victims = rng.sample([k for k in candidates if not k.startswith("extra/")], 11)
    # One run to completion counts the store changes a forget of one key makes.
    done = _forget_killed_at(root.url, victims[0], 10**9)
    assert done.returncode == 0, done.stderr
    changes = int(done.stdout.split()[-1])
    assert changes > 10
    for key in victims[1:]:
        limit = rng.randint(1, changes - 2)
        killed = _forget_killed_at(root.url, key, limit)
        assert killed.returncode == -signal.SIGKILL, (limit, killed.stderr)
        fresh = shardlake.open(root.url)
        for version in fresh.versions():  # the old state or the new one, never a mix
            assert fresh.verify_offsets(version.tag).ok, (limit, version.tag)
            # index.json may lag a keyset rewritten just before the kill (a derived document;
            # the rerun rewrites it): every payload must check out.
            assert fresh.scrub(version.tag).problems == [], (limit, version.tag)
        fresh.forget(keys=[key], reason="kill test")  # the rerun completes it
        for version in fresh.versions():
            assert key not in set(
                fresh.dataset(version.tag).manifests(columns=["key"]).column("key").to_pylist()
            )
        for name in ("ks-v2", "ks-v4"):
            assert key not in fresh.keysets.get(name).keys
        assert fresh.check_forget().ok, limit
        assert fresh.scrub().ok, limit


def test_forget_retries_on_top_of_a_racing_publisher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardlake.lifecycle import forget as forget_module

    root = shardlake.open(tmp_path / "root")
    world = build(root, tmp_path / "src")
    key = world.forgotten[0]
    real = forget_module._rewrite
    raced: list[str] = []

    def racing(*args: object, **kwargs: object) -> object:
        if not raced:  # a writer commits v5 (still holding the key) while forget works
            raced.append(root.remove("v5", base="v4", keys=[world.forgotten[2]]).version.hash)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(forget_module, "_rewrite", racing)
    report = root.forget(keys=[key], reason="race")
    assert report.attempts == 2
    assert [v.tag for v in report.versions] == ["v1", "v2", "v3", "v4", "v5"]
    v5 = root.dataset("v5")
    assert v5.version.hash != raced[0]
    assert key not in set(v5.manifests(columns=["key"]).column("key").to_pylist())
    assert root.check_forget().ok


def test_a_writer_from_a_redacted_base_loses_cleanly(tmp_path: Path) -> None:
    root = shardlake.open(tmp_path / "root")
    world = build(root, tmp_path / "src")
    with pytest.raises(ConflictError), root.writer("v5", base="v4") as w:
        w.write("late/000000", {"x": np.zeros(3, np.float32)}, {"index": 0})
        root.forget(keys=world.forgotten, reason="race")
    assert [v.tag for v in root.versions()] == world.tags
    assert root.check_forget().ok


def test_forget_where_reaches_pruned_versions_kept_by_keysets(tmp_path: Path) -> None:
    root = shardlake.open(tmp_path / "root")
    world = build(root, tmp_path / "src")
    key = world.forgotten[0]
    root.keysets.create("ks-v1", version="v1", where="true")
    root.prune(["v1"])  # kept by ks-v1: retained, so redacted too
    report = root.forget(where=f"key = '{key}'", reason="where", executor="process", workers=2)
    assert [(v.tag, v.live) for v in report.versions] == [
        ("v2", True),
        ("v3", True),
        ("v4", True),
        ("v1", False),
    ]
    assert report.keys == 1 and report.unmatched == []
    ks = root.keysets.get("ks-v1")
    assert key not in ks.keys and ks.version_hash == report.versions[-1].new
    assert root.gc(grace_s=0, dry_run=True).garbage == []  # nothing superseded was left
    receipt = json.loads(root.store.read(report.receipt or ""))
    assert receipt["selection"]["where"] == f"key = '{key}'"
    assert root.check_forget().ok
    # The source still holds the sample: a pack of it rebuilds that partition (the redacted
    # revision is not the source's content) and brings it back, which --check reports.
    src = tmp_path / "src"
    again = root.pack(str(src), tag="v5", base="v2", executor="thread", workers=2)
    assert again.version.tag == "v5" and root.verify_offsets("v5").ok and root.scrub("v5").ok
    assert key in set(root.dataset("v5").manifests(columns=["key"]).column("key").to_pylist())
    assert not root.check_forget().ok


def test_check_names_a_copy_forget_could_not_reach(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = shardlake.open(tmp_path / "root")
    world = build(root, tmp_path / "src")
    ds = root.dataset("v2")
    row = ds.select(keys=[world.forgotten[0]]).rows(["partition", "shard"]).to_pylist()[0]
    shard = ds.shard_key(row["partition"], row["shard"])
    root.store.write("backup/copy.tar", root.store.read(shard))  # a copy made before the forget
    report = root.forget(keys=world.forgotten, reason="copy")
    assert main(["forget", "--check", root.url, report.forget_id or ""]) == 1
    out = capsys.readouterr().out
    assert "backup/copy.tar" in out and "FAILED" in out
    assert not [o for o in root.check_forget().offending if not o.startswith("backup/")]
