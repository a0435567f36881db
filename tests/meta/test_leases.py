"""Writer leases (docs/format.md section 13): the record, its renewal, what it covers, and what
a writer whose lease lapsed is told."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import shardlake
from shardlake import open_store
from shardlake.errors import FormatError
from shardlake.format.documents import LeaseRecord
from shardlake.meta.leases import MAX_COVERS, Lease, LeaseSet, gone_error, read_leases


def test_a_lease_is_created_renewed_covered_and_removed(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "root"))
    with Lease(store, "pack", tag="v2", covers=["data/abc/"], ttl_s=0.4) as lease:
        (record,) = read_leases(store)
        assert record.id == lease.id and record.op == "pack" and record.tag == "v2"
        assert store.list("leases") == [f"leases/{lease.id}.json"]
        first = record.expires_at
        time.sleep(0.35)  # renewed every ttl / 4
        (record,) = read_leases(store)
        assert record.expires_at > first and record.live(time.time())
        lease.cover(["data/def/", "versions/v2/"])  # on the record before cover returns
        (record,) = read_leases(store)
        assert record.covers == ("data/abc/", "data/def/", "versions/v2/")
        held = LeaseSet(read_leases(store))
        assert held.holder("data/def/rev/shard-000000.tar") is not None
        assert held.holder("versions/v2/0123.json") is not None
        assert held.holder("data/abcd/rev/shard-000000.tar") is None  # a/ never covers ab/
        assert held.holder("versions/v22/0123.json") is None
        assert lease.lapsed_at is None
    assert store.list("leases") == []  # removed at the end
    # A lapsed record covers nothing.
    old = LeaseSet([record], now=record.expires_at + 1)
    assert old.live == [] and old.lapsed == [record] and old.holder("data/abc/x") is None


def test_too_many_data_prefixes_collapse_into_data(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "root"))
    covers = [f"data/{i:012x}/" for i in range(MAX_COVERS + 1)] + ["versions/v1/"]
    with Lease(store, "write", covers=covers) as lease:
        assert lease.covers == ("data/", "versions/v1/")
        assert LeaseSet(read_leases(store)).holder("data/x/y/shard-000000.tar") is not None


def test_a_lease_that_could_not_be_renewed_says_it_lapsed(tmp_path: Path) -> None:
    down = threading.Event()

    def refuse_lease_writes(request: Any, send: Any) -> Any:
        if down.is_set() and request.op == "write" and request.key.startswith("leases/"):
            raise PermissionError("the store refuses writes")  # permanent: not retried
        return send()

    store = open_store(str(tmp_path / "root")).with_layers(refuse_lease_writes)
    with Lease(store, "write", tag="w1", covers=["data/abc/"], ttl_s=0.2) as lease:
        down.set()
        time.sleep(0.4)  # past its expiry: renewals failed
        down.clear()
        deadline = time.monotonic() + 5
        while lease.lapsed_at is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lease.lapsed_at is not None
        text = str(gone_error(store, ["data/abc/r/shard-000000.tar"], since_seq=0, lease=lease))
    assert f"this run's lease {lease.id} (write of w1 by " in text
    assert "lapsed at" in text and "not renewed in time" in text
    assert "no gc committed since this run began (commit 0)" in text


def test_an_unreadable_lease_record_stops_gc(tmp_path: Path) -> None:
    from support.lifecycle import pack_small

    from shardlake.testing import synth_corpus
    from shardlake.testing.fixtures import StoreLocation

    synth_corpus(tmp_path / "src", 1, 2, seed=7, neighbors=2, lanes=4)
    location = StoreLocation("local", str(tmp_path / "root"))
    store = pack_small(location, tmp_path / "src")
    key = "leases/0123456789abcdef0123456789abcdef.json"
    store.write(key, b"{not json")
    with pytest.raises(FormatError, match=f"{key}: lease record is not valid JSON"):
        shardlake.open(store).gc(grace_s=0)
    doc = LeaseRecord(
        "fedcba9876543210fedcba9876543210", "me", "pack", "", time.time() + 60, 60.0, ("data/",)
    ).to_json()
    store.write(key, json.dumps(doc).encode())  # a record under another id's name
    with pytest.raises(FormatError, match="lease record names id"):
        shardlake.open(store).gc(grace_s=0)
    store.delete(key)
    assert shardlake.open(store).gc(grace_s=0).leases == []


def test_a_writer_that_fails_removes_its_lease(tmp_path: Path) -> None:
    import numpy as np

    root = shardlake.open(str(tmp_path / "root"))
    with (
        pytest.raises(RuntimeError, match="the caller's own error"),
        root.writer("w1") as writer,
    ):
        writer.write("log0/000000", {"x": np.zeros((2, 2), np.float32)})
        (record,) = read_leases(root.store)
        assert record.op == "write" and record.tag == "w1"
        raise RuntimeError("the caller's own error")
    assert root.store.list("leases") == [] and root.store.list("commits") == []
