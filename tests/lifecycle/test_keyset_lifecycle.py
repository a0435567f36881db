"""Keysets after latest moves on: a keyset's own version by default, idempotent re-create,
delete with a tombstone, gc releasing what only a deleted keyset kept, prune naming pins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.lifecycle import pack_small

import shardlake
from shardlake.cli.main import main
from shardlake.errors import ConflictError, NotFoundError, SelectionError
from shardlake.testing import synth_corpus
from shardlake.testing.fixtures import StoreLocation
from shardlake.torch import ShardDataset


# Object names of the documented layout (docs/format.md): a keyset, its tombstone, a version record.
def keyset_key(name: str) -> str:
    return f"keysets/{name}.parquet"


def tombstone_key(name: str) -> str:
    return f"keysets/{name}.json"


def version_key(tag: str, version_hash: str) -> str:
    return f"versions/{tag}/{version_hash}.json"


def _root(location: StoreLocation, tmp_path: Path) -> shardlake.Root:
    """v1 of 2 logs, keyset ``train`` on v1, then v2 (one more log) as latest."""
    src = tmp_path / "src"
    synth_corpus(src, 2, 2, seed=4, neighbors=2, lanes=4)
    pack_small(location, src)
    root = shardlake.open(location.url, **(location.storage_options or {}))
    root.keysets.create("train", version="v1", where="true")
    synth_corpus(tmp_path / "more", 3, 2, seed=5, neighbors=2, lanes=4)
    extra = sorted(p for p in (tmp_path / "more").iterdir() if p.is_dir())[0]
    extra.rename(src / "zz_new")
    pack_small(location, src, tag="v2", base="v1")
    return root


def test_keyset_without_version_uses_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    root = _root(location, tmp_path)
    assert root.latest.tag == "v2"
    ds = ShardDataset(location.url, keyset="train", batch_size=2, num_workers=0)
    assert ds.version_tag == "v1" and len(ds) == 4
    assert root.dataset(None, keyset="train").version.tag == "v1"
    # the default version with a keyset is the keyset's, not latest (it was ignored)
    assert root.dataset(keyset="train").version.tag == "v1"
    assert root.dataset().version.tag == "v2"
    with pytest.raises(SelectionError, match="bound to version 'v1'"):
        root.dataset("v2", keyset="train")
    argv = ["mixing", location.url, "--keyset", "train", "--batch-size", "2", "--num-workers", "0"]
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == "v1"
    # An explicit other version is still refused.
    assert main([*argv, "--version", "v2"]) == 1
    assert "bound to version 'v1'" in capsys.readouterr().err


def test_recreate_identical_is_a_noop_different_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    root = _root(location, tmp_path)
    before = root.store.read(keyset_key("train"))
    argv = ["keyset", location.url, "create", "train", "--where", "true", "--version", "v1"]
    assert main(argv) == 0
    assert "keyset train: 4 samples" in capsys.readouterr().out
    assert root.store.read(keyset_key("train")) == before
    with pytest.raises(ConflictError, match=r"retire it first \(Root.keysets.delete\)") as info:
        root.keysets.create("train", version="v2", where="true")
    assert "shardlake" not in str(info.value).replace(str(tmp_path), "")  # API words only
    assert info.value.hint == "to retire it: shardlake keyset ROOT delete train"
    assert main(["keyset", location.url, "create", "train", "--where", "true"]) == 1
    err = capsys.readouterr().err
    assert "a new name" in err and "delete train" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("store_kind", ["local", "s3"])
def test_delete_leaves_a_tombstone_and_gc_releases_the_pruned_version(
    store_location: StoreLocation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _root(store_location, tmp_path)
    url = store_location.url
    v1 = root.dataset("v1").version
    record = version_key("v1", v1.hash)  # v2 shares v1's partitions: the record is v1's own
    assert main(["prune-version", url, "v1"]) == 0
    out = capsys.readouterr().out
    assert "version v1 is still kept by keyset(s) train" in out
    # Kept by the keyset: gc deletes none of v1's own objects.
    assert main(["gc", url, "--grace", "0s"]) == 0
    capsys.readouterr()
    assert root.store.exists(record)
    assert main(["keyset", url, "delete", "train"]) == 0
    assert "keyset train retired" in capsys.readouterr().out
    assert root.store.exists(tombstone_key("train"))
    assert not root.store.exists(keyset_key("train"))
    assert [k.name for k in root.keysets.list()] == []
    with pytest.raises(NotFoundError):
        root.keysets.get("train")
    assert main(["gc", url, "--grace", "0s"]) == 0
    capsys.readouterr()
    assert not root.store.exists(record)
    # The name can be used again after a delete.
    again = root.keysets.create("train", version="v2", where="true")
    assert again.version_tag == "v2" and root.keysets.get("train").version_tag == "v2"


def test_delete_then_identical_recreate_is_live(tmp_path: Path) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    root = _root(location, tmp_path)
    root.keysets.delete("train")
    again = root.keysets.create("train", version="v1", where="true")  # same second, same rows
    assert root.keysets.get("train") == again and [k.name for k in root.keysets.list()] == ["train"]
    root.keysets.delete("train")
    assert root.keysets.list() == []


def test_export_npz_with_keyset_uses_its_version(tmp_path: Path) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    root = _root(location, tmp_path)
    dest = tmp_path / "out"
    argv = ["export", location.url, str(dest), "--format", "npz", "--keyset", "train"]
    assert main(argv) == 0
    assert sorted(p.relative_to(dest).as_posix()[:-4] for p in dest.rglob("*.npz")) == sorted(
        root.keysets.get("train").keys
    )
