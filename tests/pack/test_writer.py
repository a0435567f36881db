"""Root.writer: same revisions as pack, verified, loadable, incremental; bad input publishes nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.writer import (
    assert_loads_bit_exact,
    assert_same_arrays,
    make_samples,
    revisions,
    write_npz_tree,
)

import shardlake
from shardlake import PackOptions, WriteOptions
from shardlake.errors import SourceError, UsageError
from shardlake.testing.fixtures import StoreLocation

SHARD = 1500  # small shards: every partition rolls over several


def _open(location: StoreLocation) -> shardlake.Root:
    return shardlake.open(location.url, **location.storage_options)


@pytest.mark.parametrize("store_kind", ["local", "s3"])
def test_writer_matches_pack_verifies_and_loads(
    store_factory: Callable[..., StoreLocation], tmp_path: Path
) -> None:
    samples = make_samples()
    written, packed = store_factory(label="written"), store_factory(label="packed")
    root = _open(written)
    with root.writer("v1", options=WriteOptions(shard_size=SHARD)) as w:
        for key, arrays, meta in samples:
            w.write(key, arrays, meta=meta)
    report = w.report
    assert report.version.samples == len(samples) and sorted(report.built) == [
        "log0",
        "log1",
        "log2",
    ]
    # pack from npz files of the same samples (canonical form): the same revisions, shards too
    source = tmp_path / "src"
    write_npz_tree(source, samples)
    other = _open(packed)
    other.pack(source, tag="v1", options=PackOptions(shard_size=SHARD, executor="inline"))
    assert revisions(root, "v1") == revisions(other, "v1")
    for entry in root.dataset("v1").version.entries:
        assert len(entry.shards) > 1
        for shard in entry.shards:
            assert root.store.read(shard.key) == other.store.read(shard.key)
    # verified both ways against the npz tree; at rest; bit-exact through get and the loader
    assert root.verify(source).ok and root.scrub().ok
    ds = root.dataset("v1")
    for key, arrays, _ in samples:
        assert_same_arrays(ds.get(key), arrays)
    assert ds.query("\"scene.weather\" = 'rain'", columns=["key"]).num_rows == 9
    assert_loads_bit_exact(written.url, "v1", samples, written.storage_options or None)


def test_base_carries_reuses_replaces_and_deletes(tmp_path: Path) -> None:
    samples = make_samples(partitions=4)
    root = shardlake.open(tmp_path / "root")
    with root.writer("v1") as w:
        for key, arrays, meta in samples:
            w.write(key, arrays, meta)
    root.keysets.create("all", version="v1", where="true")
    changed = {k: a for k, a, _ in samples if k.startswith("log1/")}
    changed["log1/000000"] = {**changed["log1/000000"], "ego": np.zeros((4, 3), np.float32)}
    with root.writer("v2", base="v1") as w:
        for key, arrays, meta in samples:
            if key.startswith("log0/"):
                w.write(key, arrays, meta)  # identical content: its revision is reused
            elif key.startswith("log1/"):
                w.write(key, changed[key], meta)
        w.delete_partition("log3")
    report = w.report
    assert report.reused == ["log0"] and report.built == ["log1"]
    assert report.carried == ["log2"] and report.dropped == ["log3"]
    assert report.version.base == "v1"
    before, after = revisions(root, "v1"), revisions(root, "v2")
    assert after["log0"] == before["log0"] and after["log2"] == before["log2"]
    assert after["log1"][0] != before["log1"][0] and "log3" not in after
    diff = root.diff("v1", "v2", samples=True)
    assert diff.removed == ["log3"] and diff.data_changed == ["log1"]
    assert diff.changed_keys == ["log1/000000"]
    rebased = root.keysets.rebase("all", "v2", new_name="all-v2")
    assert (rebased.kept, rebased.dropped, rebased.changed) == (len(samples) - 6, 6, 1)
    assert rebased.changed_keys == ["log1/000000"]
    assert root.scrub().ok
    assert_same_arrays(root.dataset("v2").get("log1/000000"), changed["log1/000000"])


def test_meta_only_change_writes_only_a_manifest(tmp_path: Path) -> None:
    samples = make_samples(partitions=1)
    root = shardlake.open(tmp_path / "root")
    with root.writer("v1") as w:
        for key, arrays, meta in samples:
            w.write(key, arrays, meta)
    with root.writer("v2", base="v1") as w:
        for key, arrays, meta in samples:
            w.write(key, arrays, {**meta, "label": 7})
    assert w.report.manifest_only == ["log0"]
    assert revisions(root, "v2")["log0"][0] == revisions(root, "v1")["log0"][0]
    assert root.diff("v1", "v2").meta_changed == ["log0"]


def test_strings_bytes_big_endian_partition_and_skipped(tmp_path: Path) -> None:
    root = shardlake.open(tmp_path / "root")
    arrays = {
        "names": np.array(["car", "pedestrian"]),
        "blob": np.array([b"\x00\x01", b"z"]),
        "be": np.arange(6, dtype=">f8").reshape(2, 3),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)),
    }
    with root.writer("v1") as w:
        w.write("frame-1", arrays, partition="flat")
        w.write("frame-2", {"x": np.ones(2)}, meta={"is_skipped": True}, partition="flat")
    assert w.report.skipped_samples == 1 and w.report.version.samples == 1
    assert_same_arrays(root.dataset("v1").get("frame-1"), arrays)


def _spill_files(spill: Path) -> list[str]:
    return os.listdir(spill)


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (lambda w: w.write("a/1", {"x": np.ones(2)}) or w.write("a/1", {"x": np.ones(2)}), "a/1"),
        (lambda w: w.write("a/2", {"x": np.array([{}, 1], dtype=object)}), "dtype object"),
        (lambda w: w.write("a/../b", {"x": np.ones(2)}), "'a/../b' is not a valid"),
        (lambda w: w.write("/abs/3", {"x": np.ones(2)}), "'/abs/3' is not a valid"),
        (lambda w: w.write("a/4", {}), "empty write"),
        (lambda w: w.write("a/5", {"x": [1, 2]}), "not a NumPy array"),
        (lambda w: w.write("top", {"x": np.ones(2)}), "no parent path"),
        (lambda w: w.write("a/6", {"x": np.ones(2)}, meta={"v": float("nan")}), "a/6"),
    ],
)
def test_bad_input_names_the_key_and_publishes_nothing(
    tmp_path: Path, write: Callable[[shardlake.Writer], None], message: str
) -> None:
    root = shardlake.open(tmp_path / "root")
    with pytest.raises(SourceError, match=message), root.writer("v1") as w:
        w.write("a/0", {"x": np.ones(2)})
        write(w)
    assert root.versions() == []
    with pytest.raises(UsageError, match="has not published"):
        w.report  # noqa: B018 - the property raises


def test_empty_writer_publishes_nothing(tmp_path: Path) -> None:
    root = shardlake.open(tmp_path / "root")
    with pytest.raises(SourceError, match="nothing was written"), root.writer("v1"):
        pass
    assert root.versions() == []


def test_interrupted_writer_publishes_nothing_and_removes_its_spill(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    spill.mkdir()
    root = shardlake.open(tmp_path / "root")
    samples = make_samples(partitions=2)
    with (
        pytest.raises(KeyboardInterrupt),
        root.writer("v1", options=WriteOptions(spill_dir=spill)) as w,
    ):
        for i, (key, arrays, meta) in enumerate(samples):
            if i == 7:
                raise KeyboardInterrupt
            w.write(key, arrays, meta)
    assert root.versions() == [] and _spill_files(spill) == []
    assert w.samples == 7
    with pytest.raises(UsageError, match="closed"):
        w.write("log9/0", {"x": np.ones(1)})
    # the tag is still free: a second run publishes it
    with root.writer("v1") as w:
        for key, arrays, meta in samples:
            w.write(key, arrays, meta)
    assert [v.tag for v in root.versions()] == ["v1"]


def test_options_and_base_are_checked_up_front(tmp_path: Path) -> None:
    root = shardlake.open(tmp_path / "root")
    with root.writer("v1") as w:
        w.write("a/1", {"x": np.ones(2)})
    with pytest.raises(shardlake.ConflictError, match="already exists"):
        root.writer("v1")
    with pytest.raises(shardlake.VersionNotFoundError, match="nope"):
        root.writer("v2", base="nope")
    with pytest.raises(UsageError, match="recipe"):
        root.writer("v2", base="v1", options=WriteOptions(level=9))
    with pytest.raises(UsageError, match="not in the base"), root.writer("v2", base="v1") as w:
        w.delete_partition("b")
    assert [v.tag for v in root.versions()] == ["v1"]
    assert tempfile.gettempdir()  # the default spill directory exists


def test_encode_threads_give_the_same_version_and_abort_cleanly(tmp_path: Path) -> None:
    samples = make_samples(partitions=3, per_partition=10)
    roots = {}
    for threads in (1, 3):
        root = shardlake.open(tmp_path / f"root{threads}")
        options = WriteOptions(shard_size=SHARD, encode_threads=threads)
        with root.writer("v1", options=options) as w:
            for key, arrays, meta in samples:
                w.write(key, arrays, meta)
        roots[threads] = root
    assert revisions(roots[1], "v1") == revisions(roots[3], "v1")
    assert roots[3].scrub().ok
    spill = tmp_path / "spill"
    spill.mkdir()
    options = WriteOptions(encode_threads=3, spill_dir=spill)
    with pytest.raises(KeyboardInterrupt), roots[3].writer("v2", options=options) as w:
        for key, arrays, meta in samples[:12]:
            w.write(key, arrays, meta)
        raise KeyboardInterrupt
    assert [v.tag for v in roots[3].versions()] == ["v1"] and _spill_files(spill) == []


def test_finished_partitions_build_early_and_free_their_spill(tmp_path: Path) -> None:
    samples = make_samples(partitions=3, per_partition=5)
    spill = tmp_path / "spill"
    spill.mkdir()
    root = shardlake.open(tmp_path / "root")
    options = WriteOptions(shard_size=SHARD, spill_dir=spill)
    with root.writer("v1", options=options) as w:
        for p in range(3):
            for key, arrays, meta in samples[p * 5 : (p + 1) * 5]:
                w.write(key, arrays, meta)
            w.finish_partition(f"log{p}")
        with pytest.raises(UsageError, match="finished already"):
            w.write("log0/new", {"x": np.ones(1)})
        (tmpdir,) = os.listdir(spill)
        w.finish_partition("log2")  # again: nothing to do
        deadline = time.monotonic() + 30
        while os.listdir(spill / tmpdir) and time.monotonic() < deadline:
            time.sleep(0.05)  # the builds run in the background
        assert os.listdir(spill / tmpdir) == []  # built and freed before the writer closed
        assert root.versions() == []
    assert _spill_files(spill) == []
    other = shardlake.open(tmp_path / "other")
    with other.writer("v1", options=WriteOptions(shard_size=SHARD)) as w:
        for key, arrays, meta in samples:
            w.write(key, arrays, meta)
    assert revisions(root, "v1") == revisions(other, "v1")
    assert root.scrub().ok


def test_a_writer_that_only_deletes_publishes_the_base_without_it(tmp_path: Path) -> None:
    root = shardlake.open(tmp_path / "root")
    with root.writer("v1") as w:
        for key, arrays, meta in make_samples(partitions=2, per_partition=2):
            w.write(key, arrays, meta)
    with root.writer("v2", base="v1") as w:
        w.delete_partition("log0")
    assert w.report.dropped == ["log0"] and w.report.carried == ["log1"]
    assert sorted(revisions(root, "v2")) == ["log1"]
    with pytest.raises(SourceError, match="no partitions"), root.writer("v3", base="v2") as w:
        w.delete_partition("log1")
    assert [v.tag for v in root.versions()] == ["v1", "v2"]


def test_a_writer_outside_a_with_block_refuses_to_write_naming_with(tmp_path: Path) -> None:
    root = shardlake.open(tmp_path / "root")
    w = root.writer("v1")
    for use in (
        lambda: w.write("a/1", {"x": np.ones(2)}),
        lambda: w.finish_partition("a"),
        w.close,
    ):
        with pytest.raises(UsageError, match=r"outside a `with` block.*with root.writer\('v1'\)"):
            use()
    assert root.versions() == []
    with w:  # the same writer, used as documented, publishes
        w.write("a/1", {"x": np.ones(2)})
    assert [v.tag for v in root.versions()] == ["v1"]


_WRITE_AND_WAIT = """
import sys, time
import numpy as np
import shardlake
root = shardlake.open(sys.argv[1])
with root.writer("v1", options=shardlake.WriteOptions(spill_dir=sys.argv[2])) as w:
    for i in range(20):
        w.write(f"log0/{i:04d}", {"x": np.arange(1000) + i})
    print("written", flush=True)
    time.sleep(120)
