"""A keyset object read for the loader (issue #47): its binding from the footer, its keys as one
Arrow array checked against the content digest without a Python string a key, and anything
unusual (a key list's order, a tampered body) through the whole decode."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardlake
from shardlake.errors import ShardlakeError
from shardlake.meta.keysets import KeysetObject, load_keyset_object
from shardlake.store import open_store
from shardlake.testing import synth_corpus


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("keyset-object")
    synth_corpus(tmp / "src", 3, 6, seed=2, neighbors=2, lanes=4)
    root = str(tmp / "root")
    made = shardlake.open(root)
    made.pack(tmp / "src", tag="v1")
    made.keysets.create("even", where="member % 2 = 0")
    made.keysets.create("listed", keys=made.dataset("v1").keys()[::-2])
    return root


def _no_whole_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(self: KeysetObject, store: Any) -> Any:
        raise AssertionError("decoded as Python lists")

    monkeypatch.setattr(KeysetObject, "keyset", refused)


def test_a_sorted_keysets_keys_come_as_arrow_checked_by_its_digest(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(url)
    held = load_keyset_object(store, "even")
    assert held.head.keys == [] and held.head.version_tag == "v1"
    want = shardlake.open(url).keysets.get("even").keys
    _no_whole_decode(monkeypatch)
    assert held.key_array(store).to_pylist() == want


def test_a_key_lists_order_is_kept(url: str) -> None:
    store = open_store(url)
    want = shardlake.open(url).keysets.get("listed").keys
    assert load_keyset_object(store, "listed").key_array(store).to_pylist() == want


def test_a_body_that_does_not_match_its_digest_is_never_returned(url: str, tmp_path: Path) -> None:
    store = open_store(url)
    held = load_keyset_object(store, "even")
    table = pq.read_table(pa.BufferReader(held.data))
    keys = table.column("key").to_pylist()
    keys[0] = keys[0] + "x"  # still ascending, still plain: only the digest tells
    tampered = table.set_column(0, "key", pa.array(keys, pa.string()))
    sink = io.BytesIO()
    pq.write_table(tampered.replace_schema_metadata(table.schema.metadata), sink)
    forged = KeysetObject(held.head, sink.getvalue(), "0" * 64, held.where)
    with pytest.raises(ShardlakeError):
        forged.key_array(store)
