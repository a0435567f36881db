"""Golden roots: datasets written by earlier format versions read back bit-exactly, forever.

Each ``tests/data/golden/<format>/root`` was written once by ``make_golden.py`` and committed;
``expected.json`` beside it holds per-sample array digests. A format change adds a new golden
root and must keep every old one passing.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import shardlake
from shardlake.cli.main import main
from shardlake.errors import CapabilityError
from shardlake.testing.http_server import static_http_server
from shardlake.torch import ShardDataset

GOLDEN = Path(__file__).parents[1] / "data" / "golden"
FORMATS = sorted(p.name for p in GOLDEN.iterdir() if (p / "expected.json").is_file())

_spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
assert _spec is not None and _spec.loader is not None
make_golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_golden)


@pytest.fixture(params=FORMATS)
def golden(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    # A copy, so that nothing a reader might write (caches) lands in the committed tree.
    root = tmp_path / "root"
    shutil.copytree(GOLDEN / request.param / "root", root)
    expected = json.loads((GOLDEN / request.param / "expected.json").read_text())
    return str(root), expected


def test_golden_formats_present() -> None:
    assert sorted(make_golden.ROOTS) == FORMATS


def test_versions_listed(golden: tuple[str, dict[str, Any]]) -> None:
    root, expected = golden
    ds = shardlake.open(root).dataset("latest")
    tags = [v.tag for v in shardlake.open(ds.store).versions()]
    assert tags == sorted(expected["versions"])


def test_get_is_bit_exact(golden: tuple[str, dict[str, Any]]) -> None:
    root, expected = golden
    for tag, samples in expected["versions"].items():
        ds = shardlake.open(root).dataset(tag)
        assert ds.version.samples == len(samples)
        for key, digests in samples.items():
            assert make_golden.sample_digests(ds.get(key)) == digests, (tag, key)


def test_iter_samples_is_bit_exact(golden: tuple[str, dict[str, Any]]) -> None:
    root, expected = golden
    for tag, samples in expected["versions"].items():
        ds = shardlake.open(root).dataset(tag)
        got = {
            key: make_golden.sample_digests(arrays)
            for key, arrays in ds.iter_samples(list(samples))
        }
        assert got == samples


def test_keyset_and_loader(golden: tuple[str, dict[str, Any]]) -> None:
    root, expected = golden
    for name, info in expected["keysets"].items():
        ds = shardlake.open(root).dataset(info["version"])
        keyset = shardlake.open(ds.store).keysets.get(name)
        keyset.check_version(ds.version)
        wanted = sorted(ds.query(info["where"]).column("key").to_pylist())
        assert sorted(keyset.keys) == wanted and wanted
        loader = ShardDataset(
            root, info["version"], keyset=name, batch_size=1, num_workers=0, include_key=True
        )
        seen = {item.pop("__key__"): item for item in loader}
        assert sorted(seen) == wanted
        for key, item in seen.items():
            assert _loader_view(ds.get(key)) == _loader_view(item), key


def test_served_over_http_after_the_one_line_upgrade(golden: tuple[str, dict[str, Any]]) -> None:
    # Older roots have no index.json: over HTTP they say how to get one, then read bit-exactly.
    root, expected = golden
    with static_http_server(Path(root).parent) as server:
        url = f"{server.url}/root"
        with pytest.raises(CapabilityError, match=r"Root\.write_index\(\)"):
            shardlake.open(url).versions()
        assert main(["index", root]) == 0
        served = shardlake.open(url)
        assert sorted(v.tag for v in served.versions()) == sorted(expected["versions"])
        for tag, samples in expected["versions"].items():
            ds = served.dataset(tag)
            for key, digests in samples.items():
                assert make_golden.sample_digests(ds.get(key)) == digests, (tag, key)
        for name, info in expected["keysets"].items():
            loader = ShardDataset(
                url, info["version"], keyset=name, batch_size=1, num_workers=0, include_key=True
            )
            assert sorted(item["__key__"] for item in loader) == sorted(
                shardlake.open(root).keysets.get(name).keys
            )


def _loader_view(arrays: dict[str, Any]) -> dict[str, str]:
    """Digests of the values as the loader yields them: tensors, native byte order, 0-d str."""
    out = {}
    for name, value in arrays.items():
        if isinstance(value, torch.Tensor):
            value = value.numpy()
        arr = np.asarray(value)
        if arr.dtype.kind in "biufc":
            arr = arr.astype(arr.dtype.newbyteorder("="))
        out[name] = make_golden.array_digest(arr)
    return out
