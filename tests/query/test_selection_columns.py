"""Selections decode only the catalog columns they read (issue #47: a keyset of 10% of 100M
samples by ``where`` read every column of the catalog, 64-character digests included), and
give the same rows and messages as over every column."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import shardlake
from shardlake.errors import SelectionError
from shardlake.meta.catalog import Catalog
from shardlake.testing import synth_corpus


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("selection-columns")
    synth_corpus(tmp / "src", 3, 8, seed=7, neighbors=2, lanes=4)
    root = str(tmp / "root")
    shardlake.open(root).pack(tmp / "src", tag="v1")
    return root


def _decoded(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The columns every catalog read decodes from now on (None: every column)."""
    seen: list[Any] = []
    real = Catalog.rows

    def spy(catalog: Catalog, columns: Any = None, pids: Any = None) -> Any:
        table = real(catalog, columns, pids)
        seen.append(None if columns is None else sorted(table.column_names))
        return table

    monkeypatch.setattr(Catalog, "rows", spy)
    return seen


def test_a_keyset_by_where_decodes_only_its_columns(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = shardlake.open(url)
    every = root.dataset("v1").query("member % 3 = 0 AND NOT is_skipped")
    decoded = _decoded(monkeypatch)
    made = root.keysets.create("thirds", where="member % 3 = 0 AND NOT is_skipped")
    assert decoded and None not in decoded
    assert set().union(*decoded) <= {"key", "partition", "member", "is_skipped"}
    monkeypatch.undo()
    assert made.keys == sorted(every.column("key").to_pylist())
    assert root.keysets.get("thirds").keys == made.keys


def test_keys_decode_only_their_columns_and_keep_their_order(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = shardlake.open(url).dataset("v1")
    keys = ds.keys()[::-2]
    decoded = _decoded(monkeypatch)
    rows = ds.select(keys=keys).rows(["key", "offset"])
    assert decoded == [["key", "offset"]]
    assert sorted(rows.column("key").to_pylist()) == sorted(keys)


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("membr < 3", "no column 'membr' \\(did you mean 'member'"),
        (
            "MEMBER < 3 AND lables = 1",
            "no column 'lables'; columns: key, partition, shard, member, offset",
        ),
    ],
)
def test_a_missed_column_is_named_as_over_every_column(url: str, where: str, message: str) -> None:
    with pytest.raises(SelectionError, match=message):
        shardlake.open(url).dataset("v1").select(where=where).rows(["key"])
