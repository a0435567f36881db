"""The per-version catalog: format rules, log-structured publish, readers, format-1 versions."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support.pack import make_source, small_frame

import shardlake
import shardlake.meta.catalog as catalog_mod
from shardlake import Store, open_store
from shardlake.cli.main import main
from shardlake.errors import FormatError, IntegrityError
from shardlake.format.catalog import (
    SEGMENT_ROW_GROUP,
    ObjectRef,
    decode_partitions,
    encode_partitions,
    encode_segment,
    row_groups_for,
)
from shardlake.meta.catalog import catalog_rows, load_catalog
from shardlake.meta.commits import read_state
from shardlake.meta.publish import VersionBody, publish_version
from shardlake.meta.versions import load_version
from shardlake.query.sql import select
from shardlake.read.manifests import read_entry_manifest
from shardlake.store.layers import Request, RequestCounter
from shardlake.torch import ShardDataset

GOLDEN = Path(__file__).parents[1] / "data" / "golden"


class KeyRecorder:
    """A store layer recording the key of every request it sees."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def __call__(self, request: Request, send: Callable[[], Any]) -> Any:
        self.keys.append(request.key)
        return send()


def _manifest_rows(store: Store, tag: str) -> pa.Table:
    """The version's rows the slow way: every manifest, in partition order."""
    version = load_version(store, tag)
    tables = [
        read_entry_manifest(store, e)[0].replace_schema_metadata(None)
        for e in sorted(version.entries, key=lambda e: e.id)
    ]
    return pa.concat_tables(tables, promote_options="permissive")


def _pack_logs(src: Path, store: Store, tag: str, logs: list[str], base: str | None) -> None:
    make_source(src, {f"{log}/f{i}": small_frame(i) for log in logs for i in range(2)})
    shardlake.open(store).pack(src, tag=tag, base=base, workers=0)


def test_partitions_table_round_trip_and_digest_check() -> None:
    entries = [
        {
            "id": f"p{i}",
            "path": f"log{i}",
            "data_rev": "d",
            "meta_rev": "m",
            "manifest_rev": "r",
            "manifest": f"data/p{i}/d/manifest-r.parquet",
            "manifest_sha256": "a" * 64,
            "manifest_size": 10,
            "samples": 2,
            "skipped": 0,
            "payload_bytes": 5,
            "shards": [{"key": f"data/p{i}/d/shard-000000.tar", "size": 9, "members": 2}],
            "segment": "b" * 64,
        }
        for i in (2, 1)
    ]
    data = encode_partitions(entries)
    assert decode_partitions(data, "t") == sorted(entries, key=lambda e: e["id"])
    ref = ObjectRef("k", "0" * 64, len(data), 2)
    with pytest.raises(IntegrityError, match="does not match its recorded sha256"):
        ref.check(data, "k")


def test_segment_row_groups_prune_by_partition() -> None:
    n = SEGMENT_ROW_GROUP * 2 + 10
    pids = [f"p{i % 3}" for i in range(n)]
    table = pa.table({"key": [f"k{i}" for i in range(n)], "partition": pids})
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(pa.BufferReader(encode_segment(table))).metadata
    assert meta.num_row_groups == 3
    assert row_groups_for(meta, ["p0"]) == [0]  # sorted by partition: p0 fills group 0 only
    assert row_groups_for(meta, None) == [0, 1, 2]


def test_incremental_publish_writes_one_segment_and_reads_equal_manifests(
    tmp_path: Path,
) -> None:
    src, store = tmp_path / "src", open_store(str(tmp_path / "root"))
    _pack_logs(src, store, "v1", ["a", "b", "c"], None)
    _pack_logs(src, store, "v2", ["d"], "v1")
    v1, v2 = load_version(store, "v1"), load_version(store, "v2")
    one = v1.header.catalog
    two = v2.header.catalog
    assert one is not None and two is not None
    assert set(two.segments) > set(one.segments) and len(two.segments) == 2
    new = next(s for s in two.segments if s not in one.segments)
    assert new.rows == 2  # only the added partition's rows were written
    for tag in ("v1", "v2"):
        got = catalog_rows(store, load_version(store, tag))
        assert got.equals(_manifest_rows(store, tag).select(got.column_names))
    picked = select(catalog_rows(store, v2), "partition = 'nope' OR key LIKE 'd/%'", ["key"])
    assert sorted(picked.column("key").to_pylist()) == ["d/f0", "d/f1"]


