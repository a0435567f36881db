"""What is published is what was computed: every PUT body shardlake sends carries a digest the
store checks, whatever the client's checksum defaults, and a body damaged on its way (a proxy
flips one byte) is refused by the store and sent again - or the pack fails with nothing
published.  On SeaweedFS, which answers a damaged body without a digest with 200."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import shardlake
from shardlake.errors import ShardlakeError
from shardlake.store import open_store
from shardlake.testing import synth_corpus
from shardlake.testing.proxy import FaultProxy
from shardlake.testing.servers import StoreServer, StoreServers

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(params=["when_required", "when_supported"])
def checksums(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """botocore's request checksums off (what many S3-compatible deployments set) and on."""
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", str(request.param))
    return str(request.param)


@pytest.fixture
def proxy(seaweedfs_server: StoreServer) -> Iterator[FaultProxy]:
    with FaultProxy(seaweedfs_server.endpoint_url, rate=0.0) as proxy:
        yield proxy


def _aim_at_upload(proxy: FaultProxy, target: str) -> None:
    """Flip a byte of the next GCS simple upload of an object whose name holds ``target``."""
    proxy.inject("flip_request", path_contains="/upload/", body_contains=target.encode())


def _flipped(proxy: FaultProxy) -> list[str]:
    return [path for _method, path, kind in proxy.history if kind == "flip_request"]


@pytest.mark.parametrize(
    ("target", "frames"),
    [
        ("/shard-", 4),  # a small shard: one PutObject
        ("/shard-", 40),  # a shard of several 5 MiB parts: the first UploadPart
        ("/manifest-", 4),  # a create-if-absent (If-None-Match: *)
        ("commits/", 4),  # the commit that publishes
    ],
    ids=["shard", "shard-part", "manifest", "commit"],
)
def test_a_put_body_damaged_in_transit_is_refused_and_sent_again(
    seaweedfs_server: StoreServer,
    proxy: FaultProxy,
    checksums: str,
    tmp_path: Path,
    target: str,
    frames: int,
) -> None:
    src = tmp_path / "src"
    synth_corpus(src, 1, frames, seed=5)
    url = seaweedfs_server.fresh_url("flip")
    root = shardlake.open(url, **proxy.storage_options(seaweedfs_server.storage_options))
    proxy.inject("flip_request", path_contains=target, method="PUT")
    root.pack(src, tag="v1", executor="inline", progress=False)
    flipped = _flipped(proxy)
    assert len(flipped) == 1 and target in flipped[0]
    # The damaged body was refused and the same request sent again (not published as is).
    assert sum(1 for m, p, _ in proxy.history if m == "PUT" and p == flipped[0]) >= 2
    # Straight to SeaweedFS: the version holds exactly what was computed.
    direct = shardlake.open(url, **seaweedfs_server.storage_options)
    assert direct.verify(src, version="v1").ok
    assert direct.scrub("v1").ok


def test_a_body_damaged_every_time_fails_the_pack_with_nothing_published(
    seaweedfs_server: StoreServer, proxy: FaultProxy, checksums: str, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    synth_corpus(src, 1, 4, seed=6)
    url = seaweedfs_server.fresh_url("flip-always")
    options = {**proxy.storage_options(seaweedfs_server.storage_options), "retry_deadline": 3}
    root = shardlake.open(url, **options)
    proxy.inject("flip_request", path_contains="/shard-", method="PUT", times=10_000)
    with pytest.raises(ShardlakeError):
        root.pack(src, tag="v1", executor="inline", progress=False)
    direct = open_store(url, dict(seaweedfs_server.storage_options))
    keys = direct.list()
    assert not [k for k in keys if k.startswith("commits/") or "/shard-" in k], keys


@pytest.mark.parametrize("target", ["/shard-", "/manifest-", "commits/"])
def test_azure_a_put_body_damaged_in_transit_is_refused_and_sent_again(
    azurite_server: StoreServer, tmp_path: Path, target: str
) -> None:
    # Put Block (a streamed shard), Put Blob with If-None-Match (a manifest, the commit).
    from shardlake.testing.azurite import azure_storage_options

    src = tmp_path / "src"
    synth_corpus(src, 1, 4, seed=7)
    url = azurite_server.fresh_url("flip")
    with FaultProxy(azurite_server.endpoint_url, rate=0.0) as proxy:
        root = shardlake.open(url, **azure_storage_options(proxy.endpoint_url))
        proxy.inject("flip_request", path_contains=target, method="PUT")
        root.pack(src, tag="v1", executor="inline", progress=False)
        flipped = _flipped(proxy)
    assert len(flipped) == 1 and target in flipped[0]
    direct = shardlake.open(url, **azurite_server.storage_options)
    assert direct.verify(src, version="v1").ok
    assert direct.scrub("v1").ok


@pytest.mark.parametrize("target", ["/manifest-", "commits/"])
def test_gcs_an_upload_stored_damaged_is_deleted_and_sent_again(
    store_servers: StoreServers, tmp_path: Path, target: str
) -> None:
    # fake-gcs-server checks no digest on arrival (nor would GCS: gcsfs sends none), so the
    # check is the MD5 GCS reports for what it stored, before anything refers to the object.
    from shardlake.tools.loopback import gcs_storage_options

    server = store_servers.get("gcs")
    src = tmp_path / "src"
    synth_corpus(src, 1, 4, seed=8)
    url = server.fresh_url("flip")
    with FaultProxy(server.endpoint_url, rate=0.0) as proxy:
        root = shardlake.open(url, **gcs_storage_options(proxy.endpoint_url))
        _aim_at_upload(proxy, target)
        root.pack(src, tag="v1", executor="inline", progress=False)
        assert proxy.injected["flip_request"] == 1
    direct = shardlake.open(url, **server.storage_options)
    assert direct.verify(src, version="v1").ok
    assert direct.scrub("v1").ok


def test_gcs_a_streamed_shard_stored_damaged_fails_the_pack_with_nothing_published(
    store_servers: StoreServers, tmp_path: Path
) -> None:
    from shardlake.tools.loopback import gcs_storage_options

    server = store_servers.get("gcs")
    src = tmp_path / "src"
    synth_corpus(src, 1, 4, seed=9)
    url = server.fresh_url("flip-shard")
    with FaultProxy(server.endpoint_url, rate=0.0) as proxy:
        root = shardlake.open(url, **gcs_storage_options(proxy.endpoint_url))
        # A streamed shard is a resumable upload: its start names it, its data follows.
        proxy.delay_s = 0.01
        proxy.inject("delay", path_contains="/upload/", body_contains=b"/shard-")
        proxy.inject("flip_request", path_contains="/upload/")
        with pytest.raises(ShardlakeError, match="shard-"):
            root.pack(src, tag="v1", executor="inline", progress=False)
        assert proxy.injected["flip_request"] == 1
    keys = open_store(url, dict(server.storage_options)).list()
    # nothing published, and the damaged shard deleted
    assert not [k for k in keys if k.startswith("commits/") or "/shard-" in k], keys
