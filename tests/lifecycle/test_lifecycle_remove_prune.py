"""remove and prune-version: new versions without partitions/samples, retiring tags, races."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from support.lifecycle import pack_synth, packed_keys

import shardlake
from shardlake import open_store
from shardlake.cli.main import main
from shardlake.errors import ConflictError, NotFoundError, SelectionError, UsageError
from shardlake.testing.fixtures import StoreLocation


def _packed(location: StoreLocation, src: Path, tag: str = "v1") -> list[str]:
    pack_synth(location, src, 3, 4, seed=3, tag=tag, reuse_source=True)
    return packed_keys(location, tag)


def _objects(location: StoreLocation) -> set[str]:
    return set(open_store(location.url, location.storage_options).list(""))


@pytest.mark.parametrize("store_kind", ["local", "seaweedfs", "gcs"])
def test_remove_samples_partitions_and_where_via_cli(
    store_location: StoreLocation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = _packed(store_location, tmp_path / "src")
    root, opts = store_location.url, store_location.storage_options
    v1 = shardlake.open(root, **opts).dataset()
    before = _objects(store_location)
    keyfile = tmp_path / "drop.txt"
    keyfile.write_text(keys[0] + "\n" + keys[5] + "\n")
    assert main(["remove", root, "--tag", "v2", "--keys", str(keyfile), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["samples"] == 10 and out["samples_removed"] == 2 and out["manifests_written"] == 2
    new = _objects(store_location) - before
    # Only new manifest revisions, a version document and a commit record: never new shards.
    assert not [k for k in new if k.endswith(".tar")]
    assert len([k for k in new if "/manifest-" in k]) == 2
    v2 = shardlake.open(root, **opts).dataset("v2")
    remaining = set(v2.manifests(columns=["key"]).column("key").to_pylist())
    assert remaining == set(keys) - {keys[0], keys[5]}
    assert v2.get(keys[1]).keys() == v1.get(keys[1]).keys()
    assert shardlake.open(root, **opts).verify_offsets("v2").ok
    assert shardlake.open(root, **opts).scrub("v2").ok
    # Other versions untouched.
    assert shardlake.open(root, **opts).dataset("v1").version.hash == v1.version.hash
    assert len(shardlake.open(root, **opts).dataset("v1").manifests()) == 12

    pid = v2.entries[0].id
    assert main(["remove", root, "--tag", "v3", "--partition", pid]) == 0
    capsys.readouterr()
    v3 = shardlake.open(root, **opts).dataset("v3")
    assert pid not in [p.id for p in v3.entries] and len(v3.entries) == 2
    assert v3.version.doc["base"] == "v2"

    where = f"key = '{keys[2]}' OR key = '{keys[3]}'"
    assert main(["remove", root, "--tag", "v4", "--base", "v1", "--where", where]) == 0
    capsys.readouterr()
    v4 = shardlake.open(root, **opts).dataset("v4")
    assert v4.version.samples == 10 and len(v4.entries) == 3
    assert [v.tag for v in shardlake.open(open_store(root, opts)).versions()] == [
        "v1",
        "v2",
        "v3",
        "v4",
    ]
    assert main(["prune-version", root, "v4"]) == 1  # latest needs --force
    capsys.readouterr()
    assert main(["prune-version", root, "v1", "v2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["live"] == ["v3", "v4"]
    assert shardlake.open(root, **opts).dataset().version.tag == "v4"


def test_remove_by_json_training_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    keys = _packed(location, tmp_path / "src")
    listing = tmp_path / "drop.json"
    listing.write_text(json.dumps([f"/old/root/{k}.npz" for k in keys[:2]]))
    argv = ["remove", location.url, "--tag", "v2", "--keys", str(listing)]
    assert main([*argv, "--strip-prefix", "/other"]) == 1
    assert "do not start with /other" in capsys.readouterr().err
    assert main([*argv, "--strip-prefix", "/old/root"]) == 0
    capsys.readouterr()
    remaining = shardlake.open(location.url).dataset("v2").manifests(columns=["key"]).column("key")
    assert sorted(remaining.to_pylist()) == keys[2:]


def test_remove_bad_input_and_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    keys = _packed(location, tmp_path / "src")
    root = location.url
    commits = open_store(root).list("commits/")
    with pytest.raises(NotFoundError, match="no partition"):
        shardlake.open(root).remove("x", partitions=["000000000000"])
    with pytest.raises(NotFoundError, match="no sample"):
        shardlake.open(root).remove("x", keys=[keys[0], "nope/missing"])
    with pytest.raises(SelectionError, match="empty"):
        shardlake.open(root).remove("x", where="true")
    with pytest.raises(SelectionError, match="matches no sample"):
        shardlake.open(root).remove("x", where="false")
    with pytest.raises(SelectionError):
        shardlake.open(root).remove("x", where="size > 1; SELECT 1")
    with pytest.raises(ConflictError, match="already exists"):
        shardlake.open(root).remove("v1", keys=[keys[0]])
    with pytest.raises(UsageError):
        shardlake.open(root).remove("x")
    assert main(["remove", root, "--tag", "x", "--base", "v9", "--where", "true"]) == 1
    assert "unknown version" in capsys.readouterr().err
    assert open_store(root).list("commits/") == commits  # nothing published by any of these


def test_two_removes_race_one_wins(tmp_path: Path) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    keys = _packed(location, tmp_path / "src")
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}
    store = open_store(location.url)
    real = store.create

    def slow_create(key: str, data: bytes) -> None:
        if key.startswith("commits/"):
            barrier.wait(timeout=10)  # both have read the same base state by now
        real(key, data)

    store.create = slow_create  # type: ignore[method-assign]

    def run(tag: str, key: str) -> None:
        try:
            results[tag] = shardlake.open(store).remove(tag, keys=[key])[0].tag
        except ConflictError as exc:
            results[tag] = exc

    threads = [threading.Thread(target=run, args=(f"r{i}", keys[i])) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    winners = [v for v in results.values() if isinstance(v, str)]
    losers = [v for v in results.values() if isinstance(v, ConflictError)]
    assert len(winners) == 1 and len(losers) == 1, results
    assert "re-run" in str(losers[0])
    tags = [v.tag for v in shardlake.open(open_store(location.url)).versions()]
    assert tags == ["v1", winners[0]]


def test_remove_racing_pack(tmp_path: Path) -> None:
    """A remove and a pack commit from the same base at the same moment: exactly one takes the
    commit; the other gets a clear conflict (remove) or retries on top (pack re-publishes its
    self-contained version when its tag is still free). Never a lost version."""
    location = StoreLocation("local", str(tmp_path / "root"))
    src = tmp_path / "src"
    keys = _packed(location, src)
    # The next pack has something to change: one frame withdrawn from the source.
    (src / f"{keys[0]}.npz").unlink()
    (src / f"{keys[0]}.json").unlink()
    barrier = threading.Barrier(2)
    gated_once = threading.local()
    first_round: list[str] = []
    results: dict[str, object] = {}
    store = open_store(location.url)
    real_create = store.create

    def gated(key: str, data: bytes) -> None:
        if key.startswith("commits/") and not getattr(gated_once, "done", False):
            gated_once.done = True
            barrier.wait(timeout=20)  # both writers commit on the same base seq
            try:
                real_create(key, data)
            except ConflictError:
                first_round.append("lost")
                raise
            first_round.append("won")
            return
        real_create(key, data)

    def run(name: str, fn) -> None:  # type: ignore[no-untyped-def]
        try:
            results[name] = fn().tag
        except ConflictError as exc:
            results[name] = exc

    def do_pack():  # type: ignore[no-untyped-def]
        return (
            shardlake.open(store)
            .pack(str(src), tag="p2", base="v1", workers=1, executor="inline", shard_size=40_000)
            .record
        )

    def do_remove():  # type: ignore[no-untyped-def]
        return shardlake.open(store).remove("r2", keys=[keys[1]])[0]

    store.create = gated  # type: ignore[method-assign]
    try:
        threads = [
            threading.Thread(target=run, args=("pack", do_pack)),
            threading.Thread(target=run, args=("remove", do_remove)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        store.create = real_create  # type: ignore[method-assign]
    assert sorted(first_round) == ["lost", "won"], first_round
    published = [v for v in results.values() if isinstance(v, str)]
    failed = [v for v in results.values() if isinstance(v, ConflictError)]
    assert len(published) + len(failed) == 2 and published, results
    assert all("re-run" in str(e) for e in failed)
    tags = [v.tag for v in shardlake.open(open_store(location.url)).versions()]
    assert tags[0] == "v1" and sorted(tags[1:]) == sorted(published)  # nothing lost
    for tag in tags:
        assert shardlake.open(location.url).verify_offsets(tag).ok


def test_prune_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    keys = _packed(location, tmp_path / "src")
    root = location.url
    shardlake.open(root).remove("v2", keys=[keys[0]])
    shardlake.open(root).remove("v3", keys=[keys[1]])
    assert main(["prune-version", root, "v3"]) == 1
    err = capsys.readouterr().err
    assert "'latest'" in err and "--force" in err
    assert main(["prune-version", root, "v9"]) == 1
    assert "no live version" in capsys.readouterr().err
    assert main(["prune-version", root, "v1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["live"] == ["v2", "v3"] and out["latest"] == "v3"
    assert main(["prune-version", root, "v2", "--force"]) == 0
    assert "pruned v2; latest is now v3" in capsys.readouterr().out
    shardlake.open(root).remove("v4", keys=[keys[2]])
    report = shardlake.open(root).prune(["v3"], force=True)
    assert report.pruned == ["v3"] and report.latest == "v4" and report.live == ["v4"]
    with pytest.warns(DeprecationWarning, match="PruneReport.pruned"):
        assert report.retired == ["v3"]  # the old name, kept one release
    assert report.to_json()["pruned"] == report.to_json()["retired"] == ["v3"]
    assert shardlake.open(root).dataset().version.tag == "v4"


def test_remove_takes_a_partition_by_path_as_pack_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`show` and `diff` name partitions by path; `remove --partition` takes that path too."""
    location = StoreLocation("local", str(tmp_path / "root"))
    _packed(location, tmp_path / "src")
    entries = shardlake.open(location.url).dataset("v1").entries
    path, pid = entries[0].path, entries[1].id
    assert main(["remove", location.url, "--tag", "v2", "--partition", path, pid]) == 0
    left = {e.path for e in shardlake.open(location.url).dataset("v2").entries}
    assert left == {e.path for e in entries[2:]}
    assert main(["remove", location.url, "--tag", "v3", "--partition", "no/such"]) == 1
    assert "has no partition(s) 'no/such' (neither an id nor a path" in capsys.readouterr().err
