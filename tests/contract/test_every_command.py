"""Every CLI command and its public-API twin, on every store, with the store's endpoint and
credentials given ONLY as storage options while the environment points at a closed port.

A command that drops its ``--storage-option`` flags (as ``gc`` once did) reaches the closed port
and fails here. One packed root per store per session: ``v1`` (CLI pack), ``v2`` (CLI
incremental pack on ``v1``, one partition more) and ``v3`` (``Root.pack`` of one partition on
``v2``).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardlake
from shardlake.cli.main import main
from shardlake.testing import free_port, synth_corpus
from shardlake.testing.azurite import connection_string
from shardlake.testing.fixtures import new_location
from shardlake.testing.servers import StoreServers

KINDS = ["local", "seaweedfs", "gcs", "azure"]
SMALL = {"executor": "thread", "workers": 2}


def closed_env() -> dict[str, str]:
    """Every variable a store client reads for an endpoint or credentials, pointing at a port
    nothing listens on."""
    closed = f"http://127.0.0.1:{free_port()}"
    return {
        "AWS_ENDPOINT_URL": closed,
        "AWS_ENDPOINT_URL_S3": closed,
        "AWS_ACCESS_KEY_ID": "not-the-key",
        "AWS_SECRET_ACCESS_KEY": "not-the-secret",
        "STORAGE_EMULATOR_HOST": closed,
        "AZURE_STORAGE_CONNECTION_STRING": connection_string(closed),
        # A command that went to the closed port fails in seconds, not after the 120 s default.
        "SHARDLAKE_RETRY_DEADLINE": "15",
    }


@contextlib.contextmanager
def environment_elsewhere() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as env:
        for name, value in closed_env().items():
            env.setenv(name, value)
        s3fs = sys.modules.get("s3fs")
        if s3fs is not None:  # no instance made under another environment survives
            s3fs.S3FileSystem.clear_instance_cache()
        yield


def option_flags(options: dict[str, Any], flag: str = "--storage-option") -> list[str]:
    return [arg for k, v in options.items() for arg in (flag, f"{k}={json.dumps(v)}")]


@dataclass
class World:
    """One store kind's packed root and how to reach it (options only, never the env)."""

    kind: str
    url: str
    options: dict[str, Any]
    src: Path
    parts: list[str]  # the source's partition directories, sorted
    servers: StoreServers | None
    tmp: Path
    labels: list[str] = field(default_factory=list)

    def cli(self, *args: str, root: bool = True, expect: int = 0) -> Any:
        """Run ``shardlake ARGS --storage-option ...`` in-process; the parsed JSON stdout."""
        argv = [*args, *(option_flags(self.options) if root else [])]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
        assert code == expect, f"shardlake {' '.join(argv)} -> {code}: {err.getvalue()}"
        text = out.getvalue()
        return json.loads(text) if text.strip().startswith(("{", "[")) else text

    def pids(self, tag: str) -> list[str]:
        """The partition ids of version ``tag``, sorted."""
        return sorted(entry.id for entry in self.open().dataset(tag).entries)

    def open(self) -> shardlake.Root:
        return shardlake.open(self.url, **self.options)

    def fresh(self, label: str) -> str:
        if self.kind == "local":
            path = self.tmp / f"{label}-{len(self.labels)}"
            self.labels.append(label)
            return str(path)
        return new_location(self.kind, label, self.servers).url


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    src = tmp_path_factory.mktemp("contract") / "src"
    made = synth_corpus(src, 3, 3, seed=7, neighbors=2, lanes=4)
    return src, sorted(made.partitions)


@pytest.fixture(scope="session", params=KINDS)
def world(
    request: pytest.FixtureRequest,
    corpus: tuple[Path, list[str]],
    store_servers: StoreServers,
    tmp_path_factory: pytest.TempPathFactory,
) -> World:
    kind = str(request.param)
    tmp = tmp_path_factory.mktemp(f"contract-{kind}")
    src, parts = corpus
    if kind == "local":
        w = World(kind, str(tmp / "root"), {}, src, parts, None, tmp)
    else:
        location = new_location(kind, "contract", store_servers)
        options = dict(location.storage_options)
        w = World(kind, location.url, options, src, parts, store_servers, tmp)
    small = [f"--executor={SMALL['executor']}", f"--workers={SMALL['workers']}"]
    with environment_elsewhere():
        w.cli(
            "pack", str(src), w.url, "--tag", "v1", "--exclude", f"{parts[2]}/*", *small, "--json"
        )
        w.cli("pack", str(src), w.url, "--tag", "v2", "--base", "v1", *small, "--json")
        w.open().pack(
            src, tag="v3", base="v2", options=shardlake.PackOptions(partitions=[parts[1]], **SMALL)
        )
    return w


@pytest.fixture(autouse=True)
def _env_elsewhere() -> Iterator[None]:
    with environment_elsewhere():
        yield


# --- pack, versions, show ---------------------------------------------------------------------


