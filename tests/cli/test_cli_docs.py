"""docs/cli.md is generated from the parser; it must not drift from it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from shardlake.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location(
        "gen_cli_docs", REPO / "scripts" / "gen_cli_docs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_md_matches_the_parser():
    expected = _generator().render()
    current = (REPO / "docs" / "cli.md").read_text()
    assert current == expected, (
        "docs/cli.md drifted from the parser: run .venv/bin/python scripts/gen_cli_docs.py"
    )


def test_every_command_and_flag_is_documented():
    text = (REPO / "docs" / "cli.md").read_text()
    parser = build_parser()
    sub = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    for name, child in sub.choices.items():
        assert f"## `shardlake {name}`" in text, name
        for action in child._actions:
            for opt in action.option_strings:
                if opt.startswith("--") and opt != "--help":
                    assert f"`{opt}" in text, (name, opt)


def test_render_detects_a_new_flag(monkeypatch):
    gen = _generator()
    import shardlake.cli.main as cli_main

    original = cli_main.build_parser

    def patched():
        parser = original()
        parser.add_argument("--brand-new-flag", help="added after the docs were generated")
        return parser

    monkeypatch.setattr(cli_main, "build_parser", patched)
    assert "--brand-new-flag" in gen.render()
    assert gen.render() != (REPO / "docs" / "cli.md").read_text()
