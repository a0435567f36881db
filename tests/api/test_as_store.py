"""One door for "another store" (issue #45): a URL or path with its storage options, an opened
Store or a Root, through ``shardlake.as_store``; storage options given with an opened store are
refused rather than silently ignored."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
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


def _one_tar(directory: Path) -> Path:
    """A WebDataset tar of two samples, one .npy member each."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "part-000000.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(2):
            data = io.BytesIO()
            np.save(data, np.arange(3, dtype=np.int32) + i)
            info = tarfile.TarInfo(f"k{i}.x.npy")
            info.size = len(data.getvalue())
            tar.addfile(info, io.BytesIO(data.getvalue()))
    return path


def test_import_wds_names_the_source_options_and_keeps_the_old_name_a_release(
    tmp_path: Path,
) -> None:
    tar = _one_tar(tmp_path / "tars")
    root = shardlake.open(str(tmp_path / "root"))
    report = root.import_wds(str(tar), "v1", source_storage_options={"auto_mkdir": False})
    assert report.version.samples == 2
    with pytest.warns(DeprecationWarning, match="use source_storage_options="):
        again = root.import_wds(str(tar), "v2", storage_options={"auto_mkdir": False})
    assert again.version.samples == 2
    with pytest.raises(UsageError, match="give source_storage_options only"):
        root.import_wds(str(tar), "v3", storage_options={}, source_storage_options={})


def test_the_loader_takes_a_root_or_a_store_and_refuses_options_with_them(
    packed_root: Callable[..., tuple[Path, Path]],
) -> None:
    from shardlake.torch import MixMember, ShardDataset, train_valid

    _src, path = packed_root([3, 3], name="doors", seed=4)
    root = shardlake.open(str(path))
    by_root = ShardDataset(root, "v1", batch_size=2, num_workers=0, include_key=True)
    by_url = ShardDataset(str(path), "v1", batch_size=2, num_workers=0, include_key=True)
    assert sorted(by_root.table.keys) == sorted(by_url.table.keys)
    member = MixMember(root, "v1")
    assert member.url is root.store
    for make, name in [
        (lambda: MixMember(root, "v1", storage_options={"auto_mkdir": True}), "MixMember"),
        (lambda: MixMember(root.store, storage_options={"auto_mkdir": True}), "MixMember"),
        (
            lambda: ShardDataset(root, batch_size=2, storage_options={"auto_mkdir": True}),
            "ShardDataset",
        ),
        (
            lambda: train_valid(
                root, batch_size=2, valid_where="true", storage_options={"auto_mkdir": True}
            ),
            "train_valid",
        ),
    ]:
        with pytest.raises(UsageError, match=rf"{name}\(url\): storage options go with a URL"):
            make()
    keys = sorted(by_url.table.keys)
    train, valid = train_valid(root, "v1", batch_size=2, valid_keys=keys[:2], num_workers=0)
    assert train.store is valid.store is root.store
    assert sorted([*train.table.keys, *valid.table.keys]) == keys
