"""Keysets: immutable, version-bound selections by WHERE or key list; list/show/check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.lifecycle import pack_synth, packed_keys

import shardlake
from shardlake.cli.main import main
from shardlake.errors import ConflictError, NotFoundError, SelectionError
from shardlake.testing.fixtures import StoreLocation


def _packed(location: StoreLocation, src: Path) -> list[str]:
    pack_synth(location, src, 3, 3, seed=11)
    return packed_keys(location)


@pytest.mark.parametrize("store_kind", ["local", "seaweedfs", "gcs"])
def test_keyset_cli_on_every_backend(
    store_location: StoreLocation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = _packed(store_location, tmp_path / "src")
    root = store_location.url
    first_part = keys[0].split("/")[0]
    assert (
        main(["keyset", root, "create", "val", "--where", f"key LIKE '{first_part}/%'", "--json"])
        == 0
    )
    info = json.loads(capsys.readouterr().out)
    assert info["samples"] == 3 and info["version"] == "v1"
    keyfile = tmp_path / "train.txt"
    keyfile.write_text("# training split\n" + "\n".join(keys[3:]) + "\n\n")
    assert main(["keyset", root, "create", "train", "--keys", str(keyfile)]) == 0
    capsys.readouterr()
    assert main(["keyset", root, "list", "--json"]) == 0
    listed = {k["name"]: k["samples"] for k in json.loads(capsys.readouterr().out)}
    assert listed == {"val": 3, "train": 6}
    assert main(["keyset", root, "show", "train", "--json", "--keys"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["keys"] == keys[3:]
    assert main(["keyset", root, "check", "val", "train"]) == 0
    assert "disjoint" in capsys.readouterr().out
    overlap = tmp_path / "overlap.txt"
    overlap.write_text(keys[2] + "\n" + keys[3] + "\n")
    assert main(["keyset", root, "create", "bad", "--keys", str(overlap)]) == 0
    capsys.readouterr()
    assert main(["keyset", root, "check", "val", "bad"]) == 1
    out = capsys.readouterr().out
    assert "share 1 key" in out and keys[2] in out
    # Immutable: a second create with the same name is refused and changes nothing.
    opened = shardlake.open(root, **store_location.storage_options)
    before = opened.keysets.get("val")
    assert main(["keyset", root, "create", "val", "--where", "true"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert opened.keysets.get("val") == before  # created_at included: not rewritten


def test_json_training_list_with_strip_prefix_and_exact_unmatched(tmp_path: Path) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    keys = _packed(location, tmp_path / "src")
    old_root = "/mnt/old/dataset"
    entries = [f"{old_root}/{k}.npz" for k in keys[:4]]
    entries += [f"{old_root}/gone/a.npz", f"{old_root}/gone/b.npz", "/elsewhere/c.npz"]
    listing = tmp_path / "train.json"
    listing.write_text(json.dumps(entries))
    argv = [
        "keyset",
        location.url,
        "create",
        "t",
        "--keys",
        str(listing),
        "--strip-prefix",
        old_root,
    ]
    # Three entries match nothing: refused unless --allow-unmatched says exactly 3.
    with pytest.raises(SelectionError, match="3 entries match no key") as info:
        shardlake.open(location.url).keysets.create(
            "t", key_file=str(listing), strip_prefix=old_root
        )
    assert "gone/a" in str(info.value) or "gone/b" in str(info.value)
    assert "/elsewhere/c.npz" in str(info.value)
    assert main(argv) == 1
    assert main([*argv, "--allow-unmatched", "2"]) == 1
    assert main([*argv, "--allow-unmatched", "4"]) == 1
    assert not shardlake.open(location.url).keysets.list()
    assert main([*argv, "--allow-unmatched", "3"]) == 0
    keyset = shardlake.open(location.url).keysets.get("t")
    assert keyset.keys == keys[:4]
    assert keyset.recipe["unmatched"] == 3


def test_keyset_is_bound_to_its_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    keys = _packed(location, tmp_path / "src")
    ks = shardlake.open(location.url).keysets.create("val", keys=keys[:2])
    v1 = shardlake.open(location.url).dataset("v1").version
    ks.check_version(v1)
    shardlake.open(location.url).remove("v2", keys=[keys[-1]])
    v2 = shardlake.open(location.url).dataset("v2").version
    with pytest.raises(SelectionError, match="bound to version 'v1'") as info:
        shardlake.open(location.url).keysets.get("val").check_version(v2)
    # The API names the API call that carries it over; the CLI names `keyset rebase`.
    assert "Root.keysets.rebase('val', 'v2', new_name=...)" in str(info.value)
    assert "shardlake" not in str(info.value)
    out = tmp_path / "out"
    argv = ["export", location.url, str(out), "--format", "npz", "--keyset", "val"]
    assert main([*argv, "--version", "v2"]) == 1
    err = capsys.readouterr().err
    assert f"(shardlake keyset {location.url} rebase val --version v2 --as NEW_NAME)" in err
    assert "bound to version 'v1'" in err and err.count("\n") == 1
    # --version picks the version a new keyset binds to.
    ks2 = shardlake.open(location.url).keysets.create("val2", version="v1", where="true")
    assert ks2.version_hash == v1.hash and len(ks2) == len(keys)


def test_keyset_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    _packed(location, tmp_path / "src")
    root = location.url
    with pytest.raises(NotFoundError, match="no keyset 'nope'"):
        shardlake.open(root).keysets.get("nope")
    # An identical re-create is a no-op (issue 18); a different selection is refused.
    first = shardlake.open(root).keysets.create("a", where="true")
    assert shardlake.open(root).keysets.create("a", where="true") == first
    with pytest.raises(ConflictError):
        shardlake.open(root).keysets.create("a", keys=first.keys[:1])
    cases = [
        (["keyset", root, "show", "nope"], 1, "no keyset"),
        (["keyset", root, "create", "x", "--where", "true; SELECT 1"], 1, "';' is not allowed"),
        (
            ["keyset", root, "create", "x", "--where", "(SELECT 1 FROM '/etc/passwd') = 1"],
            1,
            "selection",
        ),
        (["keyset", root, "create", "x", "--where", "key = "], 1, "invalid selection"),
        (["keyset", root, "create", "x", "--where", "key = 'no such key'"], 1, "empty"),
        (
            ["keyset", root, "create", "x", "--where", "true", "--version", "v7"],
            1,
            "unknown version",
        ),
        (
            ["keyset", root, "create", "x", "--keys", str(tmp_path / "missing.txt")],
            1,
            "cannot read",
        ),
    ]
    for argv, code, message in cases:
        assert main(argv) == code, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (argv, err)
    assert "x" not in [k.name for k in shardlake.open(root).keysets.list()]


def test_keyset_list_sorts_names_naturally(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    _packed(location, tmp_path / "src")
    root = location.url
    for name in ("train-list", "train10", "train", "train2", "val"):
        shardlake.open(root).keysets.create(name, where="true")
    want = ["train", "train2", "train10", "train-list", "val"]
    assert main(["keyset", root, "list"]) == 0
    assert [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()] == want
    assert main(["keyset", root, "list", "--json"]) == 0
    assert [k["name"] for k in json.loads(capsys.readouterr().out)] == want
    assert shardlake.open(root).write_index()["keysets"] == want  # as the HTTP root index does
