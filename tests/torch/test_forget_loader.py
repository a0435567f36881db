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