def test_segments_merge_above_the_threshold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(catalog_mod, "MAX_LIVE_SEGMENTS", 2)
    src, store = tmp_path / "src", open_store(str(tmp_path / "root"))
    _pack_logs(src, store, "v1", ["a", "b"], None)
    for i, log in enumerate(["c", "d", "e"]):
        _pack_logs(src, store, f"v{i + 2}", [log], f"v{i + 1}")
    last = load_version(store, "v4")
    assert last.header.catalog is not None and len(last.header.catalog.segments) <= 2
    got = catalog_rows(store, last)
    assert got.equals(_manifest_rows(store, "v4").select(got.column_names))


def test_ranged_segment_reads_project_and_prune(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, store = tmp_path / "src", open_store(str(tmp_path / "root"))
    _pack_logs(src, store, "v1", ["a", "b", "c"], None)
    version = load_version(store, "v1")
    whole = catalog_rows(store, version, ["key", "offset", "partition"])
    monkeypatch.setattr(catalog_mod, "WHOLE_READ_BYTES", 0)
    monkeypatch.setattr(catalog_mod, "RANGED_MAX_FRACTION", 10.0)  # a tiny segment: force it
    counter = RequestCounter()
    pid = version.entries[0].id
    part = catalog_rows(store.with_layers(counter), version, ["key", "offset"], pids=[pid])
    expected = whole.filter(pa.compute.equal(whole.column("partition"), pid))
    assert part.equals(expected.select(["key", "offset"])) and part.num_rows == 2
    calls = counter.requests
    assert calls["read"] == 0 and calls["read_range"] >= 1  # footer + chunks, never the object


def test_a_corrupt_segment_is_refused(tmp_path: Path) -> None:
    src, store = tmp_path / "src", open_store(str(tmp_path / "root"))
    _pack_logs(src, store, "v1", ["a", "b"], None)
    version = load_version(store, "v1")
    segment = version.catalog_objects()[1]
    data = bytearray(store.read(segment.key))
    data[len(data) // 2] ^= 1
    store.write(segment.key, bytes(data))
    with pytest.raises(IntegrityError, match="catalog object does not match"):
        ShardDataset(str(tmp_path / "root"), batch_size=1, num_workers=0)


def test_format_1_versions_load_and_get_an_attached_catalog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    shutil.copytree(GOLDEN / "v1" / "root", root)
    store = open_store(str(root))
    v2 = load_version(store, "v2")
    assert v2.header.catalog is None and load_catalog(store, v2).built is not None
    built = catalog_rows(store, v2)
    assert main(["catalog", str(root)]) == 0
    assert "attached" in capsys.readouterr().out
    assert main(["catalog", str(root), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [set(row) for row in rows] == [{"tag", "hash", "catalog", "segments", "rows"}] * 2
    assert [(r["tag"], r["catalog"]) for r in rows] == [("v1", "attached"), ("v2", "attached")]
    catalog_mod._built.clear()
    recorder = KeyRecorder()
    counted = store.with_layers(recorder)
    attached = load_catalog(counted, load_version(counted, "v2"))
    assert attached.ref is not None and attached.built is None
    got = attached.rows()
    assert got.equals(built.select(got.column_names))
    assert not [k for k in recorder.keys if "manifest" in k]
    # A publish on top of it reuses the attached catalog's segments.
    body = VersionBody("v3", "v2", load_version(store, "v2").entries)
    v3 = publish_version(store, body, read_state(store))
    assert v3.header.catalog is not None and attached.ref is not None
    assert v3.header.catalog.segments == attached.ref.segments
    assert shardlake.open(str(root)).dataset("v3").version.samples == built.num_rows


def test_version_record_is_a_small_header(tmp_path: Path) -> None:
    src, store = tmp_path / "src", open_store(str(tmp_path / "root"))
    _pack_logs(src, store, "v1", [f"log{i}" for i in range(40)], None)
    version = load_version(store, "v1")
    assert "partitions" not in version.header_doc and version.partition_count == 40
    assert len(store.read(f"versions/v1/{version.hash}.json")) < 2000
    with pytest.raises(FormatError, match="unknown version format"):
        from shardlake.format.documents import VersionHeader

        VersionHeader.from_json({**version.header_doc, "format": "x"}, "t")


def test_verify_offsets_reports_a_catalog_that_disagrees_with_a_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    src, store = tmp_path / "src", open_store(str(tmp_path / "root"))
    _pack_logs(src, store, "v1", ["a", "b"], None)
    assert shardlake.open(store).verify_offsets("v1").ok
    real = catalog_mod._fresh_rows

    def shifted(*args: Any) -> Any:
        for entry, table in real(*args):
            offsets = pa.compute.add(table.column("offset"), 1)
            yield entry, table.set_column(table.schema.get_field_index("offset"), "offset", offsets)

    monkeypatch.setattr(catalog_mod, "_fresh_rows", shifted)
    _pack_logs(src, store, "v2", ["c"], "v1")
    report = shardlake.open(store).verify_offsets("v2")
    assert not report.ok
    assert [p.message for p in report.problems] == [
        "the version's catalog rows (2) differ from the manifest's"
    ]


def test_versions_reads_record_headers_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src, store = tmp_path / "src", open_store(str(tmp_path / "root"))
    _pack_logs(src, store, "v1", ["a", "b"], None)
    _pack_logs(src, store, "v2", ["c"], "v1")
    recorder = KeyRecorder()
    infos = shardlake.open(store.with_layers(recorder)).versions()  # what `versions` prints
    assert [i.partitions for i in infos] == [2, 3]
    assert recorder.keys and not [k for k in recorder.keys if k.startswith("catalog/")]


def test_a_large_segment_is_decoded_on_threads_in_row_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A segment of many row groups is decoded in contiguous runs, each on its own thread and
    reader (a first rank's start-up at 5M rows: 0.25 s instead of 0.5-1.4 s), and the rows
    come back in order, filtered as a single reader filters them."""
    import io

    import pyarrow.parquet as pq

    import shardlake.format.catalog as format_catalog
    from shardlake.format.catalog import PARALLEL_ROW_GROUPS, decode_segment

    monkeypatch.setattr(format_catalog.os, "cpu_count", lambda: 4)  # threads on any machine
    n = 40 * PARALLEL_ROW_GROUPS
    table = pa.table(
        {
            "key": [f"k{i:05d}" for i in range(n)],
            "partition": [f"p{i // 37:03d}" for i in range(n)],
            "offset": list(range(n)),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=10)
    data = pa.py_buffer(sink.getvalue())
    opened: list[int] = []

    def open_file() -> pq.ParquetFile:
        opened.append(1)
        return pq.ParquetFile(pa.BufferReader(data))

    pids = sorted(set(table.column("partition").to_pylist()))
    whole = decode_segment(open_file, "seg", ["key", "offset"], pids, every_row=True)
    assert whole.to_pylist() == table.select(["key", "offset"]).to_pylist()
    assert len(opened) >= 2  # more than one reader: decoded on threads
    some = decode_segment(open_file, "seg", None, ["p001", "p007"])
    assert some.column("partition").to_pylist() == ["p001"] * 37 + ["p007"] * 37
    assert some.column("offset").to_pylist() == [*range(37, 74), *range(259, 296)]


def test_every_read_path_gives_rows_in_partition_order(tmp_path: Path) -> None:
    """Partitions asked for in any order (and twice) come back in partition-id order, then
    manifest order: on a format-1 version read from its manifests and on a catalog alike."""
    root = tmp_path / "root"
    shutil.copytree(GOLDEN / "v1" / "root", root)
    src, store = tmp_path / "src", open_store(str(tmp_path / "new"))
    _pack_logs(src, store, "v1", ["a", "b", "c"], None)
    for ds in (shardlake.open(str(root)).dataset("v2"), shardlake.open(store).dataset("v1")):
        everything = ds.manifests(["key", "partition"])
        assert everything.column("partition").to_pylist() == sorted(
            everything.column("partition").to_pylist()
        )
        ids = [e.id for e in ds.entries]
        asked = [*reversed(ids), ids[0]]
        got = ds.manifests(["key"], pids=asked)
        assert got.column("key").to_pylist() == everything.column("key").to_pylist()


@pytest.mark.parametrize("parts", [3, 200])
def test_rows_of_several_segments_are_a_stable_sort_by_partition(parts: int) -> None:
    """Runs of segments put in partition order equal a stable per-row sort (ties in their
    order), whatever the runs: interleaved, split, a partition in two tables, unicode ids."""
    import numpy as np

    rng = np.random.default_rng(parts)
    names = [f"p{i:03d}" for i in range(parts)] + ["é", "z/é", "Z"]
    tables = []
    for t in range(3):
        pids = sorted(rng.choice(names, size=400).tolist())
        if t == 2:
            pids = pids[200:] + pids[:200]  # a table that is not one sorted run
        tables.append(pa.table({"partition": pids, "key": [f"t{t}-{i}" for i in range(len(pids))]}))
    got = catalog_mod._ordered(tables, None)
    whole = pa.concat_tables(tables)
    want = whole.take(pa.compute.sort_indices(whole.column("partition")))
    assert got.to_pydict() == want.to_pydict()


class OpRecorder:
    """A store layer recording (operation, key) of every request, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, request: Request, send: Callable[[], Any]) -> Any:
        self.calls.append((request.op, request.key))
        return send()


def test_a_large_version_is_written_as_segments_of_bounded_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows beyond a segment's bound go into further segments of whole partitions, each
    written before the next partitions' manifests are read again (memory holds one part)."""
    import shardlake.meta.publish as publish_mod

    monkeypatch.setattr(catalog_mod, "SEGMENT_MAX_ROWS", 4)
    monkeypatch.setattr(publish_mod, "FRESH_ROWS_KEPT", 2)  # one manifest kept, four re-read
    src, root = tmp_path / "src", tmp_path / "root"
    recorder = OpRecorder()
    store = open_store(str(root)).with_layers(recorder)
    _pack_logs(src, store, "v1", ["a", "b", "c", "d", "e"], None)
    calls = list(recorder.calls)  # the pack's requests
    version = load_version(store, "v1")
    ref = version.header.catalog
    assert ref is not None
    assert sorted(s.rows for s in ref.segments) == [2, 4, 4]
    segment_of = {e.id: e.segment for e in version.entries}
    by_id = sorted(version.entries, key=lambda e: e.id)
    assert [segment_of[e.id] for e in by_id[::2]] == [segment_of[e.id] for e in by_id[1::2]] + [
        segment_of[by_id[-1].id]
    ]  # id-ordered pairs share a segment
    got = catalog_rows(store, version)
    assert got.equals(_manifest_rows(store, "v1").select(got.column_names))
    # Streaming: the first segment is written before the last partitions' manifests are read
    # for the catalog (each new manifest is read once for its digest, later ones again here).
    segments = [i for i, (op, k) in enumerate(calls) if op == "create" and "segments/" in k]
    last = by_id[-1].manifest
    rereads = [i for i, (op, k) in enumerate(calls) if op == "read" and k == last]
    assert len(segments) == 3 and len(rereads) == 2 and segments[0] < rereads[-1]
    loader = ShardDataset(store, "v1", batch_size=2, num_workers=0, include_key=True).loader()
    keys = [k for batch in loader for k in batch["__key__"]]
    assert sorted(keys) == sorted(got.column("key").to_pylist())


def test_merges_take_the_small_segments_and_never_rewrite_full_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(catalog_mod, "SEGMENT_MAX_ROWS", 4)
    monkeypatch.setattr(catalog_mod, "MAX_LIVE_SEGMENTS", 3)
    src, store = tmp_path / "src", open_store(str(tmp_path / "root"))
    _pack_logs(src, store, "v1", ["a", "b", "c", "d"], None)  # two full segments of 4 rows
    first = load_version(store, "v1").header.catalog
    assert first is not None and [s.rows for s in first.segments] == [4, 4]
    counts = []
    for i, log in enumerate(["e", "f", "g"]):
        _pack_logs(src, store, f"v{i + 2}", [log], f"v{i + 1}")
        ref = load_version(store, f"v{i + 2}").header.catalog
        assert ref is not None and set(first.segments) <= set(ref.segments)  # full: never merged
        counts.append([s.rows for s in ref.segments])
    # v3: e's small segment merged with f's rows; v4: nothing small left to merge, g alone.
    assert [sorted(c) for c in counts] == [[2, 4, 4], [4, 4, 4], [2, 4, 4, 4]]
    got = catalog_rows(store, load_version(store, "v4"))
    assert got.equals(_manifest_rows(store, "v4").select(got.column_names))
