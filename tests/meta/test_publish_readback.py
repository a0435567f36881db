"""Publishing records each new manifest's digest from the bytes stored, never from one read a
flipped byte in transit damaged: a damaged manifest can still parse, and a version recording
its digest would refuse its own manifest (the fault-proxy suite's seed 2, checksums off)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import shardlake
from shardlake.errors import FormatError
from shardlake.format.manifest import entry_mismatches, parse_manifest
from shardlake.store import open_store
from shardlake.store.layers import Request
from shardlake.testing import synth_corpus

PACK = {"workers": 1, "executor": "inline"}


class FlipManifestReads:
    """A store layer: the first ``times`` whole reads of each manifest come back with the byte
    at ``offset`` flipped (a reply damaged in transit); ``vary``: differently each time."""

    def __init__(self, offset: int, times: int = 1, vary: bool = False) -> None:
        self.offset, self.times, self.vary = offset, times, vary
        self.flipped: dict[str, int] = {}

    def __call__(self, request: Request, send: Callable[[], Any]) -> Any:
        result = send()
        name = request.key.rsplit("/", 1)[-1]
        if request.op == "read" and name.startswith("manifest-"):
            done = self.flipped.get(request.key, 0)
            if done < self.times:
                self.flipped[request.key] = done + 1
                data = bytearray(result)
                data[self.offset] ^= (done % 255 + 1) if self.vary else 0x01
                return bytes(data)
        return result


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("readback") / "src"
    synth_corpus(src, 1, 4, seed=5, neighbors=2, lanes=4)
    return src


def parsing_offset(root: Path) -> int:
    """An offset whose flipped byte leaves the manifest parsing and matching its entry."""
    ds = shardlake.open(str(root)).dataset()
    (entry,) = ds.entries
    data = open_store(str(root)).read(entry.manifest)
    for offset in range(len(data) // 2, len(data)):
        damaged = bytearray(data)
        damaged[offset] ^= 0x01
        try:
            table, meta = parse_manifest(bytes(damaged), "damaged")
        except FormatError:
            continue
        if not entry_mismatches(entry, table, meta):
            return offset
    raise AssertionError("no offset leaves the manifest parsing")


def test_a_manifest_read_back_damaged_in_transit_is_not_recorded(
    source: Path, tmp_path: Path
) -> None:
    offset = parsing_offset_for(source, tmp_path / "probe")
    url = str(tmp_path / "root")
    layer = FlipManifestReads(offset)
    faulty = open_store(url).with_layers(layer)
    shardlake.open(faulty).pack(str(source), tag="v1", **PACK)
    assert layer.flipped, "the publish never read its manifest back"
    report = shardlake.open(url).verify(str(source), version="v1", workers=1)
    assert report.ok, report.failures()
    assert shardlake.open(url).scrub("v1", workers=1).ok


def test_reads_that_never_agree_publish_nothing(source: Path, tmp_path: Path) -> None:
    offset = parsing_offset_for(source, tmp_path / "probe")
    url = str(tmp_path / "root")
    layer = FlipManifestReads(offset, times=1_000, vary=True)  # each read damaged differently
    with pytest.raises(FormatError, match="read back differently every time"):
        shardlake.open(open_store(url).with_layers(layer)).pack(str(source), tag="v1", **PACK)
    assert shardlake.open(url).versions() == []


def parsing_offset_for(source: Path, probe: Path) -> int:
    shardlake.open(str(probe)).pack(str(source), tag="v0", **PACK)
    return parsing_offset(probe)
