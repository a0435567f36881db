"""The sandboxed selection engine: one SQL boolean expression over manifest rows.

``--where`` strings come from users, config files and keyset recipes, so they are evaluated in a
DuckDB connection that can see nothing but the manifest table handed in:

* ``enable_external_access=false`` - no file, URL, extension or environment access;
* ``python_enable_replacements=false`` - Python variables in scope are not tables;
* ``lock_configuration=true`` - the expression cannot switch any of that back on;
* the expression is tokenised first: ``;`` (a second statement), comments and unbalanced
  parentheses (which could close the wrapper and append clauses) are refused before DuckDB runs;
* a timer interrupts runaway expressions (cross joins in subqueries).

Every failure - parser, binder, permission, type or timeout - becomes a one-line
:class:`~shardlake.errors.SelectionError`. The result keeps the input's Arrow types exactly,
because DuckDB only computes a boolean mask and pyarrow does the filtering.
"""

from __future__ import annotations

import difflib
import re
import threading
from collections.abc import Sequence
from typing import cast

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import SelectionError
from ..progress.bar import plural

__all__ = [
    "check_where",
    "referenced_names",
    "select",
    "select_mask",
]

VIEW = "manifest"
DEFAULT_TIMEOUT_S = 300.0
_MASK = "__shardlake_selected"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def check_expression_syntax(where: str) -> str:
    """Tokenise ``where`` and refuse what could escape a single parenthesised expression.

    Returns the stripped expression. Does not check column names (see :func:`check_where`).
    """
    if not isinstance(where, str):
        raise SelectionError(f"selection must be a string, got {type(where).__name__}")
    expr = where.strip()
    if not expr:
        raise SelectionError("empty selection expression")
    if "\x00" in expr:
        raise SelectionError("selection expression contains a NUL byte")
    try:
        tokens = duckdb.tokenize(expr)
    except Exception as exc:  # noqa: BLE001 - the tokenizer raises assorted types
        raise SelectionError(f"selection {where!r} does not parse: {_one_line(exc)}") from exc
    depth = 0
    for i, (pos, kind) in enumerate(tokens):
        end = tokens[i + 1][0] if i + 1 < len(tokens) else len(expr)
        text = expr[pos:end].strip()
        if kind == duckdb.token_type.comment:
            raise SelectionError(f"selection {where!r}: SQL comments are not allowed")
        if kind != duckdb.token_type.operator:
            continue
        # An operator token may run into the next token's leading text; inspect each char.
        for ch in text:
            if ch == ";":
                raise SelectionError(
                    f"selection {where!r}: ';' is not allowed - give one boolean expression, "
                    "not statements"
                )
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth < 0:
                    raise SelectionError(f"selection {where!r}: unbalanced ')'")
    if depth != 0:
        raise SelectionError(f"selection {where!r}: unbalanced '('")
    return expr


def referenced_names(where: str) -> list[str] | None:
    """The names ``where`` may read as columns (each as written and lower-cased: DuckDB matches
    names without case), or None when it may read others than it names (``*``, ``COLUMNS``,
    the row ``manifest`` itself): what a caller must decode to evaluate it. A name missed
    (e.g. another case) fails to bind, never selects other rows."""
    expr = check_expression_syntax(where)
    tokens = duckdb.tokenize(expr)
    names: list[str] = []
    words = (duckdb.token_type.identifier, duckdb.token_type.keyword)
    for i, (pos, kind) in enumerate(tokens):
        text = expr[pos : tokens[i + 1][0] if i + 1 < len(tokens) else len(expr)].strip()
        if kind == duckdb.token_type.operator and "*" in text:
            return None
        if kind not in words:
            continue
        if len(text) > 1 and text[0] == text[-1] == '"':
            text = text[1:-1].replace('""', '"')
        if text.lower() in (VIEW, "columns"):
            return None
        names += [text, text.lower()]
    return list(dict.fromkeys(names))


