"""``root.keysets`` groups the keyset verbs; the old ``Root`` names still work for one release,
with a DeprecationWarning, and give the same results."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import shardlake
from shardlake.errors import NotFoundError, ReadOnlyStoreError


def test_the_keyset_verbs_are_one_group(
    packed_root: Callable[..., tuple[Path, Path]],
) -> None:
    _src, path = packed_root([3, 3], name="keysets-group", seed=2)
    lake = shardlake.open(str(path))
    made = lake.keysets.create("a", where="true")
    lake.keysets.create("b", keys=made.keys[:2])
    assert [k.name for k in lake.keysets.list()] == ["a", "b"]
    assert lake.keysets.get("a").keys == made.keys
    assert lake.keysets.check_disjoint("a", "b").overlap == 2
    report = lake.keysets.rebase("b", "latest", new_name="c")
    assert (report.name, report.kept, report.dropped) == ("c", 2, 0)
    assert lake.keysets.delete("b").name == "b"
    assert [k.name for k in lake.keysets.list()] == ["a", "c"]
    with pytest.raises(NotFoundError):
        lake.keysets.get("b")


def test_the_old_root_names_warn_and_do_the_same(
    packed_root: Callable[..., tuple[Path, Path]],
) -> None:
    _src, path = packed_root([3, 3], name="keysets-group", seed=2)
    lake = shardlake.open(str(path))
    with pytest.warns(DeprecationWarning, match="Root.create_keyset is deprecated"):
        made = lake.create_keyset("a", where="true")
    with pytest.warns(DeprecationWarning, match=r"Root.keysets\(\) is deprecated"):
        listed = lake.keysets()
    assert [k.name for k in listed] == ["a"] == [k.name for k in lake.keysets.list()]
    with pytest.warns(DeprecationWarning, match="Root.keyset is deprecated"):
        assert lake.keyset("a").keys == made.keys
    with pytest.warns(DeprecationWarning, match="Root.rebase_keyset is deprecated"):
        lake.rebase_keyset("a", "latest", new_name="b")
    with pytest.warns(DeprecationWarning, match="Root.check_disjoint is deprecated"):
        assert lake.check_disjoint("a", "b").overlap == len(made.keys)
    with pytest.warns(DeprecationWarning, match="Root.delete_keyset is deprecated"):
        lake.delete_keyset("a")
    assert [k.name for k in lake.keysets.list()] == ["b"]


def test_a_read_only_root_refuses_the_keyset_writes_first() -> None:
    lake = shardlake.open("https://127.0.0.1:9/root")
    with pytest.raises(ReadOnlyStoreError, match="create keyset"):
        lake.keysets.create("a", where="true")
    with pytest.raises(ReadOnlyStoreError, match="delete keyset"):
        lake.keysets.delete("a")
