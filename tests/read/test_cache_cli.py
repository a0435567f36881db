"""``shardlake bench load --cache-dir``: the second epoch is read from the epoch cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.torch import make_root

pytestmark = pytest.mark.timeout(240)


def test_bench_load_cache_dir_serves_the_second_epoch(tmp_path: Path) -> None:
    _, root = make_root(tmp_path / "data", [12, 12])
    cache = tmp_path / "cache"
    proc = subprocess.run(
        [sys.executable, "-m", "shardlake.cli.main", "bench", "load", str(root),
         "--batch-size", "4", "--num-workers", "1", "--epochs", "2", "--cache-dir", str(cache)],
        capture_output=True, text=True, timeout=200,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["cache_dir"] == str(cache) and len(doc["epoch_samples_per_s"]) == 2
    payload = doc["selected_payload_mb"] * 1e6
    # Both epochs' samples were yielded, but the payloads were fetched from the store once.
    assert doc["samples"] == 2 * doc["selected_samples"]
    assert payload <= doc["bytes_fetched"] < 1.5 * payload
    assert len(list(cache.glob("shardlake-cache-1/*/*"))) == doc["selected_samples"]
