"""The create-if-absent capability check: sequential and racing creates, a remembered result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import shardlake
from shardlake.cli.main import main
from shardlake.errors import CapabilityError
from shardlake.store import Store, open_store
from shardlake.store.layers import Request
from shardlake.store.probe import PROBE_RECORD_KEY, PROBE_RECORD_TTL_S, ProbeInconclusiveError
from shardlake.testing import synth_corpus
from shardlake.testing.faults import CheckThenWriteStore, FaultInjector, FaultPlan

pytestmark = pytest.mark.timeout(120)


def test_check_then_write_store_is_refused_naming_the_race(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "root"))
    racy = store.with_layers(CheckThenWriteStore())
    with pytest.raises(CapabilityError, match="create-if-absent-race") as caught:
        racy.ensure_create_enforced()
    assert "8 of 8" in str(caught.value) or "of 8 concurrent creates" in str(caught.value)
    assert store.list() == []  # the probe keys are gone, nothing was published


def test_pack_refuses_a_check_then_write_store_before_publishing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    synth_corpus(src, 1, 4, seed=1, neighbors=2, lanes=4)
    store = open_store(str(tmp_path / "root")).with_layers(CheckThenWriteStore())
    with pytest.raises(CapabilityError, match="create-if-absent-race"):
        shardlake.open(store).pack(str(src), tag="v1")
    assert not [k for k in open_store(str(tmp_path / "root")).list() if k.startswith("versions/")]


def test_sound_store_passes_and_the_result_is_remembered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    synth_corpus(src, 1, 4, seed=1, neighbors=2, lanes=4)
    root = str(tmp_path / "root")
    assert main(["pack", str(src), root, "--tag", "v1"]) == 0
    assert main(["pack", str(src), root, "--tag", "v2"]) == 0  # the root marker exists now
    store = open_store(root)
    record = json.loads(store.read(PROBE_RECORD_KEY))
    assert set(record["checks_passed"]) >= {"create-if-absent", "create-if-absent-race"}
    assert record["store"]["url"] == store.url
    # A fresh record spares the next command the probe: no create under _shardlake/probe/.
    creates: list[str] = []

    def spy(request: Request, send):  # type: ignore[no-untyped-def]
        if request.op == "create":
            creates.append(request.key)
        return send()

    import shardlake.store.probe as probe

    real = probe.run_create_checks
    monkeypatch.setattr(probe, "run_create_checks", lambda *a: pytest.fail("probed again"))
    open_store(root).ensure_create_enforced()
    monkeypatch.setattr(probe, "run_create_checks", real)
    # ...but a stale one is not trusted.
    record["checked_at"] -= PROBE_RECORD_TTL_S + 1
    store.write(PROBE_RECORD_KEY, json.dumps(record).encode())
    layered = open_store(root).with_layers(spy)
    layered.ensure_create_enforced()
    assert any(k.startswith("_shardlake/probe/") for k in creates)


def test_damaged_read_back_is_reread_not_a_verdict(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "root"))
    flips = {"n": 0}

    def flip_first_reads(request: Request, send):  # type: ignore[no-untyped-def]
        data = send()
        if request.op == "read" and flips["n"] < 2:
            flips["n"] += 1
            return b"X" + data[1:]
        return data

    store.with_layers(flip_first_reads).ensure_create_enforced()  # re-read, then passes
    assert flips["n"] == 2


def test_persistently_damaged_read_back_is_inconclusive(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "root"))
    count = {"n": 0}

    def vary(request: Request, send):  # type: ignore[no-untyped-def]
        data = send()
        if request.op == "read":
            count["n"] += 1
            return str(count["n"]).encode() + data
        return data

    with pytest.raises(ProbeInconclusiveError, match="inconclusive"):
        store.with_layers(vary).ensure_create_enforced()


def test_store_ignoring_create_still_refused(tmp_path: Path) -> None:
    store: Store = open_store(str(tmp_path / "root"))
    with pytest.raises(CapabilityError, match="create-if-absent:"):
        store.with_layers(FaultInjector(FaultPlan(ignore_create=True))).ensure_create_enforced()


def test_loopback_moto_decides_racing_creates_atomically(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto checks If-None-Match and then writes with no lock between; the loopback server
    serialises conditional writes so that, like AWS, exactly one racer wins. The existence
    check is slowed here to widen the window that let two creates win in CI."""
    import time
    import uuid

    from moto.s3.models import S3Backend

    from shardlake.store.probe import check_create_race
    from shardlake.tools.loopback import moto_s3_server

    looked_up = S3Backend.get_object

    def slow_get_object(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        found = looked_up(self, *args, **kwargs)
        time.sleep(0.02)  # between moto's check and its write
        return found

    with moto_s3_server(set_env=False) as s3:
        store = open_store(s3.fresh_url("race"), s3.storage_options)
        monkeypatch.setattr(S3Backend, "get_object", slow_get_object)
        check = check_create_race(store, f"probe/{uuid.uuid4().hex}")
    assert check.ok, check.detail
