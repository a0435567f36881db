"""The typed body every publisher hands ``publish_version``, and the record made from it."""

from __future__ import annotations

import json
from pathlib import Path

from support.pack import make_source, small_frame

import shardlake
from shardlake.format.catalog import CatalogRef
from shardlake.meta.publish import VersionBody, build_version_doc
from shardlake.meta.versions import StoredVersion, load_version
from shardlake.store import open_store


def _pack(tmp_path: Path) -> StoredVersion:
    src = tmp_path / "src"
    make_source(src, {f"{p}/f{i}": small_frame(i) for p in "ab" for i in range(2)})
    store = open_store(str(tmp_path / "root"))
    shardlake.open(store).pack(src, tag="v1", executor="inline")
    return load_version(store, "v1")


def test_a_packed_record_holds_the_body_and_what_publish_computes(tmp_path: Path) -> None:
    doc = _pack(tmp_path).header_doc
    assert set(doc) == {
        *("base", "recipe", "partition_rule", "source_namespace", "keep_skipped"),
        *("format", "format_version", "tag", "partition_count", "samples", "catalog"),
        "created_at",
    }
    assert doc["base"] is None and doc["tag"] == "v1" and doc["partition_count"] == 2


def test_a_successor_keeps_the_record_fields_it_does_not_know(tmp_path: Path) -> None:
    v1 = _pack(tmp_path)
    header = {**v1.header_doc, "future_field": {"x": 1}}
    entries = v1.entries
    body = VersionBody.successor(
        header, tag="v2", base="v1", partitions=entries[:1], derived={"op": "remove"}
    )
    assert body.kept == {"future_field": {"x": 1}}
    assert body.recipe == header["recipe"] and body.source_namespace == header["source_namespace"]
    ref = CatalogRef.from_json(header["catalog"], "v1")
    doc = json.loads(build_version_doc(body, entries[:1], ref))
    assert doc["future_field"] == {"x": 1} and doc["derived"] == {"op": "remove"}
    assert doc["tag"] == "v2" and doc["base"] == "v1" and doc["partition_count"] == 1
    assert "redacted" not in doc
