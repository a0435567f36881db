"""Bad input: each a clear error naming the file, and nothing published."""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from support.pack import make_source, small_frame

import shardlake
from shardlake import Store, open_store
from shardlake.cli.main import main
from shardlake.errors import (
    ConflictError,
    PackWorkerError,
    ShardlakeError,
    SourceError,
    VersionNotFoundError,
)


def _published(store: Store) -> tuple[list[str], list[shardlake.Version]]:
    """What the root has published: its commit log and its versions."""
    return store.list("commits/"), shardlake.open(store).versions()


def _good(root: Path) -> Path:
    return make_source(
        root,
        {"log/a": small_frame(0), "log/b": small_frame(1), "other/c": small_frame(2)},
        {"log/a": {"is_skipped": False}},
    )


def _corrupt(src: Path) -> str:
    (src / "log/bad.npz").write_bytes(b"PK\x03\x04" + os.urandom(200))
    return "log/bad.npz"


def _truncated(src: Path) -> str:
    data = (src / "log/a.npz").read_bytes()
    (src / "log/trunc.npz").write_bytes(data[: len(data) // 2])
    return "log/trunc.npz"


def _not_zip(src: Path) -> str:
    (src / "log/text.npz").write_text("hello")
    return "log/text.npz"


def _object_array(src: Path) -> str:
    with open(src / "log/obj.npz", "wb") as fh:
        np.savez(fh, x=np.array([{"a": 1}, None], dtype=object))
    return "log/obj.npz"


def _datetime(src: Path) -> str:
    np.savez(src / "log/dt.npz", t=np.array(["2021-01-01"], dtype="datetime64[D]"))
    return "log/dt.npz"


def _structured(src: Path) -> str:
    np.savez(src / "log/rec.npz", r=np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")]))
    return "log/rec.npz"


def _bad_member(src: Path) -> str:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("x.npy", b"\x93NUMPY garbage")
    (src / "log/member.npz").write_bytes(buf.getvalue())
    return "log/member.npz"


def _bad_sidecar(src: Path) -> str:
    (src / "log/b.json").write_text('{"is_skipped": fals')
    return "log/b.json"


def _bad_skip_flag(src: Path) -> str:
    (src / "log/b.json").write_text('{"is_skipped": "no"}')
    return "log/b.json"


def _sidecar_not_object(src: Path) -> str:
    (src / "log/b.json").write_text("[1, 2]")
    return "log/b.json"


def _nan_sidecar(src: Path) -> str:
    (src / "log/b.json").write_text('{"x": NaN}')
    return "log/b.json"


def _orphan_sidecar(src: Path) -> str:
    (src / "log/ghost.json").write_text("{}")
    return "log/ghost.json"


def _broken_symlink(src: Path) -> str:
    os.symlink(src / "nowhere.npz", src / "log/link.npz")
    return "log/link.npz"


def _type_conflict(src: Path) -> str:
    (src / "log/a.json").write_text('{"v": 1}')
    (src / "log/b.json").write_text('{"v": "text"}')
    return "'v'"


def _file_outside_partitions(src: Path) -> str:
    make_source(src, {"toplevel": small_frame(3)})
    return "toplevel.npz"


BAD_INPUTS: dict[str, tuple[Callable[[Path], str], type[Exception], str]] = {
    "corrupt npz": (_corrupt, PackWorkerError, "corrupt"),
    "truncated npz": (_truncated, PackWorkerError, "corrupt or truncated"),
    "not a zip": (_not_zip, PackWorkerError, "not an npz"),
    "object array": (_object_array, PackWorkerError, "object arrays are refused"),
    "datetime dtype": (_datetime, PackWorkerError, "unsupported dtype"),
    "structured dtype": (_structured, PackWorkerError, "unsupported dtype"),
    "bad npy member": (_bad_member, PackWorkerError, "corrupt"),
    "malformed sidecar": (_bad_sidecar, PackWorkerError, "malformed sidecar JSON"),
    "bad is_skipped": (_bad_skip_flag, PackWorkerError, "must be true or false"),
    "sidecar not object": (_sidecar_not_object, PackWorkerError, "must be a JSON object"),
    "NaN in sidecar": (_nan_sidecar, PackWorkerError, "malformed sidecar"),
    "unreadable file": (_broken_symlink, SourceError, "cannot read"),
    "sidecar type conflict": (_type_conflict, PackWorkerError, "conflicting types"),
    "file outside partitions": (_file_outside_partitions, SourceError, "not inside any partition"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_names_file_and_publishes_nothing(tmp_path: Path, case: str) -> None:
    setup, error, text = BAD_INPUTS[case]
    src = _good(tmp_path / "src")
    store = open_store(str(tmp_path / "root"))
    shardlake.open(store).pack(
        src, tag="v0", executor="inline"
    )  # an existing version that must stay latest
    before = _published(store)
    versions_before = store.list("versions/")
    name = setup(src)
    with pytest.raises(error) as info:
        shardlake.open(store).pack(src, tag="v1", executor="inline")
    assert text in str(info.value)
    assert name in str(info.value)
    assert _published(store) == before and shardlake.open(store).latest.tag == "v0"
    assert store.list("versions/") == versions_before


def test_empty_source(tmp_path: Path) -> None:
    (tmp_path / "src" / "log").mkdir(parents=True)
    store = open_store(str(tmp_path / "root"))
    with pytest.raises(SourceError, match="empty source"):
        shardlake.open(store).pack(tmp_path / "src", tag="v1", executor="inline")
    with pytest.raises(SourceError, match="not a directory"):
        shardlake.open(store).pack(tmp_path / "missing", tag="v1", executor="inline")
    assert store.list("commits/") == []


def test_duplicate_keys_in_path_list(tmp_path: Path) -> None:
    src = _good(tmp_path / "src")
    listing = tmp_path / "list.txt"
    listing.write_text("log/a.npz\nlog/b.npz\n./log/a.npz\n")
    store = open_store(str(tmp_path / "root"))
    with pytest.raises(SourceError, match=r"list\.txt:3: duplicate key 'log/a'"):
        shardlake.open(store).pack(src, tag="v1", executor="inline", path_list=listing)
    listing.write_text("../escape.npz\n")
    with pytest.raises(SourceError, match="not a relative path"):
        shardlake.open(store).pack(src, tag="v1", executor="inline", path_list=listing)
    listing.write_text("log/missing.npz\n")
    with pytest.raises(SourceError, match="missing.npz"):
        shardlake.open(store).pack(src, tag="v1", executor="inline", path_list=listing)
    assert store.list("commits/") == []


def test_existing_tag_and_unknown_base(tmp_path: Path) -> None:
    src = _good(tmp_path / "src")
    store = open_store(str(tmp_path / "root"))
    shardlake.open(store).pack(src, tag="v1", executor="inline")
    state = _published(store)
    with pytest.raises(ConflictError, match="'v1' already exists"):
        shardlake.open(store).pack(src, tag="v1", executor="inline")
    with pytest.raises(VersionNotFoundError, match="unknown base version 'nope'"):
        shardlake.open(store).pack(src, tag="v2", base="nope", executor="inline")
    assert _published(store) == state


def test_failures_name_every_partition(tmp_path: Path) -> None:
    src = _good(tmp_path / "src")
    _corrupt(src)
    (src / "other/bad.npz").write_bytes(b"nope")
    store = open_store(str(tmp_path / "root"))
    with pytest.raises(PackWorkerError) as info:
        shardlake.open(store).pack(src, tag="v1", executor="inline")
    message = str(info.value)
    assert "2 of 2 partition builds failed" in message and "nothing was published" in message
    assert "log/bad.npz" in message and "other/bad.npz" in message


def test_cli_errors_are_one_line_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _good(tmp_path / "src")
    root = str(tmp_path / "root")
    _corrupt(src)
    code = main(["pack", str(src), root, "--tag", "v1", "--executor", "inline", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and "log/bad.npz" in err and "Traceback" not in err
    assert err.strip().count("\n") == 0
    store = open_store(root)
    assert store.list("commits/") == [] and store.list("versions/") == []
    assert main(["pack", str(src), root, "--tag", "bad tag!"]) == 2
    assert main(["show", root, "nope"]) == 1


@pytest.mark.parametrize("case", ["unreadable file"])
def test_inspect_reports_problems(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _good(tmp_path / "src")
    _broken_symlink(src)
    _orphan_sidecar(src)
    _bad_sidecar(src)
    code = main(["inspect", str(src)])
    out = capsys.readouterr().out
    assert code == 1
    assert "unreadable: log/link.npz" in out and "not frames: log/ghost.json" in out
    assert "malformed sidecar JSON" in out


def test_errors_are_shardlake_errors() -> None:
    for _, error, _ in BAD_INPUTS.values():
        assert issubclass(error, ShardlakeError)


def test_partition_id_collision_is_a_hard_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardlake.source.tree as source_mod
    from shardlake import inspect_source

    src = _good(tmp_path / "src")
    monkeypatch.setattr(source_mod, "partition_id", lambda path: "000000000000")
    store = open_store(str(tmp_path / "root"))
    with pytest.raises(
        SourceError, match="partitions 'log' and 'other' have the same id 000000000000"
    ):
        shardlake.open(store).pack(src, tag="v1", executor="inline")
    assert store.list("commits/") == []
    report = inspect_source(src)
    assert len(report["collisions"]) == 1 and "'other'" in report["collisions"][0]


def test_failed_build_leaves_no_partial_shard(tmp_path: Path) -> None:
    from shardlake.format.layout import partition_id
    from shardlake.pack.revisions import shuffle_order

    keys = [f"log/s{i}" for i in range(6)]
    src = make_source(tmp_path / "src", {k: small_frame(i) for i, k in enumerate(keys)})
    bad = shuffle_order(keys, 0)[3]  # three members are already in the open shard when it fails
    (src / f"{bad}.npz").write_bytes(b"PK\x03\x04" + b"\0" * 100)
    store = open_store(str(tmp_path / "root"))
    with pytest.raises(PackWorkerError, match=f"{bad}.npz"):
        shardlake.open(store).pack(src, tag="v1", executor="inline")
    assert store.list(f"data/{partition_id('log')}/") == []
    assert [
        k
        for k in os.listdir(tmp_path / "root")
        if k not in ("shardlake.json", "_shardlake", "data", "leases")
    ] == []
    assert store.list("leases") == []  # the failed pack removed its lease
