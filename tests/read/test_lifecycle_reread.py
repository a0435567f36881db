"""The one payload read path: a mismatch is re-read before it is reported, and reports say
whether the damage is at rest or in transit (get, scrub, verify)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.lifecycle import pack_small

import shardlake
from shardlake import Store
from shardlake.cli.main import main
from shardlake.errors import IntegrityError
from shardlake.read import CORRUPT_AT_REST, TRANSPORT, PayloadRef, read_payloads
from shardlake.testing import synth_corpus
from shardlake.testing.fixtures import StoreLocation


class FlakyReads(Store):
    """A local store whose first ``bad_reads`` payload reads come back with one byte flipped."""

    bad_reads = 0
    truncate = False

    def _damage(self, data: bytes) -> bytes:
        if self.bad_reads <= 0 or not data:
            return data
        self.bad_reads -= 1
        at = len(data) // 2 + self.bad_reads  # each bad read differs from the others
        if self.truncate:
            return data[:at]
        flipped = bytearray(data)
        flipped[at] ^= 0x01
        return bytes(flipped)

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return self._damage(super().read_range(key, start, end))

    def read_ranges(
        self, ranges: Sequence[tuple[str, int, int]], *, views: bool = False
    ) -> list[Any]:
        return [self._damage(bytes(d)) for d in super().read_ranges(ranges, views=views)]


def _root(tmp_path: Path) -> tuple[FlakyReads, Path]:
    src = tmp_path / "src"
    synth_corpus(src, 2, 3, seed=5, neighbors=2, lanes=4)
    location = StoreLocation("local", str(tmp_path / "root"))
    pack_small(location, src)
    return FlakyReads(location.url), src


def _ref(store: Store) -> PayloadRef:
    ds = shardlake.open(store).dataset()
    row = ds.manifest(ds.entries[0].id).to_pylist()[0]
    shard = ds.shard_key(row["partition"], row["shard"])
    return PayloadRef(shard, row["offset"], row["size"], row["crc32"], row["key"])


@pytest.mark.parametrize("truncate", [False, True])
def test_one_bad_read_is_reread_away(tmp_path: Path, truncate: bool) -> None:
    store, src = _root(tmp_path)
    ref = _ref(store)
    store.bad_reads, store.truncate = 1, truncate
    (result,) = read_payloads(store, [ref])
    assert result.ok and result.reads == 2 and result.kind is None
    ds = shardlake.open(store).dataset()
    clean = ds.get(ref.key)
    store.bad_reads = 1
    again = ds.get(ref.key)  # get re-reads too
    assert clean.keys() == again.keys() and all((clean[k] == again[k]).all() for k in clean)
    store.bad_reads = 2
    assert shardlake.open(store).scrub(workers=1).ok  # two bad reads, then a good one: intact
    store.bad_reads = 2
    assert shardlake.open(store).verify(str(src), workers=1).ok


def test_reads_that_disagree_are_a_transport_error(tmp_path: Path) -> None:
    store, _src = _root(tmp_path)
    ref = _ref(store)
    store.bad_reads = 1
    (result,) = read_payloads(store, [ref], rereads=0)
    assert not result.ok and result.kind == TRANSPORT  # one read proves nothing about the store
    # Every read damaged, each differently (cut at different lengths): reads disagree -> transport.
    store.bad_reads, store.truncate = 3, True
    (result,) = read_payloads(store, [ref])
    assert not result.ok and result.kind == TRANSPORT and result.reads == 3
    assert "truncated" in (result.problem or "")


def test_corrupt_at_rest_is_reported_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, src = _root(tmp_path)
    ref = _ref(store)
    data = bytearray(store.read(ref.shard))
    data[ref.offset + ref.size // 2] ^= 0x40
    store.write(ref.shard, bytes(data))
    (result,) = read_payloads(store, [ref])
    assert result.kind == CORRUPT_AT_REST and result.reads == 3
    with pytest.raises(IntegrityError, match="corrupt at rest") as info:
        shardlake.open(store).dataset().get(ref.key)
    assert ref.key in str(info.value) and f"offset {ref.offset}" in str(info.value)
    report = shardlake.open(store).scrub(workers=1)
    assert [(p.key, p.kind) for p in report.problems] == [(ref.key, CORRUPT_AT_REST)]
    assert report.to_json()["corrupt_at_rest"] == 1 and report.to_json()["transport_errors"] == 0
    assert main(["scrub", store.url, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["problems"][0]["kind"] == CORRUPT_AT_REST
    ver = shardlake.open(store).verify(str(src), workers=1)
    assert ver.to_json()["corrupt_at_rest"] == 1
    assert "1 corrupt at rest" in ver.failures()[0]


class FlakyHeaders(Store):
    """A local store whose first ``bad_reads`` reads from a shard's start flip a byte of the
    first tar header (the member name): only a header check can see it."""

    bad_reads = 0

    def read_range(self, key: str, start: int, end: int) -> bytes:
        data = super().read_range(key, start, end)
        if self.bad_reads <= 0 or start != 0 or not key.endswith(".tar"):
            return data
        self.bad_reads -= 1
        return bytes([data[0] ^ (0x04 + self.bad_reads)]) + data[1:]


def test_verify_offsets_rereads_a_header_damaged_in_transit(tmp_path: Path) -> None:

    _store, _src = _root(tmp_path)
    store = FlakyHeaders(_store.url)
    # One partition at a time: the damaged reads are counted across the whole run.
    store.bad_reads = 2  # two bad reads of the first header, then a good one
    assert shardlake.open(store).verify_offsets(workers=1).ok
    store.bad_reads = 3  # every read damaged, each differently: not the shard's fault
    problems = shardlake.open(store).verify_offsets(workers=1).problems
    assert problems and {p.kind for p in problems} == {TRANSPORT}
