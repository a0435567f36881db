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
    carried = opened.keysets.get("all2")
    v1_keys = opened.keysets.get("all").keys
    assert carried.version_tag == "v2" and len(opened.keysets.get("all")) == 9  # NAME untouched
    assert carried.keys == [k for k in v1_keys if k not in want["removed_keys"]]
    assert carried.rebased_from == f"all@{opened.version('v1').hash}"
    assert main(["keyset", root, "list"]) == 0
    assert f"rebased_from: all@{opened.version('v1').hash}" in capsys.readouterr().out
    # --strict: a drop fails and writes nothing.
    argv = ["keyset", root, "rebase", "all", "--version", "v2", "--as", "strict2", "--strict"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "3 keys dropped, 1 changed" in err and "(see --strict)" not in err
    # It says what to do instead: rebase without --strict to carry the 6 keys v2 still has.
    assert "rebase without strict to carry the 6 keys it still has" in err
    assert f"(shardlake keyset {root} rebase all --version v2 --as strict2 without --strict)" in err
    assert {k.name for k in opened.keysets.list()} == {"all", "all2"}
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


def _small_tree(src: Path, parts: dict[str, int]) -> dict[str, tuple[dict[str, np.ndarray], dict]]:
    """npz files written compressed (not the canonical form) with sidecars; key -> sample."""
    samples = {}
    for part, count in parts.items():
        (src / part).mkdir(parents=True)
        for i in range(count):
            key = f"{part}/f{i:02d}"
            arrays = {"x": np.arange(i, i + 4, dtype=np.float32), "y": np.array([i], np.int64)}
            meta = {"label": i % 3, "name": key}
            np.savez_compressed(src / f"{key}.npz", **arrays)
            (src / f"{key}.json").write_text(json.dumps(meta))
            samples[key] = (arrays, meta)
    return samples


@pytest.mark.parametrize("how", ["keys", "where"])
def test_diff_and_rebase_see_samples_remove_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    """``remove --keys`` / ``--where`` keeps the partitions' revisions: diff still names every
    dropped sample and the partitions that lost them (issue #43)."""
    _small_tree(tmp_path / "src", {"a": 4, "b": 3, "c": 2})
    root = str(tmp_path / "root")
    assert main(["pack", str(tmp_path / "src"), root, "--tag", "v1", "--quiet"]) == 0
    (tmp_path / "drop.txt").write_text("a/f01\nb/f02\n")
    drop = ["--keys", str(tmp_path / "drop.txt")]
    select = drop if how == "keys" else ["--where", "name IN ('a/f01', 'b/f02')"]
    assert main(["remove", root, "--tag", "v2", "--base", "v1", *select]) == 0
    capsys.readouterr()
    assert main(["diff", root, "v1", "v2", "--json", "--samples"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["partitions"] == {
        "added": [],
        "removed": [],
        "data_changed": ["a", "b"],
        "meta_changed": [],
        "unchanged": 1,
    }
    assert doc["samples"]["removed_keys"] == ["a/f01", "b/f02"]
    assert (doc["samples"]["added"], doc["samples"]["changed"]) == (0, 0)
    # The other way round they come back; a keyset of v1 rebased onto v2 loses them.
    back = shardlake.open(root).diff("v2", "v1", samples=True)
    assert back.added_keys == ["a/f01", "b/f02"] and back.data_changed == ["a", "b"]
    r = shardlake.open(root)
    r.keysets.create("all", version="v1", where="true")
    report = r.keysets.rebase("all", "v2", new_name="all2")
    assert (report.dropped, report.dropped_keys) == (2, ["a/f01", "b/f02"])


def test_same_payloads_from_other_files_are_not_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A writer rewriting the arrays and sidecars pack read from compressed npz files: only
    ``source_sha256`` differs (the writer hashes its canonical npz form), so no sample or
    partition changed and ``keyset rebase --strict`` carries every key (issue #43)."""
    samples = _small_tree(tmp_path / "src", {"a": 3, "b": 2})
    root = str(tmp_path / "root")
    r = shardlake.open(root)
    r.pack(tmp_path / "src", tag="v1")
    with r.writer("v2", base="v1") as w:
        for key, (arrays, meta) in samples.items():
            w.write(key, arrays, meta)
    shas = [r.dataset(v).manifests(["source_sha256"]).column(0).to_pylist() for v in ("v1", "v2")]
    assert all(a != b for a, b in zip(*shas, strict=True))  # other files, same payloads
    diff = r.diff("v1", "v2", samples=True)
    assert (diff.samples_changed, diff.samples_meta_changed, diff.changed_keys) == (0, 0, [])
    assert diff.identical and diff.unchanged == 2
    r.keysets.create("all", version="v1", where="true")
    assert r.keysets.rebase("all", "v2", new_name="all2", strict=True).changed == 0
    # One array really changed: that sample, and only it, is changed.
    arrays, meta = samples["b/f01"]
    with r.writer("v3", base="v2") as w:
        for key, (arr, m) in samples.items():
            if key.startswith("b/"):
                w.write(key, {**arr, "x": arr["x"] + 1} if key == "b/f01" else arr, m)
    diff = r.diff("v1", "v3", samples=True)
    assert diff.changed_keys == ["b/f01"] and diff.data_changed == ["b"]
    assert main(["keyset", root, "rebase", "all", "--version", "v3", "--as", "s3", "--strict"]) == 1
    assert "0 keys dropped, 1 changed" in capsys.readouterr().err


def test_a_sidecar_change_is_seen_on_a_key_that_moved_partition(tmp_path: Path) -> None:
    """A key packed into ``p`` (depth 1) and written again by a writer without a base (into
    its parent path ``p/sub``) with the same arrays and another sidecar is ``meta_changed``:
    the sidecars of added and removed partitions are compared too, not only of partitions
    both versions have."""
    arrays = {"x": np.arange(3, dtype=np.float32)}
    root = shardlake.open(tmp_path / "root")
    with root.writer("v0") as w:  # only to make the npz tree pack reads: a plain tree
        w.write("p/s0", arrays, {"label": 0})
        w.write("p/sub/s1", arrays, {"label": 0})
    root.export(str(tmp_path / "src"), version="v0", format="npz")
    root.pack(tmp_path / "src", tag="v1")
    with root.writer("v2") as w:
        w.write("p/sub/s1", arrays, {"label": 1})
    diff = root.diff("v1", "v2", samples=True)
    assert (diff.added, diff.removed) == (["p/sub"], ["p"])
    assert (diff.removed_keys, diff.changed_keys) == (["p/s0"], [])
    assert diff.meta_changed_keys == ["p/sub/s1"] and diff.samples_meta_changed == 1
