"""A store whose create-if-absent is check-then-write is refused before anything is published,
and ``check-store`` names the failed check; healthy stores pass every check.

The gateway is shardlake.testing.proxy.CheckThenWriteGateway in front of a real SeaweedFS: a
lone conditional PUT is refused correctly, concurrent ones all win (SeaweedFS #8800, versitygw
#2288, rustfs #1659)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import shardlake
from shardlake.cli.main import main
from shardlake.format.layout import PROBE_DIR
from shardlake.store import open_store
from shardlake.testing import synth_corpus
from shardlake.testing.fixtures import StoreLocation
from shardlake.testing.proxy import CheckThenWriteGateway
from shardlake.testing.servers import StoreServer

pytestmark = pytest.mark.timeout(180)

CHECKS = {
    "create-if-absent",
    "create-if-absent-race",
    "read-after-write",
    "ranged-read",
    "list-after-write",
    "delete",
}


@pytest.fixture
def gateway(
    seaweedfs_server: StoreServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[CheckThenWriteGateway]:
    """The racy gateway, and the AWS_* environment of a CLI call pointed at it."""
    with CheckThenWriteGateway(seaweedfs_server.endpoint_url) as proxy:
        for name, value in seaweedfs_server.env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint_url)
        yield proxy


def test_pack_through_the_racy_gateway_is_refused_before_anything_is_published(
    seaweedfs_server: StoreServer,
    gateway: CheckThenWriteGateway,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = tmp_path / "src"
    synth_corpus(src, 2, 3, seed=3, neighbors=2, lanes=4)
    url = seaweedfs_server.fresh_url("racy")
    code = main(["pack", str(src), url, "--tag", "v1", "--executor", "inline", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert "create-if-absent" in err, err
    assert gateway.creates["written"] >= 2  # the race was run, and the gateway lost it
    # Straight to SeaweedFS: no root marker, shard, manifest, version or commit - at most the
    # probe's own record under _shardlake/.
    direct = open_store(url, dict(seaweedfs_server.storage_options))
    assert [key for key in direct.list() if not key.startswith(PROBE_DIR + "/")] == []


def test_check_store_names_the_race_it_failed(
    seaweedfs_server: StoreServer,
    gateway: CheckThenWriteGateway,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = seaweedfs_server.fresh_url("racy-check")
    options = gateway.storage_options(seaweedfs_server.storage_options)
    report = shardlake.check_store(url, **options)
    assert report.safe is False
    verdicts = {check.name: check.ok for check in report.checks}
    assert verdicts["create-if-absent-race"] is False
    assert verdicts["create-if-absent"] is True  # one create at a time is answered correctly

    # The gateway named explicitly: not through the environment (or a cached client of it).
    flags = [f for k, v in options.items() for f in ("--storage-option", f"{k}={json.dumps(v)}")]
    assert main(["check-store", url, "--json", *flags]) == 1
    shown = json.loads(capsys.readouterr().out)
    assert set(shown) == {"url", "safe", "checks", "bucket_created"}
    assert shown["bucket_created"] is False
    assert shown["url"] == url and shown["safe"] is False
    failed = [check["name"] for check in shown["checks"] if not check["ok"]]
    assert failed == ["create-if-absent-race"], shown
    for check in shown["checks"]:
        assert set(check) == {"name", "ok", "detail"}


@pytest.mark.parametrize("store_kind", ["seaweedfs", "azure", "s3", "gcs", "local"])
def test_check_store_passes_healthy_stores(
    store_location: StoreLocation, capsys: pytest.CaptureFixture[str]
) -> None:
    report = shardlake.check_store(store_location.url, **store_location.storage_options)
    failed = [(check.name, check.detail) for check in report.checks if not check.ok]
    assert report.safe is True and failed == []
    assert {check.name for check in report.checks} >= CHECKS

    # The CLI reaches the same server through the environment the fixture set.
    assert main(["check-store", store_location.url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["safe"] is True and shown["url"] == store_location.url
    assert {check["name"] for check in shown["checks"]} >= CHECKS
    # It cleans up after itself: nothing is left but, at most, its record under _shardlake/.
    left = store_location.open().list()
    assert [key for key in left if not key.startswith(PROBE_DIR + "/")] == []
