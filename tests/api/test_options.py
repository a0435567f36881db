"""Options objects: one definition of each operation's settings, keywords or object alike."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

import shardlake
import shardlake.torch
from shardlake import VerifyOptions
from shardlake.cli.main import main
from shardlake.errors import UnknownOptionError, UsageError


@pytest.fixture(scope="module")
def packed(packed_root: Callable[..., tuple[Path, Path]]) -> tuple[Path, str]:
    src, root = packed_root([3, 3], name="options", seed=9)
    return src, str(root)


def test_verify_takes_an_options_object_or_its_fields_as_keywords(packed: tuple[Path, str]) -> None:
    src, root = packed
    lake = shardlake.open(root)
    by_object = lake.verify(src, options=VerifyOptions(version="v1", workers=1))
    by_keywords = lake.verify(src, version="v1", workers=1)
    assert by_object.ok and by_object.to_json() == by_keywords.to_json()
    # A keyword replaces that field of the object.
    with pytest.raises(UsageError, match="allow_missing"):
        lake.verify(src, options=VerifyOptions(), allow_missing=-1)
    assert main(["verify", root, "--source", str(src), "--version", "v1", "--workers", "1"]) == 0


def test_unknown_keywords_fail_at_the_call_naming_the_nearest(packed: tuple[Path, str]) -> None:
    src, root = packed
    lake = shardlake.open(root)
    with pytest.raises(
        UsageError, match="unknown keyword 'allow_mising' \\(did you mean 'allow_missing'\\?\\)"
    ):
        lake.verify(src, allow_mising=1)
    with pytest.raises(UsageError, match="did you mean 'partition_depth'"):
        shardlake.open(root).pack(src, tag="v2", partiton_depth=1)


@pytest.mark.parametrize(
    ("cls", "typo", "field"),
    [
        (shardlake.WriteOptions, "shard_sise", "shard_size"),
        (shardlake.PackOptions, "partiton_depth", "partition_depth"),
        (shardlake.VerifyOptions, "allow_mising", "allow_missing"),
        (shardlake.OffsetsOptions, "worker", "workers"),
        (shardlake.ScrubOptions, "worker", "workers"),
        (shardlake.ExportOptions, "worker", "workers"),
        (shardlake.GcOptions, "grace_sec", "grace_s"),
        (shardlake.RemoveOptions, "partitons", "partitions"),
        (shardlake.torch.LoaderOptions, "sede", "seed"),
        (shardlake.torch.ReadOptions, "request_byte", "request_bytes"),
    ],
)
def test_every_options_class_names_the_nearest_field_when_built_directly(
    cls: type, typo: str, field: str
) -> None:
    assert field in {f.name for f in dataclasses.fields(cls)}
    # A TypeError still (what Python raises for an unknown keyword), and a shardlake error.
    for caught in (UnknownOptionError, TypeError, UsageError):
        with pytest.raises(
            caught,
            match=f"{cls.__name__}: unknown keyword {typo!r} \\(did you mean {field!r}\\?\\)",
        ):
            cls(**{typo: 1})
    assert cls() == cls()  # the right fields still build it


RUNS_TASKS = [
    shardlake.PackOptions,
    shardlake.VerifyOptions,
    shardlake.OffsetsOptions,
    shardlake.ScrubOptions,
    shardlake.ExportOptions,
    shardlake.ForgetOptions,
]


@pytest.mark.parametrize("cls", RUNS_TASKS)
def test_every_operation_that_runs_tasks_shares_run_options(cls: type) -> None:
    assert issubclass(cls, shardlake.RunOptions)
    # The same three defaults everywhere: the operation picks the count and the executor.
    assert {n: getattr(cls(), n) for n in ("workers", "executor", "progress")} == {
        "workers": None,
        "executor": None,
        "progress": None,
    }
    assert cls(workers=3, executor="inline").worker_count() == 3
    with pytest.raises(UsageError, match="workers must be >= 1"):
        cls(workers=0).worker_count()


def test_run_options_are_flat_keywords_of_the_root_methods(packed: tuple[Path, str]) -> None:
    _src, root = packed
    lake = shardlake.open(root)
    by_keywords = lake.scrub("v1", workers=2, executor="inline", progress=False)
    by_object = lake.scrub(options=shardlake.ScrubOptions(version="v1", workers=2))
    assert by_keywords.ok and by_keywords.to_json() == by_object.to_json()
    with pytest.raises(UsageError, match="workers must be >= 1"):
        lake.verify_offsets("v1", workers=0)


def test_the_writers_take_their_options_as_keywords(tmp_path: Path) -> None:
    import numpy as np

    lake = shardlake.open(str(tmp_path / "root"))
    with lake.writer("v1", shard_size=1 << 20, workers=1, progress=False) as w:
        w.write("a/k0", {"x": np.arange(3)})
    assert lake.version("v1").samples == 1
    # A misspelt setting fails at the call, before a bag or a Ray dataset is looked at.
    for call in (
        lambda: lake.writer("v2", shard_sise=1),
        lambda: lake.write_bag(None, "v2", shard_sise=1),
        lambda: lake.write_ray(None, "v2", shard_sise=1),
    ):
        with pytest.raises(UnknownOptionError, match="did you mean 'shard_size'"):
            call()
    # A keyword replaces that field of the object.
    with pytest.raises(UsageError, match="shard_size must be >= 1"):
        lake.writer("v2", options=shardlake.WriteOptions(shard_size=1 << 20), shard_size=0)


def test_every_command_builds_its_options_object(packed: tuple[Path, str]) -> None:
    # The CLI maps flags onto the options object the Root method takes: a bad value is
    # refused by that object's rule, in one line naming the flag.
    _src, root = packed
    for argv in (
        ["scrub", root, "--workers", "0"],
        ["verify-offsets", root, "--workers", "0"],
        ["verify", root, "--workers", "0"],
    ):
        assert main(argv) == 2, argv
    assert main(["scrub", root, "--workers", "1", "--executor", "inline", "--quiet"]) == 0
    assert main(["gc", root, "--dry-run", "--grace", "1h"]) == 0
