"""Backends carry their own facts (issue #45): the registry is built from what each backend
class declares, the backend modules are imported on first use, and no protocol name is spelt in
the store layer outside ``store/backends/`` (a new backend touches its own module and one
registration line, docs/architecture.md "Add a backend")."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from shardlake.store.backends import Backend, backend_class
from shardlake.store.backends.registry import BUILTIN_BACKENDS, builtin_backends, path_protocol

STORE = Path(__file__).resolve().parents[2] / "src" / "shardlake" / "store"


def _protocols() -> set[str]:
    return {p for cls in builtin_backends() for p in cls.protocols}


def _text(tree: ast.AST) -> set[int]:
    """Docstrings and the literal parts of f-strings: prose and messages, not decisions."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            found.update(id(part) for part in node.values)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def test_no_protocol_name_is_spelt_in_the_store_layer_outside_its_backends() -> None:
    """A string literal equal to a protocol a backend declares (``"s3"``, ``"gs"``, ``"file"``,
    ``"http"``...) in store/*.py is protocol knowledge outside its backend: ask the backend's
    facts (``backend_class(protocol).bucket_noun``, ``.credential_hint``...) instead. Messages
    may still quote example URLs."""
    protocols = _protocols()
    assert {"file", "memory", "s3", "gs", "az", "http", "https"} <= protocols
    spelt: list[str] = []
    for path in sorted(STORE.glob("*.py")):
        tree = ast.parse(path.read_text())
        skip = _text(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in skip
                and node.value.lower() in protocols
            ):
                spelt.append(f"{path.name}:{node.lineno}: {node.value!r}")
    assert spelt == []


def test_the_registry_is_built_from_what_each_backend_declares() -> None:
    classes = builtin_backends()
    assert len(classes) == len(BUILTIN_BACKENDS)
    seen: dict[str, type[Backend]] = {}
    for cls in classes:
        assert cls.protocols, cls
        for protocol in cls.protocols:
            assert protocol not in seen, (protocol, cls, seen.get(protocol))
            seen[protocol] = cls
            assert backend_class(protocol) is cls
    assert path_protocol() == "file"
    assert backend_class("no-such-protocol") is Backend  # fsspec's generic backend
    # Buckets and obstore reads are facts of the object stores alone.
    for protocol, cls in seen.items():
        assert (cls.bucket_noun is not None) == (
            protocol in {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"}
        )
        assert (cls.fsspec_client is not None) == (cls.bucket_noun is not None)


def test_backend_modules_are_imported_on_first_use() -> None:
    code = (
        "import sys\n"
        "from shardlake.store import Store, open_store\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('shardlake.store.backends.'))\n"
        "assert 'shardlake.store.backends.s3' not in loaded, loaded\n"
        "assert 'shardlake.store.backends.azure' not in loaded, loaded\n"
        "open_store('memory://first-use')\n"
        "assert 'shardlake.store.backends.s3' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_format_layer_owns_the_root_index_and_the_http_backend_only_asks() -> None:
    """format/ is pure and imports no store module; the HTTP backend lists through the
    RootListing the meta layer installs and never spells the index's name or schema."""
    from shardlake.format.layout import ROOT_INDEX
    from shardlake.format.rootindex import INDEX_SCHEMA
    from shardlake.meta.rootindex import RootIndexListing
    from shardlake.store.backends import http

    fmt = STORE.parent / "format"
    for path in sorted(fmt.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert "store" not in (node.module or "").split("."), (path.name, node.module)
    source = (STORE / "backends" / "http.py").read_text()
    assert ROOT_INDEX not in source and INDEX_SCHEMA not in source
    assert isinstance(http._listing, RootIndexListing)
    assert http._listing.index_key == ROOT_INDEX
