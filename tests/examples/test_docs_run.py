"""The docs run: every ``shardlake`` line of the ```bash blocks of README.md and
docs/getting-started.md runs, in order, on a synthetic corpus, so a documented command cannot
silently stop working.

Paths and URLs of the docs are replaced by local temporary ones (``SUBST``). Lines that need the
network, a GPU-sized training run or a fresh virtualenv are skipped explicitly (``SKIP``, with why);
what they run is covered by their own tests (test_train_example.py, test_demo.py, test_bench_cli.py).
"""

import contextlib
import json
import re
import shlex
from pathlib import Path

import pytest

from shardlake.cli.main import main
from shardlake.testing.http_server import static_http_server

REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/getting-started.md")

SKIP = {
    "bash scripts/": "creates a virtualenv (network); test_demo.py runs the demo itself",
    "python examples/train_ddp.py": "a multi-process training run; see test_train_example.py",
    "shardlake compare-runs": "needs the two training runs above",
    "shardlake bench": "a benchmark (minutes); test_bench_cli.py runs it on a tiny corpus",
    "shardlake forget": "erases samples for good; tests/lifecycle/test_forget.py and the contract "
    "suite run it and its --check",
}


def shell_lines(text: str) -> list[str]:
    """The commands of the ```bash blocks: continuations joined, comments dropped."""
    lines: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = block.replace("\\\n", " ")
        lines += [ln.strip() for ln in joined.splitlines() if ln.strip()]
    return lines


def _argv(line: str, subst: dict[str, str]) -> list[str]:
    words = shlex.split(line, comments=True)
    return [subst.get(w, w) for w in words]


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    base = tmp_path_factory.mktemp("docs_run")
    frames = base / "frames"
    main(
        [
            "synth",
            str(frames),
            "--layout",
            "converter",
            "--partitions",
            "4",
            "--samples",
            "3",
            "--neighbors",
            "2",
            "--lanes",
            "4",
            "--quiet",
        ][:-1]
    )
    npz = sorted(str(p) for p in frames.rglob("*.npz") if "/train/" in str(p))
    (base / "train.json").write_text(json.dumps(npz))
    return base


@pytest.mark.parametrize("doc", DOCS)
def test_documented_commands_run(doc, place, capsys, monkeypatch, tmp_path):
    with contextlib.ExitStack() as stack:
        _run_documented(doc, place, capsys, monkeypatch, tmp_path, stack)


def _run_documented(doc, place, capsys, monkeypatch, tmp_path, stack):
    monkeypatch.chdir(tmp_path)
    root = str(tmp_path / "driving")
    subst = {
        "/data/frames": str(place / "frames"),
        "/datasets/driving": root,
        "s3://bucket/driving": root,
        "/data/lists/train.json": str(place / "train.json"),
        "train.json": str(place / "train.json"),
        "s3://bucket/scratch": str(tmp_path / "scratch"),
        # The cluster's scheduler of the docs: test_lifecycle_dask.py runs a real one.
        "dask://sched:8786": "thread",
        # The Ray cluster of the docs: tests/ray/test_ray.py runs the executor on a real one.
        "ray://head:10001": "thread",
    }
    # The documented web server: the root itself, served on loopback.
    server = stack.enter_context(static_http_server(tmp_path))
    subst["https://data.example.com/driving"] = f"{server.url}/driving"
    ran = 0
    for line in shell_lines((REPO / doc).read_text()):
        if any(line.startswith(prefix) for prefix in SKIP):
            continue
        assert line.startswith("shardlake "), f"{doc}: unclassified documented command: {line}"
        argv = _argv(line, subst)[1:]
        if argv[0] == "get":
            first = Path(json.loads((place / "train.json").read_text())[0])
            argv[2] = first.relative_to(place / "frames").as_posix()[: -len(".npz")]
        if argv[0] == "pack":
            argv += ["--executor", "thread"]
        code = main(argv)
        out = capsys.readouterr()
        assert code == 0, f"{doc}: `{line}` exited {code}: {out.err}"
        ran += 1
    assert ran >= 6


def test_getting_started_names_every_extra_a_user_installs() -> None:
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    wanted = set(extras) - {"docs", "test", "demo"}  # for building docs, testing, the demo
    text = (REPO / "docs/getting-started.md").read_text()
    install = text[text.index("To use shardlake in your own environment") :].split("\n\n")[0]
    assert {
        e for e in wanted if f"`{e}`" not in install and e not in ("s3", "gcs", "torch")
    } == set()
    assert "dask" in install and "write_bag" in install
