"""Ray: the executor for pack and the read passes, write_ray and shardlake.ray.read, on one local
Ray instance per module (``ray.init(num_cpus=2)``), on local disk and SeaweedFS."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.writer import Sample, assert_same_arrays, make_samples, revisions

import shardlake
from shardlake import WriteOptions
from shardlake.cli.main import main
from shardlake.errors import IntegrityError, SourceError, UsageError
from shardlake.testing.fixtures import StoreLocation

ray = pytest.importorskip("ray")
import shardlake.ray  # noqa: E402 - needs ray

SHARD = 1500


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[Any]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def packed(packed_root: Callable[..., tuple[Path, Path]]) -> tuple[Path, Path]:
    return packed_root([4, 4, 4], name="ray")


def _json(capsys: pytest.CaptureFixture[str], argv: list[str], rc: int = 0) -> dict[str, Any]:
    capsys.readouterr()
    assert main([*argv, "--json", "--quiet"]) == rc
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_read_passes_on_ray_equal_the_thread_executor(
    ray_instance: Any, packed: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    src, root = packed
    for argv in (
        ["verify", str(root), "--source", str(src), "--expected-partitions", "3"],
        ["scrub", str(root)],
        ["verify-offsets", str(root)],
    ):
        thread, on_ray = (_json(capsys, [*argv, "--executor", e]) for e in ("thread", "ray"))
        assert thread["ok"] is True and on_ray == thread, argv


def test_pack_and_export_on_ray(
    ray_instance: Any, packed: tuple[Path, Path], tmp_path: Path
) -> None:
    src, root = packed
    on_ray = shardlake.open(tmp_path / "ray-root")
    on_ray.pack(src, tag="v1", executor="ray", shard_size=150_000)
    assert revisions(on_ray, "v1") == revisions(shardlake.open(root), "v1")
    dest = tmp_path / "copy"
    report = shardlake.open(root).export(str(dest), executor="ray")
    assert report.committed and shardlake.open(dest).scrub(executor="ray").ok


def test_memory_root_refuses_ray(ray_instance: Any) -> None:
    with pytest.raises(UsageError, match="memory://"):
        shardlake.open("memory://ray-refuse").scrub(executor="ray")


def test_read_takes_a_store_like_and_refuses_options_with_an_opened_one(tmp_path: Path) -> None:
    lake = shardlake.open(str(tmp_path / "root"))
    for opened in (lake, lake.store):
        with pytest.raises(UsageError, match=r"ray.read\(root\): storage options go with a URL"):
            shardlake.ray.read(opened, storage_options={"auto_mkdir": True})


def _rows(samples: list[Sample]) -> list[dict[str, Any]]:
    return [{"key": key, **arrays, "meta": meta} for key, arrays, meta in samples]


@pytest.mark.parametrize("store_kind", ["local", "seaweedfs"])
def test_write_ray_equals_the_writer_and_reads_back_bit_exact(
    ray_instance: Any, store_factory: Callable[..., StoreLocation], tmp_path: Path
) -> None:
    samples = make_samples(partitions=3, per_partition=6)
    location = store_factory(label="ray")
    root = shardlake.open(location.url, **location.storage_options)
    dataset = ray.data.from_items(_rows(samples[::-1]), override_num_blocks=4)
    report = root.write_ray(dataset, "v1", options=WriteOptions(shard_size=SHARD))
    assert report.version.samples == len(samples)
    written = shardlake.open(tmp_path / "writer")
    with written.writer("v1", options=WriteOptions(shard_size=SHARD)) as w:
        for key, arrays, meta in samples:
            w.write(key, arrays, meta=meta)
    assert revisions(root, "v1") == revisions(written, "v1")
    # The executor on this store: the same reports as the thread executor's.
    for check in (root.scrub, root.verify_offsets):
        thread = check(executor="thread", progress=False).to_json()
        assert thread["ok"] is True
        assert check(executor="ray", progress=False).to_json() == thread
    # Read back: every row bit-exact, sidecar fields asked for carried.
    got = shardlake.ray.read(root, "v1", columns=["index"]).take_all()
    by_key = {row["key"]: row for row in got}
    assert sorted(by_key) == sorted(k for k, _, _ in samples)
    for key, arrays, meta in samples:
        row = by_key[key]
        assert_same_arrays({n: row[n] for n in arrays}, arrays)
        assert row["index"] == meta["index"]


def test_read_equals_the_loader_for_a_selection(
    ray_instance: Any, packed: tuple[Path, Path]
) -> None:
    _src, root = packed
    opened = shardlake.open(root)
    keys = opened.dataset("v1").keys()
    opened.keysets.create("odd", version="v1", keys=keys[1::2])
    first = keys[0].split("/")[0]
    where = f"key NOT LIKE '{first}/%'"
    rows = shardlake.ray.read(str(root), keyset="odd", where=where).take_all()
    want = [k for k in keys[1::2] if not k.startswith(first + "/")]
    assert sorted(r["key"] for r in rows) == sorted(want) and want
    from shardlake.torch import ShardDataset

    loader = ShardDataset(
        str(root), keyset="odd", batch_size=1, shuffle=False, include_key=True
    ).loader()
    seen = 0
    for batch in loader:
        key = batch["__key__"][0]
        if key not in want:
            continue
        row = next(r for r in rows if r["key"] == key)
        for name, value in batch.items():
            if name.startswith("__") or not hasattr(value, "numpy"):
                continue
            assert np.array_equal(np.asarray(row[name]), value[0].numpy()), (key, name)
        seen += 1
    assert seen == len(want)


def test_flipped_byte_is_named(
    ray_instance: Any, packed_root: Callable[..., tuple[Path, Path]]
) -> None:
    _src, root = packed_root([3], name="ray-flip")
    entry = shardlake.open(root).dataset("v1").entries[0]
    row = shardlake.open(root).dataset("v1").manifest(entry.id).to_pylist()[0]
    shard = root / entry.shards[int(row["shard"])].key
    data = bytearray(shard.read_bytes())
    data[int(row["offset"]) + row["size"] // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=rf"key '{row['key']}' offset {row['offset']}"):
        shardlake.ray.read(str(root)).take_all()


def test_bad_record_fails_once_and_publishes_nothing(ray_instance: Any, tmp_path: Path) -> None:
    samples = make_samples(partitions=2, per_partition=3)
    root = shardlake.open(tmp_path / "root")
    bad = [*_rows(samples), {"key": "log1/bad", "x": np.array([None], dtype=object)}]
    with pytest.raises(SourceError, match="log1/bad"):
        root.write_ray(ray.data.from_items(bad), "v1")
    dup = _rows([*samples, samples[0]])
    with pytest.raises(SourceError, match="duplicate key"):
        root.write_ray(ray.data.from_items(dup), "v1")
    assert root.versions() == []


def test_a_task_whose_worker_dies_is_rerun(ray_instance: Any, tmp_path: Path) -> None:
    from shardlake.executors.tasks import make_executor

    def die_once(marker: str) -> str:
        """Kill this Ray worker on the first attempt (as an OOM kill would); succeed on the re-run.
        (Nested, so Ray pickles it by value: workers cannot import a test module.)"""
        if not os.path.exists(marker):
            Path(marker).write_text("died")
            os._exit(1)
        return "re-run"

    executor, close = make_executor("ray", 2)
    try:
        assert executor.submit(die_once, str(tmp_path / "marker")).result(timeout=300) == "re-run"
    finally:
        close()
    assert ray.is_initialized()  # joined the test's instance: not shut down by close()


def test_ray_train_consumes_a_read(ray_instance: Any, tmp_path: Path) -> None:
    samples = make_samples(partitions=2, per_partition=4)
    root = shardlake.open(tmp_path / "root")
    with root.writer("v1") as w:
        for key, arrays, meta in samples:
            w.write(key, arrays, meta=meta)
    # What a Ray Train worker consumes: tensors of the fixed-shape fields (a key is a string,
    # which torch has no tensor for).
    read = shardlake.ray.read(root, "v1").select_columns(["ego", "ids"])
    got = sorted(
        (batch["ego"][i].numpy().tobytes(), batch["ids"][i].numpy().tobytes())
        for batch in read.iter_torch_batches(batch_size=3)
        for i in range(len(batch["ego"]))
    )
    assert got == sorted((a["ego"].tobytes(), a["ids"].tobytes()) for _, a, _ in samples)