"""


def _writer_process(root: Path, spill: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITE_AND_WAIT, str(root), str(spill)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "written\n"
    assert len(os.listdir(spill)) == 1  # its spill, holding the samples
    return proc


def test_sigterm_removes_the_spill_and_the_next_writer_removes_a_killed_ones(
    tmp_path: Path,
) -> None:
    spill = tmp_path / "spill"
    spill.mkdir()
    root = tmp_path / "root"
    # SIGTERM: the process still ends by SIGTERM, and its spill is gone.
    proc = _writer_process(root, spill)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    assert os.listdir(spill) == []
    # SIGKILL leaves the spill; the next writer on this host removes it, as the process is gone.
    proc = _writer_process(root, spill)
    (killed,) = os.listdir(spill)
    proc.kill()
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert os.listdir(spill) == [killed]
    live = spill / killed.replace(f"-{proc.pid}-", f"-{os.getppid()}-")  # a live process's
    live.mkdir()
    foreign = spill / "shardlake-writer-notours"  # not a name the writer makes: left alone
    foreign.mkdir()
    lake = shardlake.open(root)
    with lake.writer("v1", options=WriteOptions(spill_dir=spill)) as w:
        assert not (spill / killed).exists() and live.exists() and foreign.exists()
        w.write("log0/0000", {"x": np.arange(3)})
    assert sorted(os.listdir(spill)) == sorted([live.name, foreign.name])
    assert [v.tag for v in lake.versions()] == ["v1"]


def test_an_array_whose_shape_changes_is_flagged_and_the_loader_calls_it_usage(
    tmp_path: Path,
) -> None:
    from shardlake.torch import ShardDataset

    root = shardlake.open(tmp_path / "root")
    with pytest.warns(shardlake.RaggedFieldWarning) as caught, root.writer("v1") as w:
        for i in range(4):
            rows = 2 if i < 3 else 5  # the last sample's "lanes" has more rows
            w.write(
                f"log0/{i}",
                {"lanes": np.zeros((rows, 3), np.float32), "label": np.array(["x"] * (i + 1))},
            )
    messages = [str(c.message) for c in caught if c.category is shardlake.RaggedFieldWarning]
    assert messages == [
        "writer for 'v1': array 'lanes' is <f4[5, 3] in sample 'log0/3', <f4[2, 3] in sample "
        "'log0/0'; the loader batches samples whose arrays differ only with a transform= that "
        "pads or crops them"
    ]  # once, naming both shapes; string arrays (lists in a batch) may differ freely
    ds = ShardDataset(str(tmp_path / "root"), "v1", batch_size=4, shuffle=False, num_workers=0)
    with pytest.raises(UsageError, match="samples of one batch differ: array 'lanes'") as error:
        next(iter(ds.loader()))
    assert not isinstance(error.value, shardlake.FormatError)  # not a damaged file

    def pad(sample: dict[str, Any]) -> dict[str, Any]:
        lanes = np.zeros((5, 3), np.float32)
        lanes[: len(sample["lanes"])] = sample["lanes"]
        return {"lanes": lanes}

    padded = ShardDataset(
        str(tmp_path / "root"), "v1", batch_size=4, shuffle=False, num_workers=0, transform=pad
    )
    assert tuple(next(iter(padded.loader()))["lanes"].shape) == (4, 5, 3)


def test_a_losing_concurrent_writer_is_told_about_its_own_run(tmp_path: Path) -> None:
    root = shardlake.open(tmp_path / "root")
    with pytest.raises(shardlake.ConflictError) as lost, root.writer("v1") as late:
        late.write("a/1", {"x": np.ones(2)})
        with root.writer("v1") as early:  # opened after, closes (publishes) first
            early.write("a/1", {"x": np.zeros(2)})
    assert "was published by another writer while this write ran" in str(lost.value)
    assert "pack" not in str(lost.value)
    assert [v.tag for v in root.versions()] == ["v1"]


def test_the_writer_shows_progress_of_writing_then_building(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = shardlake.open(tmp_path / "root")
    with root.writer("v1", options=WriteOptions(progress=True)) as w:
        for key, arrays, meta in make_samples(partitions=2, per_partition=3):
            w.write(key, arrays, meta)
        w.finish_partition("log0")  # built while the rest is written: counted all the same
    err = capsys.readouterr().err.splitlines()
    assert any(line.startswith("write v1: 6 samples, ") for line in err), err
    assert err[-1].startswith("write v1: build: 2/2 partitions, 6/6 samples (100.0%)"), err
    with root.writer("v2", base="v1") as w:  # default: only on a terminal
        w.write("log0/000000", {"x": np.ones(2)})
    assert capsys.readouterr().err == ""
