"""Streamed S3 writes send several multipart parts at once (issue 47): the object is the bytes
written, in order, whatever order the parts finish in; a part that fails publishes nothing and
leaves no multipart upload behind; a pack over such a failure publishes nothing, and its re-run
writes shards byte-identical to a pack on local disk.  On SeaweedFS (5 MiB test parts)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import shardlake
from shardlake.errors import ShardlakeError
from shardlake.store import RetryPolicy, open_store
from shardlake.testing import synth_corpus
from shardlake.testing.proxy import FaultProxy
from shardlake.testing.servers import StoreServer

pytestmark = pytest.mark.timeout(300)

FAST = RetryPolicy(base_delay=0.001, max_delay=0.01, deadline=2)


@pytest.fixture
def proxy(seaweedfs_server: StoreServer) -> Iterator[FaultProxy]:
    with FaultProxy(seaweedfs_server.endpoint_url, rate=0.0, delay_s=3.0) as proxy:
        yield proxy


def _parts(count: int, part: int) -> list[bytes]:
    """``count`` parts, each full of its own marker (so a fault can be aimed at one)."""
    return [(b"PART-%04d-" % i * (part // 10 + 1))[:part] for i in range(count)]


def _part_puts(proxy: FaultProxy, key: str) -> int:
    return sum(1 for m, p, _ in proxy.history if m == "PUT" and p.endswith(key))


def test_parts_finishing_out_of_order_make_the_object_written(
    seaweedfs_server: StoreServer, proxy: FaultProxy
) -> None:
    part = int(seaweedfs_server.storage_options["default_block_size"])
    parts = _parts(6, part)
    tail = b"tail" * 1000
    url = seaweedfs_server.fresh_url("parallel")
    store = open_store(url, proxy.storage_options(seaweedfs_server.storage_options))
    # The first part is held back: the later ones finish first.
    proxy.inject("delay", path_contains="/blob", method="PUT", body_contains=b"PART-0000-")
    waiting: list[bool] = []
    with store.open_writer("blob") as out:
        for number, body in enumerate(parts):
            for start in range(0, len(body), 1 << 20):  # written in 1 MiB pieces
                out.write(body[start : start + (1 << 20)])
            if number == 1:  # the writer goes on while part 1 is still unanswered
                waiting.append(any(not part.done() for part in out.in_flight))
        out.write(tail)
    assert waiting == [True]
    assert proxy.injected["delay"] == 1
    assert _part_puts(proxy, "/blob") == 7  # six full parts and the tail, one PUT each
    direct = open_store(url, seaweedfs_server.storage_options)
    assert direct.read("blob") == b"".join(parts) + tail


def test_a_failed_part_publishes_nothing_and_leaves_no_upload(
    seaweedfs_server: StoreServer, proxy: FaultProxy
) -> None:
    part = int(seaweedfs_server.storage_options["default_block_size"])
    parts = _parts(6, part)
    url = seaweedfs_server.fresh_url("parallel-fail")
    store = open_store(url, proxy.storage_options(seaweedfs_server.storage_options), retry=FAST)
    # Part 1 is slow (still in flight), part 3 fails on every try.
    proxy.inject("delay", path_contains="/blob", method="PUT", body_contains=b"PART-0000-")
    proxy.inject(
        "500", path_contains="/blob", method="PUT", body_contains=b"PART-0002-", times=10**6
    )
    with pytest.raises(ShardlakeError), store.open_writer("blob") as out:
        for body in parts:
            out.write(body)
    direct = open_store(url, seaweedfs_server.storage_options)
    assert not direct.exists("blob")
    assert direct.leftovers(time.time() + 60) == []  # the multipart upload was aborted


def test_a_failed_last_part_at_close_publishes_nothing(
    seaweedfs_server: StoreServer, proxy: FaultProxy
) -> None:
    # The last parts go out at close: a failure there must abort the upload too.
    part = int(seaweedfs_server.storage_options["default_block_size"])
    parts = _parts(3, part)
    url = seaweedfs_server.fresh_url("parallel-close")
    store = open_store(url, proxy.storage_options(seaweedfs_server.storage_options), retry=FAST)
    proxy.inject(
        "500", path_contains="/blob", method="PUT", body_contains=b"PART-0002-", times=10**6
    )
    with pytest.raises(ShardlakeError), store.open_writer("blob") as out:
        for body in parts:
            out.write(body)
    direct = open_store(url, seaweedfs_server.storage_options)
    assert not direct.exists("blob")
    assert direct.leftovers(time.time() + 60) == []


def test_a_pack_whose_part_fails_publishes_nothing_and_its_rerun_matches_local(
    seaweedfs_server: StoreServer, proxy: FaultProxy, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    synth_corpus(src, 2, 40, seed=11)  # shards of two 5 MiB parts or more
    url = seaweedfs_server.fresh_url("pack-part-fails")
    options = {**proxy.storage_options(seaweedfs_server.storage_options), "retry_deadline": 2}
    # The first two part PUTs are slow (in flight), every later shard PUT fails.
    proxy.inject("delay", path_contains="/shard-", method="PUT", times=2)
    proxy.inject("500", path_contains="/shard-", method="PUT", times=10**6)
    with pytest.raises(ShardlakeError):
        shardlake.open(url, **options).pack(src, tag="v1", progress=False)
    direct = open_store(url, dict(seaweedfs_server.storage_options))
    keys = direct.list()
    assert not [k for k in keys if k.startswith("commits/") or "/shard-" in k], keys
    assert direct.leftovers(time.time() + 60) == []

    report = shardlake.open(url, **seaweedfs_server.storage_options).pack(
        src, tag="v1", progress=False
    )
    local = shardlake.open(str(tmp_path / "local")).pack(src, tag="v1", progress=False)
    remote_shards = [s.key for e in report.record.entries for s in e.shards]
    local_shards = [s.key for e in local.record.entries for s in e.shards]
    assert remote_shards == local_shards and len(remote_shards) == 2
    local_store = open_store(str(tmp_path / "local"), {})
    for key in remote_shards:
        assert direct.read(key) == local_store.read(key)
        assert direct.size(key) > int(seaweedfs_server.storage_options["default_block_size"])
    assert shardlake.open(url, **seaweedfs_server.storage_options).scrub("v1").ok
