import threading

import pytest

import shardlake
from shardlake import open_store
from shardlake.errors import ConflictError, FormatError, NotFoundError, VersionNotFoundError
from shardlake.format.documents import PartitionEntry
from shardlake.meta.commits import read_state
from shardlake.meta.publish import VersionBody, prepare_publish, publish_version
from shardlake.meta.versions import load_version, prune_versions, resolve_tag


def _entry(n):
    return {
        "id": f"p{n}",
        "path": f"part{n}",
        "data_rev": "d",
        "meta_rev": "m",
        "manifest_rev": "r",
        "manifest": "",
        "samples": 0,
        "skipped": n,
        "payload_bytes": 0,
        "shards": [],
    }


def _body(tag, n):
    """A well-formed version body of one empty partition; ``n`` tells the bodies apart."""
    return VersionBody(tag, None, (PartitionEntry.from_json(_entry(n), tag),))


@pytest.fixture
def store(tmp_path):
    return open_store(str(tmp_path / "root"))


def test_publish_and_latest(store):
    publish_version(store, _body("v1", 1), prepare_publish(store, "v1"))
    v2 = publish_version(store, _body("v2", 2), prepare_publish(store, "v2"))
    assert resolve_tag(store) == ("v2", v2.hash)
    assert load_version(store, "v1").record.partitions[0].skipped == 1
    assert [v.tag for v in shardlake.open(store).versions()] == ["v1", "v2"]


def test_a_malformed_partition_entry_is_refused_naming_it():
    # A body holds typed entries: a malformed one is refused where it is parsed.
    entry = {**_entry(1), "samples": "3"}
    with pytest.raises(FormatError, match="version 'v1' partition p1: field 'samples'"):
        PartitionEntry.from_json(entry, "version 'v1'")


def test_tag_never_reused_and_stale_base_conflicts(store):
    base = prepare_publish(store, "v1")
    publish_version(store, _body("v1", 1), base)
    with pytest.raises(ConflictError, match="'v1' already exists; tags are never reused"):
        prepare_publish(store, "v1")
    # At the commit, against the state it builds on (the authoritative check).
    with pytest.raises(ConflictError, match="'v1' was published by another writer"):
        publish_version(store, _body("v1", 9), read_state(store))
    with pytest.raises(ConflictError, match="re-run"):
        publish_version(store, _body("v2", 2), base)
    assert read_state(store).latest == "v1"


def test_racing_publishers_exactly_one_wins(store):
    base = prepare_publish(store, "t0")
    results: list[str] = []

    def run(tag):
        try:
            publish_version(store, _body(tag, len(tag)), base)
            results.append(f"won:{tag}")
        except ConflictError:
            results.append("lost")

    threads = [threading.Thread(target=run, args=(f"t{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.startswith("won") for r in results) == 1
    state = read_state(store)
    assert state.seq == 1 and len(state.versions) == 1


def test_retire_requires_force_for_latest(store):
    publish_version(store, _body("v1", 1), prepare_publish(store, "v1"))
    publish_version(store, _body("v2", 2), prepare_publish(store, "v2"))
    with pytest.raises(ConflictError, match="needs force") as refused:
        prune_versions(store, ["v2"])
    assert refused.value.options == ("force",)  # the CLI shows it as --force
    prune_versions(store, ["v2"], force=True)
    assert read_state(store).latest == "v1"
    with pytest.raises(VersionNotFoundError, match="pruned"):
        load_version(store, "v2")
    with pytest.raises(ConflictError):
        publish_version(store, _body("v2", 3), read_state(store))


def test_empty_location_is_no_root(store):
    # Nothing there at all: not "no version", but no root (NotFoundError, not a version error).
    with pytest.raises(NotFoundError, match="no shardlake root at") as info:
        load_version(store)
    assert not isinstance(info.value, VersionNotFoundError)
