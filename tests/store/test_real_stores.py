"""The whole cycle on real object stores - SeaweedFS (S3 API) and Azurite (Azure Blob) on
127.0.0.1 - through the public CLI and API only: pack, verify, scrub, keyset, a 2-worker loader
bit-exact against the source npz, incremental pack, export to local, gc, racing publishers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.torch import assert_batch_equal, reference_batch

import shardlake
from shardlake.cli.main import main
from shardlake.testing.fixtures import StoreLocation
from shardlake.torch import ShardDataset

pytestmark = pytest.mark.timeout(300)

SHARD = "40000"  # several shards per partition even for tiny frames


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code, out, err = _cli(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def _pack_cli(src: Path, url: str, tag: str, *extra: str) -> list[str]:
    return ["pack", str(src), url, "--tag", tag, "--executor", "inline", "--quiet",
            "--shard-size", SHARD, *extra]  # fmt: skip


def _drop_one_sample(src: Path, partition: int) -> str:
    """Delete one frame (npz and sidecar) of the ``partition``-th partition; its key."""
    part = sorted(p for p in src.iterdir() if p.is_dir())[partition]
    frame = sorted(part.glob("*.npz"))[0]
    frame.unlink()
    frame.with_suffix(".json").unlink()
    return f"{part.name}/{frame.stem}"


def _loaded_keys(url: str, source: Path, **kw: Any) -> list[str]:
    """Every batch of a 2-worker loader, each checked bit-exact against np.load of the source."""
    ds = ShardDataset(url, batch_size=3, num_workers=2, include_key=True, max_pad_fraction=1, **kw)
    keys: list[str] = []
    for batch in ds.loader():
        assert_batch_equal(batch, reference_batch(source, batch["__key__"]))
        keys.extend(batch["__key__"])
    return keys


@pytest.mark.parametrize("store_kind", ["seaweedfs", "azure"])
def test_whole_cycle_through_cli_and_api(
    store_location: StoreLocation,
    store_factory: Callable[..., StoreLocation],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, src = store_location.url, tmp_path / "src"
    synth = ["synth", str(src), "--partitions", "3", "--samples", "4", "--neighbors", "2"]
    assert _cli(capsys, *synth, "--lanes", "4", "--seed", "5")[0] == 0

    packed = _json(capsys, *_pack_cli(src, url, "v1"))
    assert packed["tag"] == "v1" and packed["samples"] == 12
    assert _json(capsys, "verify", url, "--source", str(src), "--quiet")["ok"] is True
    assert _json(capsys, "scrub", url, "--quiet")["ok"] is True

    root = shardlake.open(url)
    keys = sorted(root.dataset("v1").keys())
    first = keys[0].split("/")[0]
    made = _json(capsys, "keyset", url, "create", "val", "--where", f"key LIKE '{first}/%'")
    assert made["samples"] == 4 and made["version"] == "v1"
    loaded = _loaded_keys(url, src, keyset="val")
    assert set(loaded) == {k for k in keys if k.startswith(first + "/")}

    dropped = _drop_one_sample(src, 1)
    incremental = _json(capsys, *_pack_cli(src, url, "v2", "--base", "v1"))
    assert incremental["samples"] == 11
    assert len(incremental["reused"]) == 2 and len(incremental["built"]) == 1
    assert set(_loaded_keys(url, src, version="v2")) == set(keys) - {dropped}

    dest = store_factory("local", "export")
    exported = _json(capsys, "export", url, dest.url, "--version", "v2", "--quiet")
    assert exported["committed"] is True and exported["version"] == "v2"
    assert _json(capsys, "verify", dest.url, "--source", str(src), "--quiet")["ok"] is True

    collected = _json(capsys, "gc", url, "--grace", "0s")
    assert collected["deleted"] == [] and collected["foreign"] == 0  # all of it is live
    assert _json(capsys, "scrub", url, "--all", "--quiet")["ok"] is True

    # Three racing publishers of one tag, each its own process: exactly one wins.
    _drop_one_sample(src, 2)
    env = {**os.environ, **store_location.env}
    racers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shardlake.cli.main",
                *_pack_cli(src, url, "v3", "--base", "v2"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    outcomes = [(p.wait(timeout=240), *p.communicate()) for p in racers]
    assert sorted(code for code, _, _ in outcomes) == [0, 1, 1], outcomes
    for code, _, err in outcomes:
        if code:
            assert "Traceback" not in err
            assert "already exists" in err or "published by another writer" in err, err
    listed = _json(capsys, "versions", url)
    assert [v["tag"] for v in listed] == ["v1", "v2", "v3"] and listed[-1]["latest"]
    # What the losers built before losing is garbage; gc takes it and leaves every version whole.
    assert _json(capsys, "gc", url, "--grace", "0s")["live_versions"][-1].startswith("v3@")
    assert set(_loaded_keys(url, src, version="v3")) == {
        k for k in keys if (src / f"{k}.npz").exists()
    }
    assert _json(capsys, "scrub", url, "--all", "--quiet")["ok"] is True
    assert _json(capsys, "verify", url, "--source", str(src), "--quiet")["ok"] is True
