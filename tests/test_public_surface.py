"""The public surface (issue #30): every module names what it exports in ``__all__``.

A module's ``__all__`` lists the names other modules, tests, benchmarks and examples take from it;
a name missing there is used only inside its module. The library itself takes from another module
only what that module exports (a private ``_name`` included: it is listed where it is shared), and
the API reference (docs/api) publishes only exported names, rendered with mkdocstrings' ``public``
filter (a module page shows its ``__all__``).
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "shardlake"
CALLERS = ("tests", "benchmarks", "examples", "conformance")


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _exports(path: Path) -> list[str] | None:
    """The literal ``__all__`` of the module at ``path`` (None without one)."""
    for node in ast.parse(path.read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "__all__":
            assert isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
            return list(ast.literal_eval(node.value))
    return None


EXPORTS = {name: _exports(path) for name, path in MODULES.items()}


def _taken(path: Path) -> Iterator[tuple[int, str, str]]:
    """``(line, module, name)`` for each name the file takes from a shardlake module: imported
    (``from m import name``) or read off an imported module (``m.name``). A submodule is not a
    name of its package (``from shardlake import store`` takes the module)."""
    tree = ast.parse(path.read_text())
    inside = path.is_relative_to(PACKAGE)
    own = _module(path) if inside else None
    package = (own if path.name == "__init__.py" else own.rsplit(".", 1)[0]) if own else ""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source not in MODULES:
                continue
            for alias in node.names:
                if f"{source}.{alias.name}" in MODULES:
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
                else:
                    yield node.lineno, source, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    aliases[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else "shardlake"
                    )
    if not inside:
        return  # tests reach into modules on purpose (monkeypatch): only their imports count
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain: list[str] = []
        value: ast.expr = node
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if not isinstance(value, ast.Name) or value.id not in aliases:
            continue
        source = aliases[value.id]
        for attr in reversed(chain):
            if f"{source}.{attr}" in MODULES:
                source = f"{source}.{attr}"
                continue
            if source != own:
                yield node.lineno, source, attr
            break


def test_every_module_has_all() -> None:
    assert [name for name, exports in EXPORTS.items() if exports is None] == []


def test_every_exported_name_exists_once() -> None:
    missing, repeated = [], []
    for name, exports in EXPORTS.items():
        module = importlib.import_module(name)
        missing += [f"{name}.{n}" for n in exports or () if not hasattr(module, n)]
        repeated += [f"{name}.{n}" for n in set(exports or ()) if (exports or []).count(n) > 1]
    assert missing == []
    assert repeated == []


def test_the_library_takes_only_exported_names() -> None:
    found = set()
    for path in MODULES.values():
        for line, source, name in _taken(path):
            if name not in (EXPORTS[source] or ()):
                found.add(f"{path.relative_to(REPO)}:{line}: {source}.{name}")
    assert sorted(found) == []


def test_tests_benchmarks_and_examples_import_only_exported_names() -> None:
    # Tests may import a private `_name` to test it; a public one they import is exported.
    found = []
    for folder in CALLERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            for line, source, name in _taken(path):
                if not name.startswith("_") and name not in (EXPORTS[source] or ()):
                    found.append(f"{path.relative_to(REPO)}:{line}: {source}.{name}")
    assert found == []


def _reference_targets() -> Iterator[tuple[str, str]]:
    for page in sorted((REPO / "docs" / "api").glob("*.md")):
        for match in re.finditer(r"^::: *(\S+)", page.read_text(), re.MULTILINE):
            yield page.name, match.group(1)


def test_the_api_reference_publishes_only_exported_names() -> None:
    targets = list(_reference_targets())
    assert ("index.md", "shardlake") in targets
    published = {target for _, target in targets if target in MODULES}
    wrong = []
    for page, target in targets:
        if target in MODULES:
            continue  # a module page renders its __all__ (the public filter below)
        # the longest module prefix: shardlake.Root.open is shardlake's Root
        parts = target.split(".")
        at = max(i for i in range(1, len(parts)) if ".".join(parts[:i]) in MODULES)
        module = ".".join(parts[:at])
        if module not in published or parts[at] not in (EXPORTS[module] or ()):
            wrong.append(f"{page}: {target}")
    assert wrong == []
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    (handler,) = [p["mkdocstrings"] for p in config["plugins"] if isinstance(p, dict)]
    assert handler["handlers"]["python"]["options"]["filters"] == "public"
