"""verify, scrub, verify-offsets and export on a real Dask cluster (loopback, worker processes)."""

from __future__ import annotations

import concurrent.futures as cf
import json
import shutil
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import pytest

import shardlake
from shardlake.cli.main import main
from shardlake.errors import UsageError

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def packed(packed_root: Callable[..., tuple[Path, Path]]) -> tuple[Path, Path]:
    return packed_root([4, 4, 4], name="dask")


def _json(capsys: pytest.CaptureFixture[str], argv: list[str], rc: int = 0) -> dict[str, Any]:
    capsys.readouterr()
    assert main([*argv, "--json", "--quiet"]) == rc
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_reports_identical_inline_process_dask(
    packed: tuple[Path, Path], dask_address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    src, root = packed
    for argv in (
        ["verify", str(root), "--source", str(src), "--expected-partitions", "3"],
        ["scrub", str(root)],
        ["verify-offsets", str(root)],
    ):
        docs = [
            _json(capsys, [*argv, "--executor", e]) for e in ("inline", "process", dask_address)
        ]
        assert docs[0]["ok"] is True
        assert docs[1] == docs[0] and docs[2] == docs[0], argv
    assert docs[0]["rows"] == 12


def test_flipped_byte_named_under_dask(
    packed: tuple[Path, Path],
    dask_address: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src, clean = packed
    root = tmp_path / "root"
    shutil.copytree(clean, root)
    entry = shardlake.open(str(root)).dataset("v1").entries[1]
    shard = root / entry.shards[0].key
    data = bytearray(shard.read_bytes())
    # Flip one byte inside the first payload (the manifest says where it is).
    offset = _first_payload_offset(root, entry)
    data[offset] ^= 0xFF
    shard.write_bytes(bytes(data))
    scrub = _json(capsys, ["scrub", str(root), "--executor", dask_address], rc=1)
    verify = _json(
        capsys, ["verify", str(root), "--source", str(src), "--executor", dask_address], rc=1
    )
    inline = shardlake.open(str(root)).scrub(executor="inline").to_json()
    assert scrub == inline
    for doc in (scrub, verify):
        [problem] = doc["problems"]
        assert problem["partition"] == entry.id
        assert problem["shard"].endswith(entry.shards[0].key)
        assert problem["key"] is not None and problem["kind"] == "corrupt at rest"


def _first_payload_offset(root: Path, entry: Any) -> int:
    rows = shardlake.open(str(root)).dataset("v1").manifest(entry.id).to_pylist()
    row = min((r for r in rows if r["shard"] == 0), key=lambda r: r["offset"])
    return int(row["offset"]) + row["size"] // 2


def test_export_on_workers_and_resume(
    packed: tuple[Path, Path], dask_address: str, tmp_path: Path
) -> None:
    _src, root = packed
    dest = tmp_path / "copy"
    first = shardlake.open(str(root)).export(str(dest), executor=dask_address)
    assert first.committed and first.bytes_copied > 0
    assert shardlake.open(str(dest)).scrub(executor=dask_address).ok
    # A re-run (as after a kill) verifies what is there and copies nothing.
    again = shardlake.open(str(root)).export(str(dest), executor=dask_address)
    assert again.copied == [] and not again.committed
    # Lose one shard: the resume copies exactly that one.
    lost = shardlake.open(str(root)).dataset("v1").entries[2].shards[0].key
    (dest / lost).unlink()
    assert main(["export", str(root), str(dest), "--executor", dask_address, "--quiet"]) == 0
    assert shardlake.open(str(dest)).verify_offsets(executor="inline").ok


def test_memory_root_refuses_dask(dask_address: str) -> None:
    root = shardlake.open("memory://lifecycle-dask-refuse")
    with pytest.raises(UsageError, match="memory://"):
        root.scrub(executor=dask_address)


class _DiesOnSecond(cf.Executor):
    """Every task but the second runs; the second's worker 'dies' (BrokenProcessPool)."""

    def __init__(self) -> None:
        self.calls = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        self.calls += 1
        future: cf.Future[Any] = cf.Future()
        if self.calls == 2:
            future.set_exception(BrokenProcessPool("killed"))
        else:
            future.set_result(fn(*args, **kwargs))
        return future


def test_dead_task_reported_by_partition(packed: tuple[Path, Path]) -> None:
    _src, root = packed
    entries = shardlake.open(str(root)).dataset("v1").entries
    report = shardlake.open(str(root)).scrub(executor=_DiesOnSecond())
    assert not report.ok
    [problem] = report.problems
    assert problem.partition == entries[1].id and "worker process died" in problem.message
    assert [p.partition for p in report.partitions] == [e.id for e in entries]


def test_forget_rewrites_on_dask(
    packed: tuple[Path, Path], dask_address: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """forget's shard rewrites as Dask tasks (a copy of the module's root: it redacts)."""
    _src, packed_root = packed
    root_dir = tmp_path / "root"
    shutil.copytree(packed_root, root_dir)
    root = shardlake.open(root_dir)
    keys = sorted(root.dataset().manifests(columns=["key"]).column("key").to_pylist())
    keyfile = tmp_path / "keys.txt"
    keyfile.write_text(f"{keys[0]}\n{keys[-1]}\n")
    argv = ["forget", str(root_dir), "--keys", str(keyfile), "--reason", "dask"]
    doc = _json(capsys, [*argv, "--executor", dask_address])
    assert doc["keys"] == 2 and doc["shards_rewritten"] >= 2
    assert root.check_forget().ok and root.scrub().ok
