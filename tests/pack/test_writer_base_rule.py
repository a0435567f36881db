"""A writer over a base puts each key in the partition the base's partition rule gives (issue
#43): a base packed with partition depth 1 holds ``p0/sub/s001`` in ``p0``, so rewriting that
key replaces ``p0`` and never makes a second ``p0/sub`` partition holding the key again."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import shardlake
from shardlake.errors import SourceError
from shardlake.torch import ShardDataset

KEYS = ["p0/s000", "p0/sub/s001", "p1/s000", "p1/sub/s002", "p1/sub/deep/s003"]


def arrays(key: str, salt: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.array([len(key), salt], dtype=np.int64)}


@pytest.fixture
def root(tmp_path: Path) -> shardlake.Root:
    src = tmp_path / "src"
    for key in KEYS:
        (src / key).parent.mkdir(parents=True, exist_ok=True)
        np.savez(src / f"{key}.npz", **arrays(key))
    r = shardlake.open(str(tmp_path / "root"))
    r.pack(src, tag="v1", partition_depth=1)
    return r


def loaded_keys(r: shardlake.Root, tag: str) -> Counter[str]:
    ds = ShardDataset(r.url, version=tag, batch_size=1, include_key=True, num_workers=0)
    return Counter(k for batch in ds.loader() for k in batch["__key__"])


def test_a_nested_key_replaces_the_partition_the_base_rule_gives(root: shardlake.Root) -> None:
    with root.writer("v2", base="v1") as w:
        w.write("p0/sub/s001", arrays("p0/sub/s001", 1))
    v2 = root.dataset("v2")
    assert sorted(e.path for e in v2.entries) == ["p0", "p1"]
    # p0 is replaced by what was written; p1 is carried; every key once.
    want = ["p0/sub/s001", "p1/s000", "p1/sub/deep/s003", "p1/sub/s002"]
    assert sorted(v2.keys()) == want
    assert loaded_keys(root, "v2") == Counter(want)
    assert v2.get("p0/sub/s001")["x"].tolist() == [11, 1]


def test_a_partition_the_base_rule_does_not_give_is_refused(root: shardlake.Root) -> None:
    wrong = r"partition='p0/sub'.*partition depth 1.*'p0'"
    with pytest.raises(SourceError, match=wrong), root.writer("v2", base="v1") as w:
        w.write("p0/sub/s001", arrays("p0/sub/s001"), partition="p0/sub")
    with pytest.raises(SourceError, match="in no partition"), root.writer("v2", base="v1") as w:
        w.write("flat", arrays("flat"))
    assert [v.tag for v in root.versions()] == ["v1"]  # nothing published


def test_delete_partition_takes_every_key_the_rule_puts_in_it(root: shardlake.Root) -> None:
    with root.writer("v2", base="v1") as w:
        w.write("p0/s000", arrays("p0/s000", 2))
        w.delete_partition("p1")
    assert sorted(root.dataset("v2").keys()) == ["p0/s000"]
    assert loaded_keys(root, "v2") == Counter(["p0/s000"])


def test_write_bag_over_a_base_keeps_its_rule(root: shardlake.Root) -> None:
    dask = pytest.importorskip("dask")
    import dask.bag as db

    records = [("p1/sub/s002", arrays("p1/sub/s002", 3), None)]
    with dask.config.set(scheduler="sync"):
        root.write_bag(db.from_sequence(records, npartitions=1), "v2", base="v1")
    v2 = root.dataset("v2")
    assert sorted(e.path for e in v2.entries) == ["p0", "p1"]
    assert sorted(v2.keys()) == ["p0/s000", "p0/sub/s001", "p1/sub/s002"]


def test_a_key_a_carried_partition_holds_is_never_written_twice(tmp_path: Path) -> None:
    """A base whose keys were placed by ``partition=`` (``a/b/c`` in ``a``) does not follow its
    recorded rule (a key's parent path): writing ``a/b/c`` over it goes to ``a/b`` by the rule,
    while ``a`` is carried. Refused, naming both partitions, instead of holding it twice."""
    r = shardlake.open(str(tmp_path / "root"))
    with r.writer("v1") as w:
        w.write("a/b/c", arrays("a/b/c"), partition="a")
        w.write("a/x", arrays("a/x"))
    twice = r"'a/b/c'.*partition 'a/b'.*partition 'a'"
    with pytest.raises(SourceError, match=twice), r.writer("v2", base="v1") as w:
        w.write("a/b/c", arrays("a/b/c", 1))
    assert [v.tag for v in r.versions()] == ["v1"]
    with r.writer("v2", base="v1") as w:  # replacing `a` as well is fine
        w.write("a/b/c", arrays("a/b/c", 1))
        w.write("a/x", arrays("a/x", 1))
    assert sorted(r.dataset("v2").keys()) == ["a/b/c", "a/x"]
    assert sorted(e.path for e in r.dataset("v2").entries) == ["a", "a/b"]
