"""scrub, verify and verify-offsets: pass on a good root; catch and name every kind of damage."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from support.lifecycle import pack_synth

import shardlake
from shardlake import Store
from shardlake.cli.main import main
from shardlake.errors import FormatError
from shardlake.testing import npz_bytes
from shardlake.testing.fixtures import StoreLocation


def _packed(location: StoreLocation, src: Path, **synth: object) -> Store:
    return pack_synth(location, src, 3, 4, seed=31, **synth)


def _first_row(store: Store) -> tuple[dict, dict, str]:  # type: ignore[type-arg]
    ds = shardlake.open(store).dataset()
    entry = ds.entries[0]
    rows = sorted(ds.manifest(entry.id).to_pylist(), key=lambda r: (r["shard"], r["offset"]))
    row = rows[-1]  # the last member of a shard: truncation hits it
    return entry, row, entry.shards[row["shard"]].key


@pytest.mark.parametrize("store_kind", ["local", "seaweedfs", "gcs"])
def test_clean_root_passes_everything(
    store_location: StoreLocation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    _packed(store_location, src, skip_fraction=0.25)
    root = store_location.url
    assert main(["scrub", root, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and len(report["partitions"]) == 3 and report["samples"] > 0
    assert main(["scrub", root, "--all"]) == 0
    assert "ok" in capsys.readouterr().out
    assert main(["verify-offsets", root]) == 0
    assert "verify-offsets OK" in capsys.readouterr().out
    assert main(["verify", root, "--source", str(src), "--expected-partitions", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["compared"] == out["source_samples"] == report["samples"]
    assert main(["verify", root, "--source", str(src), "--expected-partitions", "4"]) == 1
    assert "expected 4" in capsys.readouterr().out


@pytest.mark.parametrize("store_kind", ["local", "seaweedfs", "gcs"])
def test_flipped_byte_is_caught_and_named(
    store_location: StoreLocation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    store = _packed(store_location, src)
    entry, row, shard = _first_row(store)
    data = bytearray(store.read(shard))
    data[row["offset"] + row["size"] // 2] ^= 0x40
    store.write(shard, bytes(data))
    report = shardlake.open(store).scrub()
    assert not report.ok and len(report.problems) == 1
    partitions = report.to_json()["partitions"]
    assert [list(p) for p in partitions] == [["partition", "samples", "bytes", "problems"]] * len(
        partitions
    )
    assert sum(p["problems"] for p in partitions) == 1
    problem = report.problems[0]
    assert (problem.key, problem.offset) == (row["key"], row["offset"]) and shard in problem.shard
    assert "checksum mismatch" in problem.message
    assert main(["scrub", store_location.url]) == 1
    err = capsys.readouterr().err
    assert shard in err and row["key"] in err and f"offset {row['offset']}" in err
    ver = shardlake.open(store).verify(str(src))
    assert not ver.ok and [p.key for p in ver.problems] == [row["key"]]
    assert main(["verify", store_location.url, "--source", str(src)]) == 1
    captured = capsys.readouterr()
    assert row["key"] in captured.err and "FAILED" in captured.out
    assert shardlake.open(store).verify_offsets().ok  # headers are intact: only the payload changed


def test_truncated_shard(tmp_path: Path) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    store = _packed(location, tmp_path / "src")
    entry, row, shard = _first_row(store)
    data = store.read(shard)
    store.write(shard, data[: row["offset"] + 10])
    report = shardlake.open(store).scrub()
    assert [p.key for p in report.problems] == [row["key"]]
    assert "truncated" in report.problems[0].message
    offsets = shardlake.open(store).verify_offsets()
    assert not offsets.ok
    messages = " ".join(str(p) for p in offsets.problems)
    assert shard in messages and "version says" in messages  # size vs the version entry
    assert row["key"] in messages


def test_swapped_manifests_are_caught(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    store = _packed(location, tmp_path / "src")
    ds = shardlake.open(store).dataset()
    a, b = ds.entries[0], ds.entries[1]
    data_a, data_b = store.read(a.manifest), store.read(b.manifest)
    store.write(a.manifest, data_b)
    store.write(b.manifest, data_a)
    report = shardlake.open(store).verify_offsets()
    assert not report.ok
    named = {p.partition for p in report.problems}
    assert named == {a.id, b.id}
    assert all("does not match the version entry" in p.message for p in report.problems)
    assert main(["verify-offsets", location.url]) == 1
    err = capsys.readouterr().err
    assert a.manifest in err and b.manifest in err
    # The read path refuses the swapped manifest too, naming it and the mismatch.
    with pytest.raises(FormatError, match="does not match the version entry") as info:
        shardlake.open(store).dataset().manifest(a.id)
    assert a.manifest in str(info.value)


def test_offsets_that_disagree_with_tar_headers(tmp_path: Path) -> None:
    """A manifest whose offsets were edited (metadata intact) is caught against the headers."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    location = StoreLocation("local", str(tmp_path / "root"))
    store = _packed(location, tmp_path / "src")
    entry = shardlake.open(store).dataset().entries[0]
    table = pq.read_table(io.BytesIO(store.read(entry.manifest)))  # a manifest is parquet
    shifted = table.set_column(
        table.column_names.index("offset"), "offset", pc.add(table.column("offset"), 512)
    )
    sink = io.BytesIO()
    pq.write_table(shifted, sink, compression="zstd")  # schema metadata (the manifest's) kept
    store.write(entry.manifest, sink.getvalue())
    report = shardlake.open(store).verify_offsets()
    # The version records each manifest's sha256 (format.md section 7), so the edited manifest
    # is refused as a whole before its offsets could be used or compared with the headers.
    assert [p.partition for p in report.problems] == [entry.id]
    assert "does not match the version entry" in report.problems[0].message


