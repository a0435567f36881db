"""Typed documents: parsed and validated once, malformed ones refused naming object and field."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

import shardlake
from shardlake.errors import FormatError
from shardlake.format.documents import CommitRecord, PartitionEntry, VersionRecord
from shardlake.meta.commits import read_state
from shardlake.meta.state import hash_bytes
from shardlake.meta.versions import load_version
from shardlake.store import open_store

GOLDEN = Path(__file__).parents[1] / "data" / "golden" / "v1" / "root"


def _version_doc() -> dict[str, Any]:
    path = next((GOLDEN / "versions" / "v2").glob("*.json"))
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def test_version_record_typed() -> None:
    record = VersionRecord.from_json(_version_doc(), "v2.json")
    assert record.tag == "v2" and record.base == "v1"
    assert record.samples == sum(p.samples for p in record.partitions) == 8
    first = record.partitions[0]
    assert isinstance(first, PartitionEntry) and first.shards[0].key.startswith("data/")
    assert record.partition(first.id) is first
    assert PartitionEntry.from_json(first.to_json(), "x") == first


def test_partition_entry_keeps_its_catalog_segment() -> None:
    doc = _version_doc()["partitions"][0]
    assert "segment" not in PartitionEntry.from_json(doc, "x").to_json()  # format 1: none
    entry = PartitionEntry.from_json({**doc, "segment": "ab" * 32}, "x")
    assert entry.segment == "ab" * 32 and PartitionEntry.from_json(entry.to_json(), "x") == entry
    with pytest.raises(FormatError, match="field 'segment' has the wrong type"):
        PartitionEntry.from_json({**doc, "segment": 3}, "x")


def test_partition_entry_fast_path_matches_the_checked_one() -> None:
    """A plain dict takes the fast path; a read-only mapping the checked one: same entries."""
    from types import MappingProxyType

    docs = [
        *_version_doc()["partitions"],
        {**_version_doc()["partitions"][0], "segment": "ab" * 32, "skipped": 2},
        {**_version_doc()["partitions"][0], "extra": 1, "skipped": True},
        {**_version_doc()["partitions"][0], "source_fingerprint": 5},
    ]
    for doc in docs:
        checked = PartitionEntry.from_json(MappingProxyType(doc), "x")
        assert PartitionEntry.from_json(doc, "x") == checked
        assert type(PartitionEntry.from_json(doc, "x").skipped) is int


def test_version_entries_are_the_typed_partition_list() -> None:
    store = open_store(str(GOLDEN))
    version = load_version(store, "v2")
    assert version.entries == version.record.partitions
    assert [e.to_json() for e in version.entries] == version.doc["partitions"]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["partitions"][0].pop("manifest"), "missing field 'manifest'"),
        (lambda d: d["partitions"][0].update(samples="3"), "field 'samples' has the wrong type"),
        (lambda d: d["partitions"][0]["shards"][0].update(size=-1), "'size' is negative"),
        (lambda d: d["partitions"][0].update(samples=99), "fewer than the 99 samples"),
        (lambda d: d.update(samples=1), "not the sum"),
        (lambda d: d.update(format="other/1"), "unknown version format"),
    ],
)
def test_malformed_version_refused(mutate: Any, message: str) -> None:
    doc = _version_doc()
    mutate(doc)
    with pytest.raises(FormatError, match=message) as info:
        VersionRecord.from_json(doc, "versions/v2/abc.json")
    assert "versions/v2/abc.json" in str(info.value)


def test_commit_record_typed_and_refused() -> None:
    doc = json.loads((GOLDEN / "commits" / "000000000002.json").read_text())
    record = CommitRecord.from_json(doc, "c2", 2)
    assert record.op == "publish" and record.latest == "v2" and record.detail["tag"] == "v2"
    assert [t for t, _ in record.versions] == ["v1", "v2"] and record.gc_lock is None
    with pytest.raises(FormatError, match="seq 3"):
        CommitRecord.from_json(doc, "c2", 3)
    doc["state"]["versions"] = [["v1"]]
    with pytest.raises(FormatError, match="c2: state.versions"):
        CommitRecord.from_json(doc, "c2", 2)


def test_flipped_byte_in_version_document_refused(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "r"))
    for path in GOLDEN.rglob("*"):
        if path.is_file():
            store.write(str(path.relative_to(GOLDEN)), path.read_bytes())
    tag, version_hash = "v2", read_state(store).versions["v2"]
    key = f"versions/{tag}/{version_hash}.json"
    data = bytearray(store.read(key))
    data[len(data) // 2] ^= 0x01
    assert hash_bytes(bytes(data)) != version_hash
    store.write(key, bytes(data))
    with pytest.raises(FormatError, match=f"{key}: version document does not match its hash"):
        load_version(store, "v2")


def _copy_golden(dest: Path) -> Any:
    store = open_store(str(dest))
    for path in GOLDEN.rglob("*"):
        if path.is_file():
            store.write(str(path.relative_to(GOLDEN)), path.read_bytes())
    return store


def test_publish_records_manifest_digests_and_readers_refuse_a_flip(tmp_path: Path) -> None:

    store = _copy_golden(tmp_path / "r")
    old = load_version(store, "v2")
    assert all(p.manifest_sha256 is None for p in old.record.partitions)  # format-1 golden root
    key = shardlake.open(store).dataset("v2").manifests(columns=["key"]).column("key")[0].as_py()
    v3, _ = shardlake.open(store).remove("v3", base="v2", keys=[key])
    for part in v3.record.partitions:
        data = store.read(part.manifest)
        assert part.manifest_sha256 == hashlib.sha256(data).hexdigest()
        assert part.manifest_size == len(data)
    target = v3.record.partitions[0].manifest
    flipped = bytearray(store.read(target))
    flipped[len(flipped) // 3] ^= 0x04
    store.write(target, bytes(flipped))
    with pytest.raises(
        FormatError, match=f"{target}: manifest does not match the version entry .its sha256"
    ):
        shardlake.open(store).dataset("v3").manifest(v3.record.partitions[0].id)
