"""The layer order of docs/architecture.md: no import circle but the one Dataset.to_torch closes,
and no module over 600 lines.

import-linter (run by scripts/test.sh) checks that no layer imports a higher one; this test checks
what it does not: circles between modules, counting lazy imports inside functions too.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "shardlake"
# Dataset.to_torch imports the loader when called; the loader reads the Dataset it was given.
KNOWN_CIRCLE = {
    "shardlake.query.dataset",
    "shardlake.torch",
    "shardlake.torch.dataset",
    "shardlake.torch.sources",
    "shardlake.torch.splits",
}
LOOSE_ALLOWED = {"__init__.py", "root.py", "errors.py"}


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(n) for n in ast.walk(node))
    return inside


def _graph() -> dict[str, set[str]]:
    paths = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in paths.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_nodes(tree)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(tree):
            if id(node) in skip or not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found = sub if sub in paths else target
                if found in paths and found != name:
                    graph[name].add(found)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_but_the_one_to_torch_closes() -> None:
    assert _circles(_graph()) == [KNOWN_CIRCLE]


# No hub modules (issue #45): a module past this many lines is split by concept.
MAX_MODULE_LINES = 600


def test_no_module_over_600_lines() -> None:
    long = {
        _module(path): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_loose_domain_modules_at_the_top() -> None:
    loose = {p.name for p in PACKAGE.glob("*.py")}
    assert loose <= LOOSE_ALLOWED, loose - LOOSE_ALLOWED


# Storage options enter once (issue #30): the facade (root.py, torch/, cli/) opens stores; the
# operations below it take an opened store. (``url`` parameters there name a place in messages.)
BELOW_THE_FACADE = ("format", "lifecycle", "meta", "pack", "query", "read", "source")
OPENING_PARAMETERS = {"storage_options", "src_options", "dest_options", "dest_storage_options"}


def _nodes_below_the_facade() -> Iterator[tuple[Path, ast.AST]]:
    """Every syntax node of every module in the layers below the facade, with its file."""
    for layer in BELOW_THE_FACADE:
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                yield path, node


def test_no_operation_below_the_facade_takes_storage_options() -> None:
    found = []
    for path, node in _nodes_below_the_facade():
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
            if args.kwarg is not None:
                names.add(args.kwarg.arg)
            for name in sorted(names & OPENING_PARAMETERS):
                found.append(f"{_module(path)}.{node.name}({name})")
    assert found == []


# What turns a URL into requests: the store layer's openers and fsspec's.
OPENERS = {"open_store", "url_to_fs", "filesystem", "Store", "make_backend"}


def _called_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _takes_a_url_to_open(arg: ast.arg) -> bool:
    """A ``url`` / ``*_url`` parameter that may be a store to open (``str | Store``); one
    annotated ``str`` names a place in messages."""
    named_url = arg.arg == "url" or arg.arg.endswith("_url")
    return named_url and arg.annotation is not None and "Store" in ast.unparse(arg.annotation)


def test_no_operation_below_the_facade_opens_a_store() -> None:
    found = []
    for path, node in _nodes_below_the_facade():
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            modules.append(getattr(node, "module", None) or "")
            if any(m.split(".")[0] == "fsspec" for m in modules):
                found.append(f"{_module(path)}:{node.lineno} imports fsspec")
        elif isinstance(node, ast.Call) and _called_name(node) in OPENERS:
            found.append(f"{_module(path)}:{node.lineno} calls {_called_name(node)}")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if _takes_a_url_to_open(arg):
                    found.append(f"{_module(path)}.{node.name}({arg.arg})")
    assert found == []