def _connect(threads: int) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(
        ":memory:",
        config={
            "enable_external_access": False,
            "python_enable_replacements": False,
            "autoload_known_extensions": False,
            "autoinstall_known_extensions": False,
            "allow_community_extensions": False,
            "threads": max(1, threads),
            "preserve_insertion_order": True,
            "lock_configuration": True,
        },
    )


def select_mask(
    table: pa.Table,
    where: str,
    *,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    threads: int = 2,
) -> pa.BooleanArray:
    """A boolean mask (NULL counts as false) of the rows of ``table`` that satisfy ``where``.

    ``table`` is visible to the expression as the view ``manifest`` (for subqueries such as
    ``key IN (SELECT key FROM manifest WHERE ...)``); its columns are referenced by name, with
    double quotes for names containing dots (``"skipping_info.label" = 3``).
    """
    expr = check_expression_syntax(where)
    result = _run_with_timeout(
        table, f'SELECT ({expr}) AS "{_MASK}" FROM "{VIEW}"', where, timeout, threads
    )
    return _as_mask(result, table.num_rows, where)


def _run_with_timeout(
    table: pa.Table, query: str, where: str, timeout: float | None, threads: int
) -> pa.Table:
    """``query`` over ``table`` (as the view ``manifest``) in a sandboxed connection, interrupted
    after ``timeout`` seconds; DuckDB's errors become :class:`SelectionError` naming ``where``."""
    con = _connect(threads)
    timer: threading.Timer | None = None
    timed_out = threading.Event()
    try:
        con.register(VIEW, table)

        def _interrupt() -> None:
            timed_out.set()
            con.interrupt()

        if timeout is not None:
            timer = threading.Timer(timeout, _interrupt)
            timer.daemon = True
            timer.start()
        try:
            return con.sql(query).to_arrow_table()
        except duckdb.PermissionException as exc:
            raise SelectionError(
                f"selection {where!r} tries to reach outside the manifest (file and network "
                f"access are disabled): {_one_line(exc)}"
            ) from exc
        except duckdb.InterruptException as exc:
            if timed_out.is_set():
                raise SelectionError(
                    f"selection {where!r} did not finish within {timeout:g} s"
                ) from exc
            raise SelectionError(f"selection {where!r} was interrupted") from exc
        except duckdb.ParserException as exc:
            raise SelectionError(_syntax_message(where)) from exc
        except duckdb.BinderException as exc:
            raise SelectionError(_binder_message(where, exc, table.column_names)) from exc
        except duckdb.Error as exc:
            raise SelectionError(f"invalid selection {where!r}: {_one_line(exc)}") from exc
    finally:
        if timer is not None:
            timer.cancel()
        con.close()


_NEAR = re.compile(r'syntax error at or near "(.*)"')
_CARET = re.compile(r"^(LINE 1: )(.*)\n( *)\^", re.MULTILINE)


def _syntax_message(where: str) -> str:
    """A parser error in the user's terms: the query shardlake wraps around ``where`` must not
    show (a ``)`` or ``AS`` the user never typed), so the clause is parsed again on its own
    (parsed only, never run) and the error quotes what they wrote."""
    expr = where.strip()
    prefix = "SELECT "
    con = duckdb.connect(":memory:")
    try:
        con.extract_statements(prefix + expr)
    except duckdb.ParserException as exc:
        text = str(exc)
    else:  # valid alone, yet not inside the wrapper
        return f"invalid selection {where!r}: not one boolean expression"
    finally:
        con.close()
    detail = _one_line(Exception(text.removeprefix("Parser Error: ")))
    near = _NEAR.search(detail)
    caret = _CARET.search(text)
    offset = -1
    if caret and caret.group(2).startswith(prefix):
        offset = len(caret.group(3)) - len(caret.group(1)) - len(prefix)
    at = f" (character {offset + 1})" if 0 <= offset < len(expr) else ""
    if near:
        return f"invalid selection {where!r}: syntax error at {near.group(1)!r}{at}"
    if "end of input" in detail:
        return f"invalid selection {where!r}: the expression is incomplete"
    return f"invalid selection {where!r}: {detail}{at}"


