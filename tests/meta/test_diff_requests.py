"""`diff` costs the same requests at 100 and 10,000 partitions: the two headers, the two
partitions tables and the segments holding rows of partitions that differ.

The roots are written straight through the catalog writer (no shards or manifests: diff reads
neither), so the 10,000-partition root takes about a second."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

import shardlake
from shardlake import Store, open_store
from shardlake.format.documents import PartitionEntry
from shardlake.format.layout import partition_id, version_key
from shardlake.format.manifest import CORE_SCHEMA
from shardlake.meta.catalog import load_catalog, publish_catalog, rows_by_partition
from shardlake.meta.commits import commit_state, read_state
from shardlake.meta.publish import VersionBody, build_version_doc
from shardlake.meta.rootmarker import ensure_root
from shardlake.meta.state import RootState, hash_bytes
from shardlake.meta.versions import load_version
from shardlake.store.layers import RequestCounter

RECIPE = {"codec": "raw"}
RULE = {"depth": 1}


def _entry(path: str) -> dict[str, Any]:
    pid = partition_id(path)
    return {
        "id": pid,
        "path": path,
        "data_rev": f"d-{path}",
        "meta_rev": f"m-{path}",
        "manifest_rev": f"r-{path}",
        "manifest": f"data/{pid}/d/manifest-{path}.parquet",
        "samples": 1,
        "shards": [{"key": f"data/{pid}/d/shard-000000.tar", "size": 1536, "members": 1}],
    }


def _rows(entries: list[dict[str, Any]]) -> pa.Table:
    n = len(entries)
    cols: dict[str, Any] = {
        "key": [f"{e['path']}/frame" for e in entries],
        "partition": [e["id"] for e in entries],
        "shard": [0] * n,
        "member": [0] * n,
        "offset": [512] * n,
        "size": [8] * n,
        "raw_size": [8] * n,
        "crc32": [1] * n,
        "source_sha256": ["0" * 64] * n,
        "has_sidecar": [False] * n,
    }
    return pa.table(cols, schema=CORE_SCHEMA)


def _publish(store: Store, tag: str, entries: list[dict[str, Any]], base: str | None) -> None:
    ensure_root(store)
    state = read_state(store)
    base_catalog = None if base is None else load_catalog(store, load_version(store, base))
    known = set() if base_catalog is None else {e.id for e in base_catalog.entries}
    fresh = rows_by_partition(_rows([e for e in entries if e["id"] not in known]))
    parts = [PartitionEntry.from_json(e, tag) for e in entries]
    catalog, parts = publish_catalog(store, parts, base_catalog, fresh)
    body = VersionBody(tag, base, tuple(parts), recipe=RECIPE, partition_rule=RULE)
    data = build_version_doc(body, parts, catalog)
    digest = hash_bytes(data)
    store.create(version_key(tag, digest), data)
    new = RootState(state.seq + 1, {**state.versions, tag: digest}, state.retired, tag)
    commit_state(store, state, new, "publish", {"tag": tag, "version": digest})


def test_diff_requests_do_not_grow_with_partitions(tmp_path: Any) -> None:
    seen = {}
    for n in (100, 10_000):
        url = str(tmp_path / f"n{n}")
        store = open_store(url)
        v1 = [_entry(f"log{i:06d}") for i in range(n)]
        _publish(store, "v1", v1, None)
        _publish(store, "v2", [*v1[1:], _entry("added")], "v1")  # one removed, one added
        counter = RequestCounter()
        diff = shardlake.open(open_store(url).with_layers(counter)).diff("v1", "v2", samples=True)
        doc = diff.to_json()
        assert doc["partitions"] == {
            "added": ["added"],
            "removed": ["log000000"],
            "data_changed": [],
            "meta_changed": [],
            "unchanged": n - 1,
        }
        assert doc["samples"]["added_keys"] == ["added/frame"]
        assert doc["samples"]["removed_keys"] == ["log000000/frame"]
        seen[n] = dict(counter.requests)
    assert seen[100] == seen[10_000], seen
    # State (listing + newest commit), two records, two partitions tables, two segments.
    assert sum(seen[100].values()) <= 8, seen[100]
