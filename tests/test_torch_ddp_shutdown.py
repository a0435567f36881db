"""An IntegrityError under DDP with DataLoader workers: every rank exits cleanly, every time."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_torch_support import copy_root, flip_byte, make_root, run_ranks

from shardlake.torch import ShardDataset

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("loader_engine")]

RUNS = 10


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
