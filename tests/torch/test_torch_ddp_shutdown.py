"""An IntegrityError under DDP with DataLoader workers: every rank exits cleanly, every time."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
from support.torch import copy_root, destroy_rank_main, flip_byte, make_root, run_ranks

from shardlake.errors import IntegrityError
from shardlake.torch import ShardDataset

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("loader_engine")]

RUNS = 10


def corrupt_copy(tmp_path: Path) -> tuple[Path, Path]:
    """A good root and a copy of it with every payload corrupted."""
    good = make_root(tmp_path / "c", [4, 12], shard_size=2_000_000)[1]
    bad = copy_root(good, tmp_path / "bad")
    table = ShardDataset(str(bad), batch_size=4, num_workers=0).table
    for row in range(len(table)):
        flip_byte(bad, table.shard_keys[int(table.shard[row])], int(table.offset[row]) + 100)
    return good, bad


def test_error_run_exits_cleanly_ten_times(tmp_path: Path) -> None:
    good = make_root(tmp_path / "c", [4, 12], shard_size=2_000_000)[1]
    bad = copy_root(good, tmp_path / "bad")
    table = ShardDataset(str(bad), batch_size=4, num_workers=0).table
    for row in range(len(table)):
        flip_byte(bad, table.shard_keys[int(table.shard[row])], int(table.offset[row]) + 100)
    cfg = {"roots": [str(good), str(bad)], "batch_size": 4, "workers": 1}
    for run in range(RUNS):
        # mp.spawn raises if any rank exits non-zero (the shutdown race exited 1).
        results = run_ranks(2, cfg, tmp_path)
        errors = [r["error"] for r in results]
        assert all(e is not None and e["type"] == "IntegrityError" for e in errors), (run, errors)
        assert errors[0]["message"] == errors[1]["message"], (run, errors)


def test_failed_pass_leaves_no_cycle_holding_the_loader(tmp_path: Path) -> None:
    # A cycle through the error's traceback kept the loader (and its process group, and so
    # gloo's threads) alive until the collector ran at interpreter shutdown.
    _, bad = corrupt_copy(tmp_path)
    gc.collect()
    gc.disable()
    try:
        ds = ShardDataset(str(bad), batch_size=4)
        loader = ds.loader(num_workers=1)
        try:
            for _ in loader:
                pass
        except IntegrityError:
            pass
        else:
            pytest.fail("the corrupted root raised no IntegrityError")
        refs = [weakref.ref(loader), weakref.ref(ds)]
        del loader, ds
        assert [r() is None for r in refs] == [True, True]
    finally:
        gc.enable()


def test_destroy_process_group_joins_gloo_threads_while_the_loader_lives(
    tmp_path: Path,
) -> None:
    # gloo's threads release a collective's tensors (taking the GIL) after it returns; alive
    # at interpreter shutdown, such a thread aborted its rank with SIGABRT.
    good, bad = corrupt_copy(tmp_path)
    cfg = {"roots": [str(good), str(bad)], "batch_size": 4, "workers": 1}
    results = run_ranks(2, cfg, tmp_path, main=destroy_rank_main)
    assert results == [
        {"error": "IntegrityError", "group_freed": True, "gloo_threads": []} for _ in range(2)
    ]
