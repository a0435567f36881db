"""The check-then-write gateway (shardlake.testing.proxy) in front of a real SeaweedFS: it
answers one conditional create at a time correctly, and lets concurrent ones all win."""

from __future__ import annotations

import http.client
import threading
import uuid
from collections.abc import Iterator

import pytest

from shardlake.errors import AlreadyExistsError
from shardlake.store import Store, open_store
from shardlake.testing.proxy import CheckThenWriteGateway
from shardlake.testing.servers import StoreServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def gateway(seaweedfs_server: StoreServer) -> Iterator[CheckThenWriteGateway]:
    with CheckThenWriteGateway(seaweedfs_server.endpoint_url) as proxy:
        yield proxy


def _store(server: StoreServer, gateway: CheckThenWriteGateway) -> Store:
    return open_store(
        server.fresh_url("gateway"), gateway.storage_options(dict(server.storage_options))
    )


def _put(endpoint: str, path: str, body: bytes) -> tuple[int, bytes]:
    host, port = endpoint.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("PUT", path, body=body, headers={"If-None-Match": "*"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_a_lone_conditional_create_is_answered_like_seaweedfs(
    seaweedfs_server: StoreServer, gateway: CheckThenWriteGateway
) -> None:
    path = f"/{seaweedfs_server.bucket}/lone-{uuid.uuid4().hex}"
    assert _put(gateway.endpoint_url, path, b"first")[0] == 200
    status, body = _put(gateway.endpoint_url, path, b"second")
    direct_status, direct_body = _put(seaweedfs_server.endpoint_url, path, b"third")
    assert status == direct_status == 412
    for shape in (body, direct_body):  # the same shape as the server's own refusal
        assert b"<Code>PreconditionFailed</Code>" in shape and b"<Condition>" not in shape
    assert gateway.creates == {"checked": 2, "refused": 1, "written": 1}


def test_sequential_creates_are_refused_through_it(
    seaweedfs_server: StoreServer, gateway: CheckThenWriteGateway
) -> None:
    # Why a sequential probe (create, then create again) cannot tell this gateway apart.
    store = _store(seaweedfs_server, gateway)
    store.create("k", b"first")
    with pytest.raises(AlreadyExistsError):
        store.create("k", b"second")
    assert store.read("k") == b"first"


def _race(store: Store, racers: int = 8) -> list[int]:
    """``racers`` threads create one fresh key at once, each with its own bytes; the winners."""
    store.create("warm", b"up")  # open the client before the racers start
    barrier = threading.Barrier(racers)
    won: list[int] = []
    lost: list[int] = []

    def create(i: int) -> None:
        barrier.wait()
        try:
            store.create("race", f"racer {i}".encode())
            won.append(i)
        except AlreadyExistsError:
            lost.append(i)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(won) + len(lost) == racers
    return won


def test_concurrent_creates_through_it_have_several_winners(
    seaweedfs_server: StoreServer, gateway: CheckThenWriteGateway
) -> None:
    won = _race(_store(seaweedfs_server, gateway))
    assert len(won) >= 2, won  # a store that enforces the condition has exactly one
    assert gateway.creates["written"] >= 2


def test_plain_seaweedfs_has_exactly_one_winner(seaweedfs_server: StoreServer) -> None:
    store = open_store(seaweedfs_server.fresh_url("direct"), dict(seaweedfs_server.storage_options))
    won = _race(store)
    assert len(won) == 1 and store.read("race") == f"racer {won[0]}".encode()
