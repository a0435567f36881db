"""Integrity on every metadata read (#11 finding 4): commit records, version documents and
keysets are checked before use; a byte flipped in transit costs a re-read, a byte flipped at
rest is refused naming the object - never used. export copies only verified bytes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.lifecycle import pack_small

import shardlake
from shardlake.errors import FormatError, IntegrityError
from shardlake.format.layout import ROOT_INDEX, commit_key, keyset_key, version_key
from shardlake.meta.commits import RECORD_DIGEST, read_state
from shardlake.meta.versions import load_version
from shardlake.read import CORRUPT_AT_REST, TRANSPORT
from shardlake.store import Store
from shardlake.testing import synth_corpus
from shardlake.testing.fixtures import StoreLocation


class FlipReads(Store):
    """A local store whose next ``flips`` whole-object reads of keys starting with ``prefix``
    come back with one byte changed (each bad read differently)."""

    prefix = "-"
    flips = 0

    def read(self, key: str) -> bytes:
        data = super().read(key)
        if not key.startswith(self.prefix) or self.flips <= 0 or not data:
            return data
        self.flips -= 1
        damaged = bytearray(data)
        damaged[(len(data) // 2 + self.flips) % len(data)] ^= 0x04
        return bytes(damaged)


def _root(tmp_path: Path, versions: int = 2) -> FlipReads:
    src = tmp_path / "src"
    synth_corpus(src, 2, 3, seed=7, neighbors=2, lanes=4)
    location = StoreLocation("local", str(tmp_path / "root"))
    pack_small(location, src)
    if versions > 1:
        (next(src.rglob("*.json"))).write_text(json.dumps({"speed": 3.0}))
        pack_small(location, src, tag="v2", base="v1")
    return FlipReads(location.url)


def _rewrite(store: Store, key: str, old: bytes, new: bytes) -> None:
    data = store.read(key)
    assert data.count(old) == 1, (key, old)
    store.write(key, data.replace(old, new))


@pytest.mark.parametrize("what", ["commit", "version", "keyset"])
def test_a_flip_in_transit_is_reread_away(tmp_path: Path, what: str) -> None:
    store = _root(tmp_path)
    shardlake.open(store).keysets.create("all", where="true")
    clean = (read_state(store), load_version(store).doc, shardlake.open(store).keysets.get("all"))
    store.prefix = {"commit": "commits/", "version": "versions/", "keyset": "keysets/"}[what]
    store.flips = 2  # two bad reads, then a good one
    if what == "keyset":
        assert shardlake.open(store).keysets.get("all") == clean[2]
    elif what == "commit":
        assert read_state(store) == clean[0]
    else:
        assert load_version(store).doc == clean[1]
    assert store.flips == 0


def test_commit_record_changed_at_rest_is_refused(tmp_path: Path) -> None:
    store = _root(tmp_path)
    assert b'"latest":"v2"' in store.read(commit_key(2))
    # One byte: 'latest' now names v1 - valid JSON, a valid record, silently wrong without a digest.
    _rewrite(store, commit_key(2), b'"latest":"v2"', b'"latest":"v1"')
    with pytest.raises(FormatError) as info:
        read_state(store)
    message = str(info.value)
    assert commit_key(2) in message and RECORD_DIGEST in message and CORRUPT_AT_REST in message
    with pytest.raises(FormatError, match="000000000002"):
        shardlake.open(store).dataset()


def test_commit_flipped_on_every_read_differently_is_a_transport_error(tmp_path: Path) -> None:
    store = _root(tmp_path)
    store.prefix, store.flips = "commits/", 3
    with pytest.raises(FormatError) as info:
        read_state(store)
    assert TRANSPORT in str(info.value) and "read 3 times" in str(info.value)


def test_version_document_changed_at_rest_is_refused(tmp_path: Path) -> None:
    store = _root(tmp_path)
    tag, version_hash = "v2", read_state(store).versions["v2"]
    key = version_key(tag, version_hash)
    _rewrite(store, key, b'"keep_skipped":false', b'"keep_skipped":true ')
    with pytest.raises(FormatError, match="does not match its hash") as info:
        load_version(store)
    assert key in str(info.value) and CORRUPT_AT_REST in str(info.value)


def test_keyset_changed_at_rest_is_refused(tmp_path: Path) -> None:
    store = _root(tmp_path)
    shardlake.open(store).keysets.create("all", where="true")
    key = keyset_key("all")
    table = pq.read_table(pa.BufferReader(store.read(key)))
    keys = table.column("key").to_pylist()
    keys[0] = keys[0][:-1] + ("x" if keys[0][-1] != "x" else "y")  # a key that parquet decodes
    changed = table.set_column(0, "key", pa.array(keys, pa.string()))
    sink = pa.BufferOutputStream()
    pq.write_table(changed.replace_schema_metadata(table.schema.metadata), sink)
    store.write(key, sink.getvalue().to_pybytes())
    with pytest.raises(FormatError, match="content_sha256") as info:
        shardlake.open(store).keysets.get("all")
    assert key in str(info.value)


def test_records_without_digests_still_read(tmp_path: Path) -> None:
    """Roots written before the digests (tests/data/golden) read unchecked, as before."""
    store = _root(tmp_path, versions=1)
    record = json.loads(store.read(commit_key(1)))
    del record[RECORD_DIGEST]
    store.write(commit_key(1), json.dumps(record, sort_keys=True, separators=(",", ":")).encode())
    assert read_state(store).latest == "v1"


def test_export_refuses_a_version_document_damaged_at_the_source(tmp_path: Path) -> None:
    store = _root(tmp_path)
    key = version_key("v2", read_state(store).versions["v2"])
    _rewrite(store, key, b'"keep_skipped":false', b'"keep_skipped":true ')
    dest = tmp_path / "dest"
    with pytest.raises(FormatError, match="does not match its hash"):
        shardlake.open(store).export(str(dest))
    assert not (dest / key).exists()


def test_export_rereads_metadata_flipped_in_transit(tmp_path: Path) -> None:
    store = _root(tmp_path)
    shardlake.open(store).keysets.create("all", where="true")
    for prefix in ("versions/", "keysets/", "data/", "shardlake.json"):
        store.prefix, store.flips = prefix, 1
        dest = tmp_path / f"dest-{prefix.strip('/.')}"
        report = shardlake.open(store).export(str(dest))
        assert report.committed and store.flips == 0, prefix
        copy = Store(str(dest))
        for name in copy.list(""):  # byte-identical to the source, and readable
            # The commit log and the root index (written at every commit) are the copy's own.
            if not name.startswith("commits/") and name != ROOT_INDEX:
                assert copy.read(name) == Store(store.url).read(name), name
        assert shardlake.open(copy).scrub().ok and shardlake.open(copy).verify_offsets().ok


def test_export_recopies_a_shard_whose_tar_header_arrived_damaged(tmp_path: Path) -> None:
    store = _root(tmp_path, versions=1)
    dest = Store(str(tmp_path / "dest"))
    shard = shardlake.open(store).dataset().entries[0].shards[0].key
    # A copy whose tar header was damaged on the way (payload CRCs still match): the resume
    # must not trust it.
    shardlake.open(store).export(dest)
    data = bytearray(dest.read(shard))
    data[0] ^= 0x04
    dest.write(shard, bytes(data))
    report = shardlake.open(store).export(dest)
    assert shard in report.copied and dest.read(shard) == store.read(shard)
    assert shardlake.open(dest).verify_offsets().ok


_EXPORT_SCRIPT = """
import sys, time
import shardlake
from shardlake.store import Store

