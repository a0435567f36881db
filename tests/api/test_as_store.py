"""One door for "another store" (issue #45): a URL or path with its storage options, an opened
Store or a Root, through ``shardlake.as_store``; storage options given with an opened store are
refused rather than silently ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

import shardlake
from shardlake.errors import UsageError


def test_as_store_takes_a_path_a_store_and_a_root(tmp_path: Path) -> None:
    store = shardlake.as_store(tmp_path / "root")
    assert store.url.endswith("root")
    assert shardlake.as_store(store) is store
    root = shardlake.open(store)
    assert shardlake.as_store(root) is store
    assert shardlake.open(root).store is store


def test_storage_options_with_an_opened_store_are_refused(tmp_path: Path) -> None:
    store = shardlake.open_store(str(tmp_path / "root"))
    root = shardlake.open(store)
    with pytest.raises(UsageError, match="storage options go with a URL"):
        shardlake.as_store(store, {"auto_mkdir": True})
    with pytest.raises(UsageError, match="storage options go with a URL"):
        shardlake.open(store, auto_mkdir=True)
    with pytest.raises(UsageError, match="storage options go with a URL"):
        shardlake.open(root, auto_mkdir=True)
    with pytest.raises(UsageError, match="storage options go with a URL"):
        shardlake.check_store(store, auto_mkdir=True)
    with pytest.raises(UsageError, match="storage options go with a URL"):
        shardlake.open_store(store, {"auto_mkdir": True})
    with pytest.raises(UsageError, match=r"export\(dest\): storage options go with a URL"):
        root.export(shardlake.open(str(tmp_path / "copy")), dest_storage_options={"a": 1})
    with pytest.raises(UsageError, match=r"verify\(source\): storage options go with a URL"):
        root.verify(store, source_storage_options={"auto_mkdir": True})


def test_check_store_takes_a_root(tmp_path: Path) -> None:
    report = shardlake.check_store(shardlake.open(str(tmp_path / "root")))
    assert report.safe, report.to_json()
