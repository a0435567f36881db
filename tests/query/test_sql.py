"""The sandboxed selection engine: correct rows, exact types, and nothing outside the table."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from shardlake.errors import SelectionError
from shardlake.query.sql import check_where, select, select_mask

SECRET_TABLE = pa.table({"s": [42]})  # a Python variable DuckDB must never see


def _table() -> pa.Table:
    return pa.table(
        {
            "key": pa.array(["log_a/f0", "log_a/f1", "log_b/f.2", "log_b/f3"], pa.string()),
            "partition": pa.array(["aaa", "aaa", "bbb", "bbb"]),
            "size": pa.array([10, 20, 30, 40], pa.int64()),
            "crc32": pa.array([1, 2, 3, 4], pa.int64()),
            "skipping_info.label": pa.array([0, 3, None, 3], pa.int32()),
            "neighbor_ids": pa.array([[1, 2], [], None, [5]], pa.list_(pa.int64())),
            "timestamp": pa.array([100, 200, 300, 400], pa.uint64()),
        }
    )


def test_selects_rows_in_order_and_keeps_types() -> None:
    table = _table()
    out = select(table, "\"skipping_info.label\" = 3 OR key LIKE 'log_b/%'")
    assert out.column("key").to_pylist() == ["log_a/f1", "log_b/f.2", "log_b/f3"]
    assert out.schema == table.schema  # uint64 / int32 / list types untouched
    # NULL is not true: row 2 has a NULL label and is excluded here.
    assert select(table, '"skipping_info.label" = 3').column("key").to_pylist() == [
        "log_a/f1",
        "log_b/f3",
    ]


def test_no_where_and_projection() -> None:
    table = _table()
    assert select(table, None).equals(table)
    assert select(table, "   ").equals(table)
    out = select(table, "size >= 30", columns=["key", "size"])
    assert out.column_names == ["key", "size"]
    assert out.column("size").to_pylist() == [30, 40]
    with pytest.raises(SelectionError, match="unknown column"):
        select(table, None, columns=["nope"])


def test_list_columns_and_subquery_over_the_manifest_view() -> None:
    table = _table()
    assert select(table, "list_contains(neighbor_ids, 5)").column("key").to_pylist() == ["log_b/f3"]
    out = select(table, "size > (SELECT avg(size) FROM manifest)")
    assert out.column("key").to_pylist() == ["log_b/f.2", "log_b/f3"]


def test_mask_null_literal_is_false() -> None:
    assert select_mask(_table(), "NULL").to_pylist() == [False] * 4


@pytest.mark.parametrize(
    ("where", "match"),
    [
        ("size > 1; DROP TABLE manifest", "';' is not allowed"),
        ("true; SELECT 1", "';' is not allowed"),
        ("size > 1 -- comment", "comments"),
        ("size > 1 /* c */", "comments"),
        ("size > 1) OR (true", "unbalanced"),
        ("(size > 1", "unbalanced"),
        ("size >", "invalid selection"),
        ("nosuchcolumn = 1", "no column .nosuchcolumn.; columns: key"),
        ("key", "not a boolean"),
        ("size + 1", "not a boolean"),
        ("count(*) > 0", "invalid selection|per-row"),
        ("", "empty"),
    ],
)
def test_bad_expressions_are_one_line_selection_errors(where: str, match: str) -> None:
    with pytest.raises(SelectionError, match=match) as info:
        select(_table(), where) if where else select_mask(_table(), where)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "where",
    [
        "(SELECT count(*) FROM read_csv('/etc/passwd')) > 0",
        "(SELECT count(*) FROM read_parquet('/etc/hostname')) > 0",
        "(SELECT count(*) FROM '/etc/passwd') > 0",
        "(SELECT count(*) FROM glob('/etc/*')) > 0",
        "(SELECT count(*) FROM read_text('http://127.0.0.1:1/x')) > 0",
        "(SELECT count(*) FROM SECRET_TABLE) > 0",  # a Python variable in scope
        "getenv('HOME') IS NOT NULL",
    ],
)
def test_expressions_cannot_reach_files_network_or_python(where: str, tmp_path) -> None:
    with pytest.raises(SelectionError) as info:
        select(_table(), where)
    assert "\n" not in str(info.value)


def test_configuration_cannot_be_unlocked() -> None:
    # Even if a SET slipped into an expression, the locked configuration refuses it; and a
    # statement cannot appear inside an expression at all.
    with pytest.raises(SelectionError):
        select(_table(), "(SET enable_external_access = true) IS NULL")


def test_timeout_interrupts_runaway_expressions() -> None:
    big = pa.table({"x": pa.array(range(3000), pa.int64())})
    start = time.monotonic()
    with pytest.raises(SelectionError, match="did not finish"):
        select(big, "(SELECT count(*) FROM manifest a, manifest b, manifest c) > 0", timeout=0.5)
    assert time.monotonic() - start < 10


def test_check_where_validates_against_schema_without_data() -> None:
    schema = _table().schema
    check_where('"skipping_info.label" IN (1, 3)', schema)
    with pytest.raises(
        SelectionError, match="no column 'label' \\(did you mean 'skipping_info.label'"
    ):
        check_where("label = 3", schema)
