"""Every publisher checks each fact once, in the same words: the tag's name, the tag free, the
root state read once before the work (the commit checks the state it builds on again)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.pack import KeyLog, make_source, small_frame

import shardlake
from shardlake.cli.main import main
from shardlake.errors import ConflictError, UsageError


def _tar(path: Path) -> Path:
    """A one-sample WebDataset tar."""
    with tarfile.open(path, "w") as tar:
        data = b"3"
        info = tarfile.TarInfo("000000.cls")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def setup(tmp_path: Path) -> tuple[shardlake.Root, Path, Path]:
    src = tmp_path / "src"
    make_source(src, {f"{p}/f{i}": small_frame(i) for p in "ab" for i in range(2)})
    root = shardlake.open(str(tmp_path / "root"))
    root.pack(src, tag="v1", executor="inline")
    return root, src, _tar(tmp_path / "train-000000.tar")


def _publishers(root: shardlake.Root, src: Path, tar: Path) -> dict[str, Callable[[str], object]]:
    def write(tag: str) -> None:
        with root.writer(tag, base="v1") as w:
            w.write("a/x", {"x": np.zeros(2, np.float32)})

    return {
        "pack": lambda tag: root.pack(src, tag=tag, base="v1", executor="inline"),
        "writer": write,
        "remove": lambda tag: root.remove(tag, partitions=["a"]),
        "import-wds": lambda tag: root.import_wds([str(tar)], tag),
    }


def _refusals(
    publishers: dict[str, Callable[[str], object]], tag: str, error: type[Exception]
) -> dict[str, str]:
    texts = {}
    for name, publish in publishers.items():
        with pytest.raises(error) as refused:
            publish(tag)
        texts[name] = str(refused.value)
    return texts


def test_a_bad_or_taken_tag_is_refused_in_the_same_words_by_every_publisher(setup: Any) -> None:
    root, src, tar = setup
    publishers = _publishers(root, src, tar)
    bad = _refusals(publishers, "no spaces", UsageError)
    assert len(set(bad.values())) == 1, bad
    assert "invalid tag 'no spaces'" in bad["pack"]
    taken = _refusals(publishers, "v1", ConflictError)
    assert len(set(taken.values())) == 1, taken
    assert "version tag 'v1' already exists; tags are never reused" in taken["pack"]
    assert [v.tag for v in root.versions()] == ["v1"]  # nothing was published


@pytest.mark.parametrize(("tag", "code"), [("no spaces", 2), ("v1", 1)])
def test_the_cli_publishers_print_the_same_one_line(
    setup: Any, tag: str, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    root, src, tar = setup
    url = root.store.url
    commands = {
        "pack": ["pack", str(src), url, "--executor", "inline", "--quiet"],
        "remove": ["remove", url, "--partition", "a"],
        "import-wds": ["import-wds", str(tar), url],
    }
    lines = {}
    for name, argv in commands.items():
        assert main([*argv, "--tag", tag]) == code, name
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"shardlake {name}: error: ") and "\n" not in err, err
        lines[name] = err.split(": error: ", 1)[1]
    assert len(set(lines.values())) == 1, lines


def test_each_publisher_reads_the_root_state_once(setup: Any) -> None:
    root, src, tar = setup
    log = KeyLog()
    counted = shardlake.open(root.store.with_layers(log))
    publishers = _publishers(counted, src, tar)
    seen = {}
    for i, (name, publish) in enumerate(publishers.items()):
        log.calls.clear()
        publish(f"v{i + 2}")
        seen[name] = log.state_reads()
        # The commit's one freshness check: does the next commit exist already?
        assert sum(n for (op, _k), n in log.calls.items() if op == "exists") == 1, name
    # Once each (before: the marker, the listing and the record twice each for pack and the
    # writers; the listing and the record twice for remove).
    assert seen == {name: {"marker": 1, "list_commits": 1, "read_commits": 1} for name in seen}


def test_the_commit_checks_the_state_it_builds_on(setup: Any) -> None:
    root, _src, _tar = setup
    # Another version committed while this writer ran: retried on the new state, published.
    with root.writer("w1", base="v1") as w:
        w.write("a/x", {"x": np.zeros(2, np.float32)})
        with root.writer("other") as other:
            other.write("c/x", {"x": np.ones(2, np.float32)})
    assert [v.tag for v in root.versions()] == ["v1", "other", "w1"]
    # The base pruned while this writer ran: refused at the commit, nothing published.
    with pytest.raises(ConflictError) as refused, root.writer("w2", base="w1") as w:
        w.write("a/y", {"x": np.zeros(2, np.float32)})
        root.prune(["w1"], force=True)
    assert "base version 'w1' was pruned while this write ran" in str(refused.value)
    assert [v.tag for v in root.versions()] == ["v1", "other"]
