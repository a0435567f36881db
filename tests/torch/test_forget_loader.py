"""The loader and readers across a forget: a redacted version's shards gone mid-epoch and a
state saved on it (docs/loader.md, "Resume")."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.forget import build

import shardlake
from shardlake.errors import VersionRedactedError
from shardlake.torch import ResumedOnSuccessorWarning, ShardDataset


def _keys(loader: object) -> list[str]:
    return [k for batch in loader for k in batch["__key__"]]  # type: ignore[attr-defined]


def test_loader_across_a_forget(tmp_path: Path) -> None:
    root = shardlake.open(tmp_path / "root")
    world = build(root, tmp_path / "src")
    forgotten = set(world.forgotten)
    ds = ShardDataset(root.url, "v2", batch_size=2, num_workers=0, include_key=True)
    loader = ds.loader()
    batches = iter(loader)
    seen = list(next(batches)["__key__"])
    state = loader.state_dict()
    old = root.dataset("v2")
    in_rewritten = [k for k in world.snapshot["v2"] if k.startswith(world.forgotten[0][:-6])]
    report = root.forget(keys=world.forgotten, reason="loader test")

    # An epoch of the redacted version meets a deleted shard: the forget and successor named.
    with pytest.raises(VersionRedactedError, match=report.forget_id or "-"):
        _keys(ds.loader())
    with pytest.raises(VersionRedactedError, match="successor"):
        for key in in_rewritten:
            old.get(key)

    # A state saved on the redacted version continues on its successor.
    again = ShardDataset(root.url, "v2", batch_size=2, num_workers=0, include_key=True).loader()
    with pytest.warns(ResumedOnSuccessorWarning):
        again.load_state_dict(state)
    rest = _keys(again)
    assert not forgotten & set(rest) and not forgotten & set(_keys(again))
    assert len(seen) + len(rest) == len(world.snapshot["v2"]) - 2  # the step carried over


def test_node_caches_drop_redacted_entries_when_they_meet_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog_dir = tmp_path / "catalog-cache"
    monkeypatch.setenv("SHARDLAKE_CATALOG_CACHE", str(catalog_dir))
    root = shardlake.open(tmp_path / "root")
    world = build(root, tmp_path / "src")
    epoch_dir = tmp_path / "epoch-cache"

    def epoch(tag: str) -> list[str]:
        ds = ShardDataset(
            root.url, tag, batch_size=2, num_workers=0, include_key=True, cache_dir=epoch_dir
        )
        return _keys(ds.loader())

    for tag in ("v1", "v2"):  # (v3 adds samples of another shape: no common batch)
        epoch(tag)  # both caches now hold these versions' catalogs and payloads
    old = {v.tag: v.hash for v in root.versions()}
    cached_before = _cached_bytes(epoch_dir) + _cached_bytes(catalog_dir)
    assert any(_holds(cached_before, p) for p in world.compressed)
    assert any(old["v2"].encode() in b for b in cached_before)

    report = root.forget(keys=world.forgotten, reason="cache test")
    assert not set(world.forgotten) & set(epoch("v2"))  # meets the root: the caches drop
    cached = _cached_bytes(epoch_dir) + _cached_bytes(catalog_dir)
    assert not any(_holds(cached, p) for p in world.compressed)
    assert not any(old[t].encode() in b for b in cached for t in ("v1", "v2"))
    assert report.forget_id in (catalog_dir / "shardlake-catalog-1" / "applied-forgets").read_text()


def _cached_bytes(folder: Path) -> list[bytes]:
    return [p.read_bytes() for p in folder.rglob("*") if p.is_file() and "applied" not in p.name]


def _holds(blobs: list[bytes], payload: bytes) -> bool:
    return any(payload in b for b in blobs)