@pytest.mark.parametrize("store_kind", ["local", "seaweedfs", "gcs"])
def test_deleted_shard_is_caught_by_all_three(
    store_location: StoreLocation, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    store = _packed(store_location, src)
    entry, row, shard = _first_row(store)
    store.delete(shard)
    report = shardlake.open(store).scrub()
    assert report.problems and all(shard in p.shard for p in report.problems)
    assert "shard is missing" in report.problems[0].message
    offsets = shardlake.open(store).verify_offsets()
    assert [p.message for p in offsets.problems] == ["shard is missing"]
    ver = shardlake.open(store).verify(str(src))
    assert not ver.ok and row["key"] in {p.key for p in ver.problems}


def test_corrupted_manifest_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    store = _packed(location, tmp_path / "src")
    entry = shardlake.open(store).dataset().entries[0]
    store.write(entry.manifest, b"PAR1 garbage")
    for argv in (["scrub", location.url], ["verify-offsets", location.url]):
        assert main(argv) == 1
        assert entry.manifest in capsys.readouterr().err


def test_verify_membership_and_exact_allow_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    src = tmp_path / "src"
    store = _packed(location, src)
    keys = sorted(
        shardlake.open(store).dataset().manifests(columns=["key"]).column("key").to_pylist()
    )
    # A frame added to the source after packing is missing from the version.
    part_dir = src / keys[0].split("/")[0]
    shutil.copy(src / f"{keys[0]}.npz", part_dir / "late_frame.npz")
    late = f"{keys[0].split('/')[0]}/late_frame"
    report = shardlake.open(store).verify(str(src))
    assert report.missing == [late] and not report.ok
    assert shardlake.open(store).verify(str(src), allow_missing=1).ok
    assert not shardlake.open(store).verify(str(src), allow_missing=2).ok  # exactly, not at most
    assert main(["verify", location.url, "--source", str(src), "--allow-missing", "1"]) == 0
    assert f"missing: {late}" in capsys.readouterr().out  # offending keys printed on pass too
    # A source frame withdrawn after packing makes the version hold an extra sample.
    (src / f"{keys[1]}.npz").unlink()
    (src / f"{keys[1]}.json").unlink()
    report = shardlake.open(store).verify(str(src), allow_missing=1)
    assert report.extra == [keys[1]] and not report.ok
    assert main(["verify", location.url, "--source", str(src), "--allow-missing", "1"]) == 1
    captured = capsys.readouterr()
    assert f"extra: {keys[1]}" in captured.err and "FAILED" in captured.out
    # A source array changed after packing: the bit-exact compare names the key and array.
    import numpy as np

    arrays = dict(np.load(src / f"{keys[2]}.npz", allow_pickle=False))
    arrays["ego_current_state"] = arrays["ego_current_state"] + np.float32(1)
    (src / f"{keys[2]}.npz").write_bytes(npz_bytes(arrays))
    report = shardlake.open(store).verify(str(src), allow_missing=1)
    assert [p.key for p in report.problems] == [keys[2]]
    assert "ego_current_state" in report.problems[0].message


def test_verify_scopes_a_source_in_any_store(tmp_path: Path) -> None:
    """include / exclude / path_list scope the source whether it is a path or an opened store
    (a copy in memory://: absolute list entries map through strip_prefix there)."""
    location = StoreLocation("local", str(tmp_path / "root"))
    src = tmp_path / "src"
    store = _packed(location, src)
    first = sorted(p.name for p in src.iterdir() if p.is_dir())[0]
    late = f"{first}/late_frame"
    some_npz = next((src / first).glob("*.npz"))
    shutil.copy(some_npz, src / f"{late}.npz")
    copy = shardlake.open_store(f"memory://verify-scope-{tmp_path.name}")
    for path in sorted(src.rglob("*")):
        if path.is_file():
            copy.write(path.relative_to(src).as_posix(), path.read_bytes())
    root = shardlake.open(store)
    for source in (str(src), copy):
        assert root.verify(source).missing == [late]
        assert root.verify(source, exclude=["*/late_frame.npz"]).ok
        listed = tmp_path / "list.txt"
        packed = sorted(str(p) for p in src.rglob("*.npz") if p.stem != "late_frame")
        listed.write_text("\n".join(packed) + "\n")
        report = root.verify(source, path_list=listed, strip_prefix=str(src))
        assert report.ok and report.source_samples == len(packed)


def test_scrub_memory_is_bounded_by_batches(tmp_path: Path) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    store = _packed(location, tmp_path / "src")
    largest = max(
        shardlake.open(store).dataset().manifests(columns=["size"]).column("size").to_pylist()
    )
    bound = largest + 1
    fetched: list[int] = []
    real = store.read_ranges

    def spy(ranges):  # type: ignore[no-untyped-def]
        fetched.append(sum(end - start for _k, start, end in ranges))
        return real(ranges)

    store.read_ranges = spy  # type: ignore[method-assign]
    report = shardlake.open(store).scrub(batch_bytes=bound, workers=1)
    assert report.ok and report.samples == 12
    assert max(fetched) <= bound and len(fetched) > len({p.partition for p in report.partitions})


def test_verify_bad_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    _packed(location, tmp_path / "src")
    (tmp_path / "empty").mkdir()
    assert main(["verify", location.url, "--source", str(tmp_path / "empty")]) == 1
    assert "no .npz files" in capsys.readouterr().err
    assert main(["verify", location.url, "--source", str(tmp_path / "src"), "--version", "v9"]) == 1
    assert "unknown version" in capsys.readouterr().err


def test_verify_tells_a_changed_source_from_corruption_at_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A source frame rewritten after pack: the shard is intact (scrub agrees), so verify
    blames the source file, with the pack-time sha256 against today's; a flipped byte in the
    shard stays corrupt at rest, which scrub finds too."""
    import hashlib

    import numpy as np

    location = StoreLocation("local", str(tmp_path / "root"))
    src = tmp_path / "src"
    store = _packed(location, src)
    entry, row, shard = _first_row(store)
    keys = shardlake.open(store).dataset().manifests(columns=["key"]).column("key").to_pylist()
    changed = sorted(k for k in keys if k != row["key"])[0]
    path = src / f"{changed}.npz"
    old_sha = hashlib.sha256(path.read_bytes()).hexdigest()
    arrays = dict(np.load(path, allow_pickle=False))
    arrays["ego_agent_past"] = arrays["ego_agent_past"] + np.float32(0.5)
    path.write_bytes(npz_bytes(arrays))
    new_sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert shardlake.open(store).scrub().ok  # nothing is wrong with the dataset
    report = shardlake.open(store).verify(str(src))
    assert not report.ok and [p.key for p in report.problems] == [changed]
    problem = report.problems[0]
    assert problem.kind == "source changed" and str(path) in problem.message
    assert old_sha[:16] in problem.message and new_sha[:16] in problem.message
    counts = report.to_json()
    assert (counts["source_changed"], counts["corrupt_at_rest"]) == (1, 0)
    assert main(["verify", location.url, "--source", str(src)]) == 1
    captured = capsys.readouterr()
    assert "corrupt at rest" not in captured.err and "(source changed)" in captured.err
    assert "0 corrupt at rest, 0 transport errors, 1 source changed" in captured.out
    # Now damage the shard too: that sample is corrupt at rest, as scrub also reports.
    data = bytearray(store.read(shard))
    data[row["offset"] + row["size"] // 2] ^= 0x40
    store.write(shard, bytes(data))
    scrubbed = shardlake.open(store).scrub()
    assert [p.key for p in scrubbed.problems] == [row["key"]]
    report = shardlake.open(store).verify(str(src))
    kinds = {p.key: p.kind for p in report.problems}
    assert kinds == {changed: "source changed", row["key"]: "corrupt at rest"}
    assert (report.to_json()["source_changed"], report.to_json()["corrupt_at_rest"]) == (1, 1)
    assert main(["verify", location.url, "--source", str(src)]) == 1
    assert "1 corrupt at rest, 0 transport errors, 1 source changed" in capsys.readouterr().out