def test_pack_and_incremental_pack(world: World) -> None:
    rows = world.cli("versions", world.url, "--json")
    assert [(r["tag"], r["partitions"], r["base"]) for r in rows] == [
        ("v1", 2, None),
        ("v2", 3, "v1"),
        ("v3", 3, "v2"),
    ]
    diff = world.open().diff("v1", "v2")
    assert diff.to_json()["partitions"]["added"] == [world.parts[2]]


def test_versions(world: World) -> None:
    rows = world.cli("versions", world.url, "--json")
    api = world.open().versions()
    assert [r["tag"] for r in rows] == [v.tag for v in api] == ["v1", "v2", "v3"]
    assert [v.is_latest for v in api] == [False, False, True]


def test_show(world: World) -> None:
    doc = world.cli("show", world.url, "v2", "--json")
    version = world.open().version("v2")
    assert doc["tag"] == version.tag == "v2" and doc["hash"] == version.hash
    assert version.samples == 9 and version.partitions == 3


# --- checks -----------------------------------------------------------------------------------


def test_verify(world: World) -> None:
    doc = world.cli("verify", world.url, "--source", str(world.src), "--version", "v2", "--json")
    assert doc["ok"] is True
    report = world.open().verify(world.src, version="v2", executor="thread")
    assert report.ok and report.compared == 9


def test_verify_offsets(world: World) -> None:
    doc = world.cli("verify-offsets", world.url, "--version", "v2", "--json")
    assert doc["ok"] is True
    assert world.open().verify_offsets("v2", progress=False).ok


def test_scrub(world: World) -> None:
    doc = world.cli("scrub", world.url, "--all", "--json")
    assert doc["ok"] is True
    report = world.open().scrub("v3", progress=False)
    assert report.ok and report.samples == 9


def test_index(world: World) -> None:
    doc = world.cli("index", world.url, "--json")
    assert doc == world.open().write_index()
    assert [tag for tag, _ in doc["versions"]] == [v.tag for v in world.open().versions()]
    assert world.open().scrub(progress=False).index_problems == []


# --- reading ----------------------------------------------------------------------------------


def test_query(world: World) -> None:
    ds = world.open().dataset("v2")
    pid = ds.query(None, columns=["partition"]).column("partition")[0].as_py()
    out = world.cli(
        "query", world.url, "--version", "v2", "--where", f"partition = '{pid}'", "--count"
    )
    assert out.strip() == "3"
    assert ds.query(f"partition = '{pid}'", columns=["key"]).num_rows == 3


def test_get(world: World) -> None:
    ds = world.open().dataset("v2")
    key = ds.keys()[0]
    doc = world.cli("get", world.url, key, "--version", "v2", "--json")
    arrays = ds.get(key)
    assert doc["key"] == key and sorted(doc["arrays"]) == sorted(arrays)


# --- keysets ----------------------------------------------------------------------------------


def test_keyset_lifecycle(world: World) -> None:
    pid = world.open().dataset("v1").query(None, columns=["partition"])["partition"][0].as_py()
    where = f"partition = '{pid}'"
    made = world.cli("keyset", world.url, "create", "cli-ks", "--where", where, "--version", "v1")
    assert "keyset cli-ks: 3 samples" in made
    root = world.open()
    api = root.keysets.create("api-ks", version="v2", where=where)
    assert len(api) == 3

    listed = world.cli("keyset", world.url, "list", "--json")
    assert {"cli-ks", "api-ks"} <= {k["name"] for k in listed}
    assert {"cli-ks", "api-ks"} <= {k.name for k in root.keysets.list()}

    shown = world.cli("keyset", world.url, "show", "cli-ks", "--json")
    assert shown["version"] == "v1" and root.keysets.get("cli-ks").version_tag == "v1"

    rebased = world.cli(
        "keyset", world.url, "rebase", "cli-ks", "--version", "v2", "--as", "cli-ks2", "--json"
    )
    assert rebased["kept"] == 3
    assert root.keysets.rebase("api-ks", "v3", new_name="api-ks2").kept == 3

    for name in ("cli-ks", "cli-ks2"):
        assert world.cli("keyset", world.url, "delete", name, "--json")["deleted"] is True
    for name in ("api-ks", "api-ks2"):
        assert root.keysets.delete(name).name == name
    assert not {"cli-ks", "cli-ks2", "api-ks", "api-ks2"} & {k.name for k in root.keysets.list()}


def test_diff(world: World) -> None:
    doc = world.cli("diff", world.url, "v1", "v2", "--json")
    assert doc["partitions"]["added"] == [world.parts[2]]
    assert world.open().diff("v2", "v3").to_json()["partitions"]["added"] == []


def test_mixing(world: World) -> None:
    doc = world.cli("mixing", world.url, "--version", "v2", "--batch-size", "3", "--json")
    assert doc["batches"] >= 1
    ds = world.open().dataset("v2").to_torch(batch_size=3, num_workers=0)
    assert len(ds.table) == 9


# --- writers: remove, prune, gc, export -------------------------------------------------------