_MISSING_COLUMN = re.compile(r'Referenced column "([^"]+)" not found')
_MISSING_TABLE = re.compile(r'Referenced table "([^"]+)" not found')
COLUMNS_SHOWN = 40


def _binder_message(where: str, exc: BaseException, columns: Sequence[str]) -> str:
    """A missing column in the user's terms: its name, the valid columns, how to quote dots."""
    text = str(exc)
    valid = [c for c in columns if c != _MASK]
    shown = ", ".join(valid[:COLUMNS_SHOWN]) + (", ..." if len(valid) > COLUMNS_SHOWN else "")
    quoting = 'write a name with a dot in double quotes, e.g. "skipping_info.label" = 3'
    table = _MISSING_TABLE.search(text)
    if table:
        # `a.b` unquoted reads as column b of a table a: the user meant the dotted column.
        prefix = table.group(1)
        typed = re.search(rf"(?<![\w\"]){re.escape(prefix)}\.\w+", where)
        dotted = [c for c in valid if c.startswith(prefix + ".")]
        example = f'"{typed.group(0) if typed else (dotted or ["skipping_info.label"])[0]}"'
        return (
            f"selection {where!r}: {table.group(1)}.… is read as a table; write a column name "
            f"with a dot in double quotes, e.g. {example}; columns: {shown}"
        )
    column = _MISSING_COLUMN.search(text)
    if column:
        name = column.group(1)
        close = [c for c in valid if c.endswith("." + name)] or difflib.get_close_matches(
            name, valid, n=1
        )
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"selection {where!r}: no column {name!r}{hint}; columns: {shown}; {quoting}"
    return f"invalid selection {where!r}: {_one_line(exc)}"


def _as_mask(result: pa.Table, rows: int, where: str) -> pa.BooleanArray:
    """The one boolean column of ``result`` as a mask of ``rows`` rows (NULL: false)."""
    if result.num_columns != 1 or result.num_rows != rows:
        raise SelectionError(
            f"selection {where!r} must be one per-row boolean expression "
            f"(got {plural(result.num_columns, 'column')}, {plural(result.num_rows, 'row')} for {rows})"
        )
    column = result.column(0)
    if pa.types.is_null(column.type):
        return pa.array([False] * rows, type=pa.bool_())
    if not pa.types.is_boolean(column.type):
        raise SelectionError(
            f"selection {where!r} is not a boolean expression (it yields {column.type})"
        )
    mask = pc.fill_null(column.combine_chunks(), False)
    return cast(pa.BooleanArray, mask)


def _check_columns(table: pa.Table, columns: Sequence[str]) -> list[str]:
    names = list(columns)
    valid = table.column_names
    missing = [c for c in names if c not in valid]
    if missing:
        named = []
        for name in missing:
            close = difflib.get_close_matches(name, valid, n=1)
            named.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        shown = ", ".join(valid[:COLUMNS_SHOWN]) + (", ..." if len(valid) > COLUMNS_SHOWN else "")
        raise SelectionError(f"unknown column(s) {', '.join(named)}; columns: {shown}")
    return names


def select(
    table: pa.Table,
    where: str | None,
    columns: Sequence[str] | None = None,
    *,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    threads: int = 2,
) -> pa.Table:
    """The rows of ``table`` that satisfy ``where`` (all rows for ``None``/blank), in input order.

    ``columns`` projects the result (names are checked; no SQL is built from them). The column
    types of the result are exactly the input's.
    """
    if columns is not None:
        _check_columns(table, columns)
    if where is not None and where.strip():
        table = table.filter(select_mask(table, where, timeout=timeout, threads=threads))
    if columns is not None:
        table = table.select(list(columns))
    return table


def check_where(where: str, schema: pa.Schema) -> None:
    """Raise :class:`SelectionError` now if ``where`` cannot be evaluated over ``schema``.

    Evaluates the expression over an empty table, so parser, binder and type errors surface
    before any data is read (the loader calls this when it is constructed).
    """
    select_mask(schema.empty_table(), where)
