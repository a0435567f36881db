"""`shardlake diff` and `keyset rebase`: what changed between two versions, and carrying a
keyset from one to the other."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.lifecycle import pack_small

import shardlake
from shardlake.cli.main import main
from shardlake.testing import synth_corpus
from shardlake.testing.fixtures import StoreLocation


def _key(src: Path, npz: Path) -> str:
    return npz.relative_to(src).as_posix()[: -len(".npz")]


def _two_versions(location: StoreLocation, tmp_path: Path) -> dict[str, object]:
    """v1 of 3 logs; v2: one log removed, one added, one frame's array and one sidecar changed."""
    src, extra = tmp_path / "src", tmp_path / "extra"
    synth_corpus(src, 3, 3, seed=11, neighbors=2, lanes=4)
    synth_corpus(extra, 4, 3, seed=12, neighbors=2, lanes=4)
    pack_small(location, src)
    logs = sorted(p for p in src.iterdir() if p.is_dir())
    gone, data_log, meta_log = logs
    gone_keys = sorted(_key(src, f) for f in gone.glob("*.npz"))
    shutil.rmtree(gone)
    new_log = src / "added_log"
    shutil.copytree(sorted(p for p in extra.iterdir() if p.is_dir())[0], new_log)
    frame = sorted(data_log.glob("*.npz"))[0]
    arrays = dict(np.load(frame))
    arrays["goal_pose"] = arrays["goal_pose"] + 1.0
    np.savez_compressed(frame, **arrays)
    sidecar = sorted(meta_log.glob("*.json"))[0]
    # ... and a sidecar-only change in the partition whose data changed too.
    beside = sorted(data_log.glob("*.json"))[1]
    for path in (sidecar, beside):
        doc = json.loads(path.read_text())
        doc["map_version_id"] = "v9.9"
        path.write_text(json.dumps(doc))
    pack_small(location, src, tag="v2", base="v1")
    return {
        "removed": [gone.name],
        "added": [new_log.name],
        "data_changed": [data_log.name],
        "meta_changed": [meta_log.name],
        "added_keys": sorted(_key(src, f) for f in new_log.glob("*.npz")),
        "removed_keys": gone_keys,
        "changed_keys": [_key(src, frame)],
        "meta_changed_keys": sorted(
            _key(src, path.with_suffix(".npz")) for path in (sidecar, beside)
        ),
    }


@pytest.mark.parametrize("store_kind", ["local", "s3"])
def test_diff_then_rebase_reports_exactly(
    store_location: StoreLocation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    want = _two_versions(store_location, tmp_path)
    root = store_location.url
    assert main(["diff", root, "v1", "v2", "--json", "--samples"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"from", "to", "partitions", "samples"}
    assert doc["from"]["tag"] == "v1" and doc["to"]["tag"] == "v2"
    assert len(doc["from"]["hash"]) == len(doc["to"]["hash"]) > 0
    assert doc["partitions"] == {
        "added": want["added"],
        "removed": want["removed"],
        "data_changed": want["data_changed"],
        "meta_changed": want["meta_changed"],
        "unchanged": 0,
    }
    assert doc["samples"] == {
        "added": 3,
        "removed": 3,
        "changed": 1,
        "meta_changed": 2,  # the sidecar-only changes are counted and named
        "added_keys": want["added_keys"],
        "removed_keys": want["removed_keys"],
        "changed_keys": want["changed_keys"],
        "meta_changed_keys": want["meta_changed_keys"],
    }
    # Without --samples: counts only, no key lists.
    assert main(["diff", root, "v1", "v2", "--json"]) == 0
    samples = json.loads(capsys.readouterr().out)["samples"]
    assert samples == {"added": 3, "removed": 3, "changed": 1, "meta_changed": 2}
    assert main(["diff", root, "v1", "v2"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].startswith("partitions: 1 added, 1 removed, 1 data changed, 1 meta changed")
    assert table[2] == "samples:    3 added, 3 removed, 1 changed, 2 meta changed"
    assert main(["diff", root, "v1", "v2", "--samples"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert f"  meta_changed  {want['meta_changed_keys'][0]}" in listed

    # A v1 keyset of everything, carried to v2: the removed log's frames drop out.
    assert main(["keyset", root, "create", "all", "--where", "true", "--version", "v1"]) == 0
    capsys.readouterr()
    argv = ["keyset", root, "rebase", "all", "--version", "v2", "--as", "all2", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["kept"], report["dropped"], report["changed"]) == (6, 3, 1)
    opened = shardlake.open(store_location.url, **(store_location.storage_options or {}))
    carried = opened.keyset("all2")
    v1_keys = opened.keyset("all").keys
    assert carried.version_tag == "v2" and len(opened.keyset("all")) == 9  # NAME untouched
    assert carried.keys == [k for k in v1_keys if k not in want["removed_keys"]]
    assert carried.rebased_from == f"all@{opened.version('v1').hash}"
    assert main(["keyset", root, "list"]) == 0
    assert f"rebased_from: all@{opened.version('v1').hash}" in capsys.readouterr().out
    # --strict: a drop fails and writes nothing.
    argv = ["keyset", root, "rebase", "all", "--version", "v2", "--as", "strict2", "--strict"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "3 key(s) dropped, 1 changed" in err and "(see --strict)" not in err
    # It says what to do instead: rebase without --strict to carry the 6 keys v2 still has.
    assert "rebase without strict to carry the 6 key(s) it still has" in err
    assert f"(shardlake keyset {root} rebase all --version v2 --as strict2 without --strict)" in err
    assert {k.name for k in opened.keysets()} == {"all", "all2"}
    # The version's lineage: v2's base is v1, in `versions` and `show`.
    assert opened.version("v2").base == "v1"
    assert main(["versions", root, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["tag"]: r["base"] for r in rows} == {"v1": None, "v2": "v1"}
    assert main(["show", root, "--version", "v2"]) == 0
    assert any(line.split() == ["base", "v1"] for line in capsys.readouterr().out.splitlines())


def test_diff_of_a_version_with_itself_reads_no_rows(tmp_path: Path) -> None:
    location = StoreLocation("local", str(tmp_path / "root"))
    synth_corpus(tmp_path / "src", 2, 2, seed=3, neighbors=2, lanes=4)
    pack_small(location, tmp_path / "src")
    pack_small(location, tmp_path / "src", tag="v2", base="v1")
    diff = shardlake.open(location.url).diff("v1", "v2", samples=True)
    assert diff.identical and diff.unchanged == 2
    assert diff.to_json()["samples"] == {
        "added": 0,
        "removed": 0,
        "changed": 0,
        "meta_changed": 0,
        "added_keys": [],
        "removed_keys": [],
        "changed_keys": [],
        "meta_changed_keys": [],
    }