def test_export(world: World) -> None:
    dest = world.fresh("cli-export")
    dest_flags = option_flags(world.options, "--dest-storage-option")
    doc = world.cli("export", world.url, dest, "--version", "v2", *dest_flags, "--json")
    assert doc["version"] == "v2"
    assert [v.tag for v in shardlake.open(dest, **world.options).versions()] == ["v2"]

    api_dest = world.fresh("api-export")
    report = world.open().export(api_dest, version="v3", dest_storage_options=world.options)
    assert report.to_json()["version"] == "v3"
    assert shardlake.open(api_dest, **world.options).latest.tag == "v3"


def _wds_tar(samples: int, seed: int) -> bytes:
    """A WebDataset tar: ``NNNNNN.ego.npy`` and ``NNNNNN.json`` per sample."""
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for i in range(samples):
            npy = io.BytesIO()
            np.save(npy, rng.standard_normal((4, 3)).astype(np.float32))
            members = {f"{i:06d}.ego.npy": npy.getvalue(), f"{i:06d}.json": b'{"i": %d}' % i}
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_import_wds(world: World) -> None:
    """The source tars on the same store, reached through --source-storage-option alone."""
    tars = world.fresh("wds-src")
    source = shardlake.open_store(tars, world.options)
    for n in range(2):
        source.write(f"part-{n}.tar", _wds_tar(3, seed=n))
    dest = world.fresh("cli-wds")
    source_flags = option_flags(world.options, "--source-storage-option")
    doc = world.cli("import-wds", tars, dest, "--tag", "w1", *source_flags, "--json")
    assert doc["samples"] == 6, doc
    assert shardlake.open(dest, **world.options).latest.samples == 6

    api_dest = world.fresh("api-wds")
    root = shardlake.open(api_dest, **world.options)
    report = root.import_wds(tars, "w1", source_storage_options=world.options)
    assert report.to_json()["samples"] == 6
    assert root.dataset("w1").get("part-1/000002")["ego"].shape == (4, 3)


# --- store and loader -------------------------------------------------------------------------


def test_check_store(world: World) -> None:
    where = world.fresh("check")
    doc = world.cli("check-store", where, "--json")
    assert doc["safe"] is True
    report = shardlake.check_store(world.fresh("check-api"), **world.options)
    assert report.safe


def test_bench_load(world: World) -> None:
    doc = world.cli(
        "bench",
        "load",
        world.url,
        "--version",
        "v2",
        "--batch-size",
        "3",
        "--num-workers",
        "0",
        "--no-count-bytes",
    )
    assert doc["samples"] == 9
    from shardlake.torch import ShardDataset

    ds = ShardDataset(
        world.url, "v2", batch_size=3, num_workers=0, storage_options=world.options or None
    )
    assert sum(1 for _batch in ds.loader()) == 3  # 9 samples, batches of 3


# Last: it moves latest.
def test_remove_prune_gc(world: World) -> None:
    made = world.cli(
        "remove",
        world.url,
        "--tag",
        "cli-rm",
        "--base",
        "v2",
        "--partition",
        world.pids("v2")[0],
        "--json",
    )
    assert made["tag"] == "cli-rm"
    root = world.open()
    report = root.remove("api-rm", base="v2", partitions=[world.pids("v2")[1]])
    assert report.version.tag == "api-rm"

    pruned = world.cli("prune-version", world.url, "cli-rm", "--json")
    assert pruned["pruned"] == ["cli-rm"]
    assert root.prune(["api-rm"], force=True).pruned == ["api-rm"]

    gc = world.cli("gc", world.url, "--grace", "0", "--json")
    assert gc["dry_run"] is False
    assert [v.split("@")[0] for v in gc["live_versions"]] == ["v1", "v2", "v3"]
    assert root.gc(grace_s=0, dry_run=True).garbage == []
    assert [v.tag for v in root.versions()] == ["v1", "v2", "v3"]


# After remove/prune/gc: it gives every tag a new hash.
def test_forget(world: World) -> None:
    root = world.open()
    keys = sorted(root.dataset("v1").manifests(columns=["key"]).column("key").to_pylist())
    keyfile = world.tmp / "forget.txt"
    keyfile.write_text(keys[0] + "\n")
    dry = world.cli(
        "forget", world.url, "--keys", str(keyfile), "--reason", "r", "--dry-run", "--json"
    )
    assert dry["dry_run"] and [v["tag"] for v in dry["versions"]] == ["v1", "v2", "v3"]
    doc = world.cli(
        "forget", world.url, "--keys", str(keyfile), "--reason", "r", "--executor=thread", "--json"
    )
    assert doc["keys"] == 1 and len(doc["versions"]) == 3 and doc["deleted"] > 0
    report = root.forget(keys=[keys[1]], reason="r", **SMALL)
    assert report.keys == 1 and report.forget_id
    for tag in ("v1", "v2", "v3"):
        left = set(root.dataset(tag).manifests(columns=["key"]).column("key").to_pylist())
        assert not left & {keys[0], keys[1]}
    check = world.cli("forget", "--check", world.url, "--json")
    assert check["ok"] and len(check["forgets"]) == 2
    assert root.check_forget(report.forget_id).ok
