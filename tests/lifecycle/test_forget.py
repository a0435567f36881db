"""forget: erase samples from every retained version and keyset, with a receipt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.forget import build, raw_scan

import shardlake
from shardlake.cli.main import main
from shardlake.errors import UsageError, VersionRedactedError


def test_forget_erases_everywhere_and_keeps_the_rest_bit_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = shardlake.open(tmp_path / "root")
    world = build(root, tmp_path / "src")
    assert raw_scan(root, world.payloads, world.forgotten)  # the payloads are there before
    before = {v.tag: v.hash for v in root.versions()}
    objects = sorted(root.store.list(""))

    keyfile = tmp_path / "erase.txt"
    keyfile.write_text("\n".join(world.forgotten) + "\n")
    args = ["forget", root.url, "--keys", str(keyfile), "--reason", "ticket-1"]
    assert main([*args, "--dry-run", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["dry_run"] and dry["keys"] == 3 and dry["bytes_to_rewrite"] > 0
    assert [v["tag"] for v in dry["versions"]] == world.tags
    assert sorted(root.store.list("")) == objects  # a dry run changes nothing

    assert main([*args, "--json", "--executor", "thread"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["keys"] == 3 and doc["forget_id"] and doc["receipt"]
    after = {v.tag: v.hash for v in root.versions()}
    assert list(after) == world.tags and all(after[t] != before[t] for t in world.tags)
    removed = {v["tag"]: v["removed"] for v in doc["versions"]}
    # v4 lists one forgotten key fewer (remove dropped it) but still held its bytes.
    assert removed == {"v1": 2, "v2": 2, "v3": 3, "v4": 2}
    assert doc["keysets"] == {"ks-v2": 2, "ks-v4": 2}

    forgotten = set(world.forgotten)
    for tag in world.tags:
        ds = root.dataset(tag)
        keys = set(ds.manifests(columns=["key"]).column("key").to_pylist())
        assert keys == set(world.snapshot[tag]) - forgotten
        for key in keys:  # every other sample is bit-identical
            got = ds.get(key)
            assert {n: v for n, v in _arrays(got).items()} == world.snapshot[tag][key], key
        assert ds.query("true", columns=["key"]).num_rows == len(keys)
        assert root.verify_offsets(tag).ok and root.scrub(tag).ok
    for name in ("ks-v2", "ks-v4"):
        keyset = root.keyset(name)
        assert not forgotten & set(keyset.keys)
        assert keyset.version_hash == after[keyset.version_tag]
    assert raw_scan(root, world.payloads, world.forgotten) == []
    assert main(["forget", "--check", root.url]) == 0
    assert "OK" in capsys.readouterr().out
    assert root.check_forget(doc["forget_id"]).ok

    # The old hash names the forget and the successor.
    from shardlake.meta.versions import load_version_by_hash

    with pytest.raises(VersionRedactedError) as err:
        load_version_by_hash(root.store, "v2", before["v2"])
    assert doc["forget_id"] in str(err.value) and after["v2"] in str(err.value)

    receipt = json.loads(root.store.read(doc["receipt"]))
    assert receipt["reason"] == "ticket-1" and receipt["completed_at"]
    assert not any(k in json.dumps(receipt) for k in world.forgotten)  # digests only
    assert len(receipt["payload_digests"]) >= 3

    # Forgetting again finds nothing to do; gc finds nothing of the old versions to delete.
    again = root.forget(keys=world.forgotten, reason="ticket-1 again")
    assert again.versions == [] and len(again.unmatched) == 3
    assert root.gc(grace_s=0, dry_run=True).garbage == []


def _arrays(sample: dict[str, object]) -> dict[str, bytes]:
    from support.forget import _arrays as arrays

    return arrays(sample)  # type: ignore[arg-type]


def test_forget_needs_one_selection_and_a_reason(tmp_path: Path) -> None:
    root = shardlake.open(tmp_path / "root")
    with pytest.raises(UsageError, match="reason"):
        root.forget(keys=["a"])
    with pytest.raises(UsageError, match="exactly one"):
        root.forget(keys=["a"], where="true", reason="x")
