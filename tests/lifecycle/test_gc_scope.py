"""gc deletes only what shardlake wrote; pack and export refuse dangerous destinations."""

from __future__ import annotations

import json
import os
import urllib.request
import uuid
from pathlib import Path

import pytest

import shardlake
from shardlake import PackOptions
from shardlake.cli.main import main
from shardlake.errors import ConflictError, UsageError
from shardlake.testing import synth_corpus
from shardlake.testing.fixtures import StoreLocation
from shardlake.testing.servers import StoreServers

FOREIGN = {
    "notes.txt": b"my notes",
    "results/a.csv": b"a,b\n1,2\n",
    "data/README.md": b"not a shard",
    "data/0123456789ab/deadbeefdeadbeef/notes.txt": b"nested",
    "versions/v1/notes.txt": b"not a record",
    "catalog/segments/short.parquet": b"not a segment",
}


def _corpus(tmp_path: Path, seed: int = 5) -> Path:
    src = tmp_path / "src"
    synth_corpus(src, 2, 3, seed=seed, neighbors=2, lanes=4)
    return src


def _gc_json(root: str, *extra: str, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["gc", root, "--grace", "0s", "--json", *extra]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


@pytest.mark.parametrize("store_kind", ["local", "s3"])
def test_gc_never_deletes_foreign_objects(
    store_location: StoreLocation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, opts = store_location.url, store_location.storage_options
    src = _corpus(tmp_path)
    lake = shardlake.open(root, **opts)
    lake.pack(src, tag="v1", options=PackOptions(workers=1, executor="inline"))
    store = store_location.open()
    for key, data in FOREIGN.items():
        store.write(key, data)
    lake.remove("v2", partitions=[lake.dataset("v1").entries[0].id])
    lake.prune(["v1"])

    dry = _gc_json(root, "--dry-run", capsys=capsys)
    would = {o["key"] for o in dry["would_delete"]}  # type: ignore[attr-defined]
    assert would and not would & set(FOREIGN)
    assert dry["foreign"] == len(FOREIGN)
    assert main(["gc", root, "--grace", "0s"]) == 0
    text = capsys.readouterr().out
    assert f"{len(FOREIGN)} foreign objects under the root, left alone" in text
    assert "notes.txt" in text
    for key, data in FOREIGN.items():
        assert store.read(key) == data
    assert lake.scrub("v2").ok


def test_gc_of_a_root_at_the_top_of_a_bucket_spares_other_teams(
    store_servers: StoreServers, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import s3fs

    opts = dict(store_servers.get("s3").storage_options)
    bucket = f"team-{uuid.uuid4().hex[:8]}"
    urllib.request.urlopen(
        urllib.request.Request(f"{opts['endpoint_url']}/{bucket}", method="PUT"), timeout=30
    ).close()
    fs = s3fs.S3FileSystem(**opts)
    fs.pipe({f"{bucket}/team-a/model.pt": b"weights", f"{bucket}/logs/run1.txt": b"log"})
    root = f"s3://{bucket}"
    src = _corpus(tmp_path)
    args = ["--storage-option", f"endpoint_url={json.dumps(opts['endpoint_url'])}"]
    # Refused first: the bucket holds other objects and no root.
    assert main(["pack", str(src), root, "--tag", "v1", "--quiet", *args]) == 1
    err = capsys.readouterr().err
    assert "team-a/model.pt" in err and "--allow-foreign" in err
    assert not fs.exists(f"{bucket}/shardlake.json")
    lake = shardlake.open(root, **opts)
    lake.pack(src, tag="v1", options=PackOptions(workers=1, allow_foreign=True))
    lake.pack(src, tag="v2", options=PackOptions(workers=1, seed=3))
    lake.prune(["v1"])
    report = lake.gc(grace_s=0)
    assert {o.key for o in report.foreign} == {"team-a/model.pt", "logs/run1.txt"}
    assert fs.cat(f"{bucket}/team-a/model.pt") == b"weights"
    assert fs.cat(f"{bucket}/logs/run1.txt") == b"log"


def test_pack_refuses_a_non_empty_destination_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _corpus(tmp_path)
    dest = tmp_path / "dest"
    (dest / "results").mkdir(parents=True)
    (dest / "notes.txt").write_text("x")
    (dest / "results" / "a.csv").write_text("a")
    assert main(["pack", str(src), str(dest), "--tag", "v1", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "notes.txt" in err and "results/a.csv" in err and "--allow-foreign" in err
    assert sorted(p.name for p in dest.iterdir()) == ["notes.txt", "results"]
    with pytest.raises(ConflictError, match="not a shardlake root"):
        shardlake.open(str(dest)).pack(src, tag="v1")
    assert main(["pack", str(src), str(dest), "--tag", "v1", "--quiet", "--allow-foreign"]) == 0
    capsys.readouterr()
    # Once the root exists, later packs need no flag; gc leaves the files alone.
    assert main(["pack", str(src), str(dest), "--tag", "v2", "--quiet", "--seed", "3"]) == 0
    assert main(["gc", str(dest), "--grace", "0s"]) == 0
    assert (dest / "notes.txt").read_text() == "x" and (dest / "results" / "a.csv").exists()


def test_export_refuses_a_non_empty_destination_unless_allowed(tmp_path: Path) -> None:
    src = _corpus(tmp_path)
    lake = shardlake.open(str(tmp_path / "root"))
    lake.pack(src, tag="v1", options=PackOptions(workers=1, executor="inline"))
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "notes.txt").write_text("x")
    with pytest.raises(ConflictError, match="notes.txt"):
        lake.export(str(dest))
    assert sorted(os.listdir(dest)) == ["notes.txt"]
    lake.export(str(dest), allow_foreign=True)
    copy = shardlake.open(str(dest))
    assert copy.scrub().ok
    assert copy.gc(grace_s=0).foreign[0].key == "notes.txt"
    assert (dest / "notes.txt").read_text() == "x"


def test_root_inside_source_and_source_inside_root_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _corpus(tmp_path)
    inside = src / "lake"
    assert main(["pack", str(src), str(inside), "--tag", "v1", "--quiet"]) == 2
    assert "inside the source tree" in capsys.readouterr().err
    assert not inside.exists()
    with pytest.raises(UsageError, match="inside the source tree"):
        shardlake.open(str(src)).pack(src, tag="v1")
    # Through a symlink, the same place.
    link = tmp_path / "link"
    link.symlink_to(src, target_is_directory=True)
    with pytest.raises(UsageError, match="inside the source tree"):
        shardlake.open(str(link / "lake")).pack(src, tag="v1")
    # A source inside the root.
    root = tmp_path / "outer"
    nested = root / "frames"
    nested.parent.mkdir()
    src.rename(nested)
    with pytest.raises(UsageError, match="inside the root"):
        shardlake.open(str(root)).pack(nested, tag="v1")
    assert not (root / "shardlake.json").exists()