class Slow(Store):
    def open_writer(self, key):
        time.sleep(0.05)
        return super().open_writer(key)

shardlake.open(sys.argv[1]).export(Slow(sys.argv[2]))
"""


def test_export_killed_mid_copy_then_rerun_completes(tmp_path: Path) -> None:
    store = _root(tmp_path)
    dest = tmp_path / "dest"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", _EXPORT_SCRIPT, store.url, str(dest)], env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(dest.rglob("shard-*.tar"))) < 2:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    copy = Store(str(dest))
    assert read_state(copy).seq == 0  # killed before the commit: nothing references the copy
    report = shardlake.open(store).export(str(dest))
    assert report.committed and report.skipped  # resumed: intact shards were kept
    assert shardlake.open(copy).scrub().ok and shardlake.open(copy).verify_offsets().ok
    assert (
        shardlake.open(copy).dataset().version.hash == shardlake.open(store).dataset().version.hash
    )


def test_export_refuses_a_payload_damaged_at_the_source(tmp_path: Path) -> None:
    store = _root(tmp_path, versions=1)
    ds = shardlake.open(store).dataset()
    entry = ds.entries[0]
    row = ds.manifest(entry.id).to_pylist()[0]
    shard = entry.shards[row["shard"]].key
    data = bytearray(store.read(shard))
    data[row["offset"] + 1] ^= 0x10
    store.write(shard, bytes(data))
    with pytest.raises(IntegrityError, match="source"):
        shardlake.open(store).export(str(tmp_path / "dest"))


def test_scrub_rereads_a_manifest_and_names_a_transport_error(tmp_path: Path) -> None:
    store = _root(tmp_path, versions=1)
    store.prefix, store.flips = "data/", 2  # two bad manifest reads, then a good one
    assert shardlake.open(store).scrub(workers=1).ok
    store.flips = 3  # every read of the first manifest damaged, each differently
    report = shardlake.open(store).scrub(workers=1)
    assert [p.kind for p in report.problems] == [TRANSPORT]
    assert report.to_json()["transport_errors"] == 1 and report.to_json()["corrupt_at_rest"] == 0


def test_golden_root_with_record_digests_is_checked(tmp_path: Path) -> None:
    import shutil

    golden = Path(__file__).parents[1] / "data" / "golden" / "v1-record-digests" / "root"
    shutil.copytree(golden, tmp_path / "root")
    store = Store(str(tmp_path / "root"))
    assert RECORD_DIGEST in json.loads(store.read(commit_key(2)))
    keyset = pq.read_schema(pa.BufferReader(store.read(keyset_key("turns"))))
    assert b"shardlake.content_sha256" in (keyset.metadata or {})
    assert read_state(store).latest == "v2" and shardlake.open(store).keysets.get("turns")
    _rewrite(store, commit_key(2), b'"latest":"v2"', b'"latest":"v1"')
    with pytest.raises(FormatError, match=RECORD_DIGEST):
        read_state(store)


def test_keyset_digest_fast_path_equals_canonical_json() -> None:
    """The keyset digest joins plain keys directly; it must equal the documented definition
    (sha256 of the canonical JSON body) for every key, escaped characters included."""
    import hashlib
    import random

    from shardlake.meta.keysets import content_digest
    from shardlake.meta.state import canonical_json

    rng = random.Random(1)
    alphabet = ["a", "/", "é", '"', "\\", "\x01", "\u2028", "\U0001f600", ".", "\x7f", "\t"]
    meta = {"name": "k", "recipe": '{"where": "true"}'}
    for _ in range(500):
        keys = ["".join(rng.choices(alphabet, k=rng.randint(0, 5))) for _ in range(3)]
        parts = keys[::-1]
        body = canonical_json({"keys": keys, "partitions": parts, "metadata": meta})
        assert content_digest(meta, keys, parts) == hashlib.sha256(body).hexdigest(), keys
