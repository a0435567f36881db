"""``shardlake check-store`` / ``shardlake.check_store``: named checks, a verdict, no traces."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

import shardlake
from shardlake.cli.main import main
from shardlake.errors import BucketNotFoundError
from shardlake.store import open_store
from shardlake.testing.faults import CheckThenWriteStore
from shardlake.testing.fixtures import StoreLocation

pytestmark = pytest.mark.timeout(120)

NAMES = [
    "create-if-absent",
    "create-if-absent-race",
    "read-after-write",
    "ranged-read",
    "list-after-write",
    "delete",
    "small-object-latency",
    "large-object-throughput",
]


@pytest.mark.parametrize("store_kind", ["local", "memory", "s3", "gcs"])
def test_check_store_passes_sound_stores_and_cleans_up(store_location: StoreLocation) -> None:
    started = time.monotonic()
    report = shardlake.check_store(store_location.url, **store_location.storage_options)
    assert time.monotonic() - started < 30
    doc = report.to_json()
    assert set(doc) == {"url", "safe", "bucket_created", "checks"}
    assert doc["safe"] is True and doc["bucket_created"] is False, doc
    assert [c["name"] for c in doc["checks"]] == NAMES
    assert all(set(c) == {"name", "ok", "detail"} and c["ok"] for c in doc["checks"])
    assert "MiB/s" in doc["checks"][-1]["detail"] and " ms" in doc["checks"][-2]["detail"]
    assert store_location.open().list() == []  # nothing left behind


def test_check_store_cli_json_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "store")
    assert main(["check-store", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["safe"] is True and doc["url"] == open_store(url).url
    assert [c["name"] for c in doc["checks"]] == NAMES
    assert main(["check-store", url]) == 0
    table = capsys.readouterr().out
    assert "safe" in table and "create-if-absent-race" in table and "MiB/s" in table


def test_check_then_write_store_is_not_safe_and_the_race_is_named(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store")).with_layers(CheckThenWriteStore())
    report = shardlake.check_store(store)
    assert not report.safe
    assert report.failed() == ["create-if-absent-race"]
    race = next(c for c in report.checks if c.name == "create-if-absent-race")
    assert "of 8 concurrent creates" in race.detail
    assert open_store(str(tmp_path / "store")).list() == []


def test_check_store_cli_exits_1_when_unsafe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardlake.store.check as check

    real = check.open_store
    monkeypatch.setattr(
        check,
        "open_store",
        lambda url, opts=None: real(url, opts).with_layers(CheckThenWriteStore()),
    )
    assert main(["check-store", str(tmp_path / "s")]) == 1
    out = capsys.readouterr().out
    assert "NOT safe" in out and "failed: create-if-absent-race" in out


@pytest.mark.parametrize("kind", ["s3", "gcs", "azure"])
def test_missing_bucket_says_how_and_check_store_creates_it(
    store_servers, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = store_servers.get(kind)
    options = server.storage_options
    bucket = f"made-by-check-{uuid.uuid4().hex[:12]}"
    url = f"{server.scheme}://{bucket}/root"
    with pytest.raises(BucketNotFoundError) as caught:
        open_store(url, options).write("k", b"v")
    assert "create it (shardlake.check_store(url, create_bucket=True)" in str(caught.value)
    assert caught.value.hint == (
        f"to create it: shardlake check-store {server.scheme}://{bucket} --create-bucket"
    )
    if kind == "s3":  # the CLI shows the command (pack's first write meets the missing bucket)
        from shardlake.testing import synth_corpus

        synth_corpus(tmp_path / "src", 1, 2, seed=1, neighbors=2, lanes=4)
        flags = [f"--storage-option={k}={json.dumps(v)}" for k, v in options.items()]
        assert main(["pack", str(tmp_path / "src"), url, "--tag", "v1", "--quiet", *flags]) == 1
        err = capsys.readouterr().err
        assert f"(to create it: shardlake check-store s3://{bucket} --create-bucket)" in err
        assert main(["check-store", url, "--create-bucket", *flags]) == 0
        assert capsys.readouterr().out.startswith(f"{url}: created its bucket\n{url}: safe")
    else:
        report = shardlake.check_store(url, create_bucket=True, **options)
        assert report.bucket_created and report.safe, report.to_json()
    open_store(url, options).write("k", b"v")  # the bucket is there now
    again = shardlake.check_store(url, create_bucket=True, **options)
    assert not again.bucket_created and again.safe
