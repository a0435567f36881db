"""export checks each shard on its way (issue 47): the copy is never read back from the
destination (its upload digests prove the store got the bytes sent), a part damaged on its way
to the store is sent again, and source bytes that fail the manifest's checks abort that copy
before it is visible and copy again.  On SeaweedFS (5 MiB test parts) through a proxy."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import shardlake
from shardlake import Store, open_store
from shardlake.errors import IntegrityError
from shardlake.lifecycle import shard_copy
from shardlake.testing import synth_corpus
from shardlake.testing.proxy import FaultProxy
from shardlake.testing.servers import StoreServer

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def proxy(seaweedfs_server: StoreServer) -> Iterator[FaultProxy]:
    with FaultProxy(seaweedfs_server.endpoint_url, rate=0.0) as proxy:
        yield proxy


def _local_root(tmp_path: Path, frames: int = 40) -> Store:
    """A local root of one partition whose shard spans several 5 MiB parts."""
    synth_corpus(tmp_path / "src", 1, frames, seed=5)
    shardlake.open(str(tmp_path / "root")).pack(
        tmp_path / "src", tag="v1", executor="inline", progress=False
    )
    return open_store(str(tmp_path / "root"))


def _shards(store: Store) -> dict[str, bytes]:
    return {k: store.read(k) for k in store.list("") if "/shard-" in k}


def test_export_to_s3_never_reads_the_copy_back(
    seaweedfs_server: StoreServer, proxy: FaultProxy, tmp_path: Path
) -> None:
    src = _local_root(tmp_path)
    shards = _shards(src)
    assert max(len(data) for data in shards.values()) > 2 * (5 << 20)  # several parts
    url = seaweedfs_server.fresh_url("streamed")
    options = proxy.storage_options(seaweedfs_server.storage_options)
    report = shardlake.open(src).export(url, dest_storage_options=options, progress=False)
    assert report.committed and sorted(shards) == sorted(k for k in report.copied if k in shards)
    fetched = sum(n for method, _path, _range, n in proxy.served if method == "GET")
    # Metadata read-backs only: no shard byte comes back from the destination.
    assert fetched < sum(len(data) for data in shards.values()) / 50
    assert not any(m == "GET" and "/shard-" in p for m, p, _r, _n in proxy.served)
    dest = open_store(url, seaweedfs_server.storage_options)
    assert _shards(dest) == shards
    assert shardlake.open(dest).scrub().ok


def test_export_part_damaged_on_its_way_is_sent_again(
    seaweedfs_server: StoreServer, proxy: FaultProxy, tmp_path: Path
) -> None:
    src = _local_root(tmp_path)
    url = seaweedfs_server.fresh_url("flip-part")
    options = proxy.storage_options(seaweedfs_server.storage_options)
    proxy.inject("flip_request", path_contains="/shard-", method="PUT")
    report = shardlake.open(src).export(url, dest_storage_options=options, progress=False)
    assert report.committed and proxy.injected["flip_request"] == 1
    dest = open_store(url, seaweedfs_server.storage_options)
    assert _shards(dest) == _shards(src)
    assert shardlake.open(dest).scrub().ok


def test_export_source_bytes_damaged_on_their_way_abort_that_copy(
    seaweedfs_server: StoreServer, proxy: FaultProxy, tmp_path: Path
) -> None:
    # The source on SeaweedFS through the proxy: one shard read comes back with a flipped byte.
    local = _local_root(tmp_path)
    src_url = seaweedfs_server.fresh_url("flip-src")
    shardlake.open(local).export(src_url, dest_storage_options=seaweedfs_server.storage_options)
    src = open_store(src_url, proxy.storage_options(seaweedfs_server.storage_options))
    dest_url = seaweedfs_server.fresh_url("flip-dest")
    dest = open_store(dest_url, seaweedfs_server.storage_options)
    proxy.inject("flip", path_contains="/shard-", method="GET")
    report = shardlake.open(src).export(dest, progress=False)
    assert report.committed and proxy.injected["flip"] == 1
    assert _shards(dest) == _shards(local)
    # The damaged copy was aborted, not left as a multipart upload.
    assert not dest.leftovers(older_than=time.time() + 60)
    # Damaged on every read: nothing is published, and the error names the source shard.
    again = seaweedfs_server.fresh_url("flip-every")
    proxy.inject("flip", path_contains="/shard-", method="GET", times=10)
    with pytest.raises(IntegrityError, match=r"failed verification \(source\).*checksum"):
        shardlake.open(src).export(again, dest_storage_options=seaweedfs_server.storage_options)
    failed = open_store(again, seaweedfs_server.storage_options)
    assert not _shards(failed) and not failed.list("commits/")
    assert not failed.leftovers(older_than=time.time() + 60)


def test_export_checks_headers_and_payloads_across_read_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pieces of 777 bytes: tar headers and payloads straddle piece ends.
    monkeypatch.setattr(shard_copy, "CHUNK", 777)
    src = _local_root(tmp_path, frames=6)
    report = shardlake.open(src).export(str(tmp_path / "dest"), progress=False)
    dest = open_store(str(tmp_path / "dest"))
    assert report.committed and _shards(dest) == _shards(src)
    # A flipped byte in a tar header is found on the way, and nothing is published.
    shard = next(iter(_shards(src)))
    data = bytearray(src.read(shard))
    data[5] ^= 0x20  # the first member's name, in its tar header (payloads intact)
    src.write(shard, bytes(data))
    with pytest.raises(IntegrityError, match=r"failed verification \(source\).*tar header"):
        shardlake.open(src).export(str(tmp_path / "again"), progress=False)
    assert not open_store(str(tmp_path / "again")).exists(shard)


def test_export_sends_nothing_past_a_damaged_payload(
    seaweedfs_server: StoreServer, proxy: FaultProxy, tmp_path: Path
) -> None:
    src = _local_root(tmp_path)
    shard = next(iter(_shards(src)))
    data = bytearray(src.read(shard))
    data[2000] ^= 0x01  # inside the first payload: the first 8 MiB piece fails its CRC-32
    src.write(shard, bytes(data))
    url = seaweedfs_server.fresh_url("rot")
    options = proxy.storage_options(seaweedfs_server.storage_options)
    with pytest.raises(IntegrityError, match=r"failed verification \(source\).*checksum"):
        shardlake.open(src).export(url, dest_storage_options=options, progress=False)
    # Every copy stopped at the damage: no part of the shard left for the store.
    assert not [p for m, p, _k in proxy.history if m == "PUT" and "/shard-" in p]
    assert not open_store(url, seaweedfs_server.storage_options).exists(shard)
