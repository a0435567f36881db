"""HTTP requests on the wire (through a fault-free proxy): one GET per small object, no HEAD
before a read whose size is known, and a loader that starts in a constant number of requests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardlake.store import open_store
from shardlake.testing.proxy import FaultProxy
from shardlake.testing.servers import S3Server, moto_s3_server
from shardlake.torch import ShardDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import scale  # noqa: E402


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with moto_s3_server(set_env=False) as server:
        yield server


def _methods(proxy: FaultProxy) -> list[str]:
    methods = [method for method, _path, _kind in proxy.history]
    proxy.history.clear()
    return methods


@pytest.mark.parametrize("read_client", ["s3fs", "obstore"])
def test_a_read_is_one_get_and_a_range_is_one_get(
    s3: S3Server, read_client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both read clients: s3fs (whole reads and single ranges always) and obstore (the default
    # for ranged multi-reads where it is installed) send one GET and never a HEAD first.
    if read_client == "obstore":
        pytest.importorskip("obstore")
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)  # another server's, exported by the session
    with FaultProxy(s3.endpoint_url, rate=0.0) as proxy:
        options = {**proxy.storage_options(s3.storage_options), "read_client": read_client}
        store = open_store(s3.url(f"shape-{read_client}"), options)
        store.write("doc.json", b"{}" * 1000)
        _methods(proxy)
        assert store.read("doc.json") == b"{}" * 1000
        assert _methods(proxy) == ["GET"]
        assert store.read_range("doc.json", 10, 20) == (b"{}" * 1000)[10:20]
        assert _methods(proxy) == ["GET"]
        assert store.read_ranges([("doc.json", 100, 900)]) == [(b"{}" * 1000)[100:900]]
        assert _methods(proxy) == ["GET"]


@pytest.mark.parametrize("partitions", [10, 100])
def test_loader_start_up_requests_do_not_grow(s3: S3Server, partitions: int) -> None:
    with FaultProxy(s3.endpoint_url, rate=0.0) as proxy:
        options = proxy.storage_options(s3.storage_options)
        url = s3.url(f"startup{partitions}")
        scale.build_root(url, partitions, 2, options)
        _methods(proxy)
        ShardDataset(url, "v1", batch_size=1, num_workers=0, storage_options=options)
        # the commit listing (a GET), then the commit, the record, the partitions table, the segment
        assert _methods(proxy) == ["GET"] * 5
