"""Read-only roots over plain HTTP: an exported root served by a static server on loopback
(one that honours Range and one that ignores it) reads bit-exactly through the CLI and the
loader, with every integrity check and no LIST; writes are refused in one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.torch import make_root

import shardlake
from shardlake.cli.main import main
from shardlake.errors import (
    CapabilityError,
    IntegrityError,
    ReadOnlyStoreError,
    RetriesExhaustedError,
    UsageError,
    VersionNotFoundError,
)
from shardlake.format.layout import ROOT_INDEX
from shardlake.format.rootindex import RootIndex
from shardlake.store import Request, open_store
from shardlake.store.backends.http import RangeIgnoredWarning, _warned_servers
from shardlake.testing.http_server import (
    StaticServer,
    self_signed_certificate,
    static_http_server,
)
from shardlake.torch import ShardDataset

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A root with v1, v2 and two keysets (``full``), and an export of v2 with its keyset."""
    base = tmp_path_factory.mktemp("http")
    source, root = make_root(base, [5, 7, 3], shard_size=40_000)
    local = shardlake.open(str(root))
    local.keysets.create("early", where="key LIKE '%0%'")
    (source / "extra").mkdir()
    first = next(source.glob("*/*.npz"))
    shutil.copy(first, source / "extra" / first.name)
    local.pack(str(source), tag="v2", base="v1")
    local.keysets.create("late", where="key LIKE '%1%'")
    local.export(str(base / "export"), version="v2", keysets=["late"])
    return {"source": source, "root": root, "export": base / "export"}


@pytest.fixture(params=[True, False], ids=["range", "no-range"])
def served(request: pytest.FixtureRequest, roots: dict[str, Path]) -> Iterator[StaticServer]:
    """The full root, served under /data by a server that honours Range or ignores it."""
    with static_http_server(roots["root"].parent, ranges=request.param) as server:
        _warned_servers.clear()
        yield server


def _url(server: StaticServer, name: str = "root") -> str:
    return f"{server.url}/{name}"


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _no_listing(server: StaticServer) -> None:
    """Every request named a file (a static server cannot list a directory)."""
    assert server.requests
    assert all(not r.path.endswith("/") and r.method in ("GET", "HEAD") for r in server.requests)


def test_cli_reads_a_served_root_like_the_local_one(
    served: StaticServer, roots: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    local, remote = str(roots["root"]), _url(served)
    key = shardlake.open(local).dataset("v2").query("true", columns=["key"])["key"][0].as_py()
    for argv in (
        ["versions", "{}", "--json"],
        ["show", "{}", "v1", "--json"],
        ["query", "{}", "--where", "key LIKE '%2%'", "--json"],
        ["diff", "{}", "v1", "v2", "--samples", "--json"],
        ["keyset", "{}", "list", "--json"],
        ["keyset", "{}", "show", "early", "--json"],
        ["mixing", "{}", "--batch-size", "4", "--json"],
    ):
        want = _run(capsys, [a.replace("{}", local) for a in argv])
        got = _run(capsys, [a.replace("{}", remote) for a in argv])
        assert got[0] == want[0] == 0, (argv, got[2])
        assert got[1] == want[1].replace(local, remote), argv
    out_local, out_remote = tmp_path / "a.npz", tmp_path / "b.npz"
    assert _run(capsys, ["get", local, key, "--out", str(out_local)])[0] == 0
    code, _, err = _run(capsys, ["get", remote, key, "--out", str(out_remote)])
    assert code == 0, err
    assert out_remote.read_bytes() == out_local.read_bytes()
    code, out, err = _run(capsys, ["verify", remote, "--source", str(roots["source"]), "--json"])
    assert code == 0 and json.loads(out)["ok"], err
    code, out, err = _run(capsys, ["scrub", remote, "--all", "--json"])
    assert code == 0 and json.loads(out)["ok"], err
    _no_listing(served)
    ranged = [r for r in served.requests if r.range is not None]
    assert ranged  # shard payloads were read by range
    if served.ranges:
        assert all(r.status == 206 for r in ranged)
        assert "Range" not in err
    else:
        assert all(r.status == 200 for r in ranged)


def test_a_server_ignoring_range_is_reported_once_naming_it(
    roots: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    with static_http_server(roots["root"].parent, ranges=False) as server:
        _warned_servers.clear()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            ds = shardlake.open(_url(server)).dataset("v2")
            keys = ds.query("true", columns=["key"])["key"].to_pylist()
            got = {k: ds.get(k) for k in keys}
        local = shardlake.open(str(roots["root"])).dataset("v2")
        for k in keys:
            want = local.get(k)
            assert list(got[k]) == list(want)
            assert all(np.array_equal(got[k][n], want[n]) for n in want), k
        reports = [w for w in seen if issubclass(w.category, RangeIgnoredWarning)]
        assert len(reports) == 1
        assert server.url in str(reports[0].message)


def test_the_cli_reports_a_server_ignoring_range_in_one_line(
    roots: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The warning is one ``shardlake CMD: warning:`` line, not Python's file:line form plus a
    line of the library's source."""
    key = shardlake.open(str(roots["root"])).dataset("v2").query("true", columns=["key"])
    with static_http_server(roots["root"].parent, ranges=False) as server:
        _warned_servers.clear()
        argv = ["get", _url(server), key["key"][0].as_py(), "--out", str(tmp_path / "f.npz")]
        code, _, err = _run(capsys, argv)
    assert code == 0, err
    lines = [line for line in err.splitlines() if "Range" in line or "warn" in line.lower()]
    assert lines == [
        f"shardlake get: warning: {server.url} ignores HTTP Range requests (answered 200 with "
        "the whole object instead of 206): reads stay correct but fetch every object from its "
        "start; serve the root with a server that honours Range"
    ], err


@pytest.mark.parametrize("engine", ["threads", "processes"])
@pytest.mark.parametrize("ranges", [True, False], ids=["range", "no-range"])
def test_two_worker_loader_reads_the_export_bit_exactly(
    roots: dict[str, Path], ranges: bool, engine: str, tmp_path: Path
) -> None:
    with static_http_server(roots["export"], ranges=ranges) as server:

        def batches(url: str, **kw: Any) -> list[dict[str, Any]]:
            ds = ShardDataset(
                url,
                keyset="late",
                batch_size=2,
                include_key=True,
                max_pad_fraction=0.5,
                engine=engine,
                **kw,
            )
            return list(ds.loader(num_workers=2))

        want = batches(str(roots["export"]))
        got = batches(server.url, cache_dir=tmp_path / "cache")
        assert any(r.range for r in server.requests)
        server.clear()
        again = batches(server.url, cache_dir=tmp_path / "cache")  # the epoch cache serves it
        assert not any(r.range for r in server.requests)  # no payload fetched again
        for batch in (got, again):
            assert [b["__key__"] for b in batch] == [b["__key__"] for b in want]
            for b, w in zip(batch, want, strict=True):
                assert all(np.array_equal(np.asarray(b[n]), np.asarray(w[n])) for n in w)
        _no_listing(server)


def test_loader_resumes_exactly_over_http(roots: dict[str, Path]) -> None:
    with static_http_server(roots["export"]) as server:

        def loader() -> Any:
            ds = ShardDataset(server.url, batch_size=2, include_key=True, max_pad_fraction=0.5)
            return ds.loader(num_workers=2)

        full = [list(b["__key__"]) for b in loader()]
        first = loader()
        it = iter(first)
        got = [list(next(it)["__key__"]) for _ in range(2)]
        state = first.state_dict()
        resumed = loader()
        resumed.load_state_dict(state)
        got += [list(b["__key__"]) for b in resumed]
        assert got == full


def test_a_flipped_byte_in_a_served_shard_is_caught_and_named(
    roots: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = tmp_path / "damaged"
    shutil.copytree(roots["export"], damaged)
    version = shardlake.open(str(damaged)).dataset("v2")
    row = version.query("true", columns=["key", "partition", "shard", "offset", "size"])
    first = row.to_pylist()[0]
    entry = next(e for e in version.version.entries if e.id == first["partition"])
    shard = entry.shards[first["shard"]].key
    data = bytearray((damaged / shard).read_bytes())
    data[first["offset"] + first["size"] // 2] ^= 0xFF
    (damaged / shard).write_bytes(bytes(data))
    with static_http_server(damaged) as server:
        code, out, err = _run(capsys, ["scrub", server.url, "--json"])
        assert code == 1
        problems = json.loads(out)["problems"]
        assert len(problems) == 1 and shard in json.dumps(problems[0])
        assert first["key"] in json.dumps(problems[0])
        with pytest.raises(IntegrityError, match=shard.rsplit("/", 1)[-1]):
            shardlake.open(server.url).dataset("v2").get(first["key"])
        ds = ShardDataset(server.url, batch_size=2, shuffle=False)
        with pytest.raises(IntegrityError, match=shard.rsplit("/", 1)[-1]) as caught:
            list(ds.loader(num_workers=2))
        assert first["key"] in str(caught.value)


WRITES = [
    ["pack", "{src}", "{url}", "--tag", "v9"],
    ["remove", "{url}", "--tag", "v9", "--partition", "x"],
    ["prune-version", "{url}", "v1"],
    ["gc", "{url}"],
    ["keyset", "{url}", "create", "k9", "--where", "true"],
    ["keyset", "{url}", "delete", "early"],
    ["keyset", "{url}", "rebase", "early", "--version", "v2", "--as", "k9"],
    ["catalog", "{url}"],
    ["index", "{url}"],
    ["export", "{local}", "{url}"],
    ["check-store", "{url}"],
    ["bench", "pack", "{src}", "--root", "{url}", "--calibrate", "1"],
]


@pytest.mark.parametrize("argv", WRITES, ids=[" ".join(a[:2]) for a in WRITES])
def test_every_write_is_refused_in_one_line_before_anything(
    roots: dict[str, Path], capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    with static_http_server(roots["root"].parent) as server:
        url = _url(server)
        fill = {"{src}": str(roots["source"]), "{url}": url, "{local}": str(roots["root"])}
        code, _out, err = _run(capsys, [fill.get(a, a) for a in argv])
        assert code == 1
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "read-only over HTTP" in lines[0], err
        assert server.requests == []


def test_the_api_refuses_writes_and_names_the_url(roots: dict[str, Path]) -> None:
    with static_http_server(roots["root"].parent) as server:
        root = shardlake.open(_url(server))
        with pytest.raises(ReadOnlyStoreError, match=r"read-only over HTTP.*prune"):
            root.prune(["v1"])
        with pytest.raises(ReadOnlyStoreError):
            root.store.write("x", b"y")
        with pytest.raises(CapabilityError, match="listing the root is not possible"):
            root.store.list("")
        assert server.requests == []


def test_headers_and_client_kwargs_pass_through(roots: dict[str, Path]) -> None:
    with static_http_server(roots["export"]) as server:
        root = shardlake.open(
            server.url,
            headers={"X-Shardlake-Test": "token-1"},
            client_kwargs={"headers": {"X-Client": "c1"}},
        )
        ds = root.dataset()
        ds.get(ds.query("true", columns=["key"])["key"][0].as_py())
        assert server.requests
        for request in server.requests:
            assert request.headers.get("X-Shardlake-Test") == "token-1"
            assert request.headers.get("X-Client") == "c1"


def test_requests_are_retried_like_any_store(roots: dict[str, Path]) -> None:
    with static_http_server(roots["export"]) as server:
        server.fail_next = 2
        assert [v.tag for v in shardlake.open(server.url).versions()] == ["v2"]
        assert [r.status for r in server.requests[:2]] == [503, 503]
        server.fail_next = 10_000
        slow = shardlake.open(server.url, retry_deadline=0.5)
        with pytest.raises(RetriesExhaustedError):
            slow.versions()


def test_a_stale_index_is_caught_up_from_the_commit_log(tmp_path: Path) -> None:
    source, root = make_root(tmp_path, [4, 3])
    local = shardlake.open(str(root))
    old = (root / ROOT_INDEX).read_bytes()
    local.pack(str(source), tag="v2", base="v1")
    local.prune(["v1"])
    (root / ROOT_INDEX).write_bytes(old)  # as if the index writes since v1 were lost
    report = local.scrub()
    assert not report.ok and "commit log is at 3" in report.index_problems[0]
    with static_http_server(tmp_path) as server:
        remote = shardlake.open(f"{server.url}/root")
        assert [v.tag for v in remote.versions()] == ["v2"]  # later commits found by GET
        with pytest.raises(VersionNotFoundError, match="pruned"):
            remote.version("v1")
    assert local.write_index()["commit"] == 3
    assert local.scrub().ok


def test_the_index_follows_every_publish_keyset_change_and_prune(tmp_path: Path) -> None:
    source, root = make_root(tmp_path, [4, 3])
    local = shardlake.open(str(root))

    def index() -> RootIndex:
        return RootIndex.from_bytes((root / ROOT_INDEX).read_bytes(), "index")

    assert index().latest == "v1" and index().commit == 1 and not index().keysets
    local.keysets.create("a", where="true")
    data = (root / "keysets" / "a.parquet").read_bytes()
    assert index().keysets["a"].size == len(data)
    local.pack(str(source), tag="v2", base="v1")
    assert index().latest == "v2" and [t for t, _ in index().versions] == ["v1", "v2"]
    local.keysets.delete("a")
    assert not index().keysets
    local.prune(["v1"])
    assert [t for t, _ in index().versions] == ["v2"] and index().retired == ("v1",)
    assert local.scrub().ok


def test_a_root_without_an_index_says_how_to_serve_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _source, root = make_root(tmp_path, [3])
    (root / ROOT_INDEX).unlink()
    with static_http_server(tmp_path) as server:
        code, _, err = _run(capsys, ["versions", f"{server.url}/root"])
        assert code == 1 and len(err.strip().splitlines()) == 1
        assert "Root.write_index()" in err  # the API's words, then the CLI's command
        assert err.rstrip().endswith("(where the root is stored: shardlake index STORED_ROOT)")
        code, _, err = _run(capsys, ["versions", f"{server.url}/nothing"])
        assert code == 1 and "no shardlake root at" in err
        code, out, _ = _run(capsys, ["index", str(root)])
        assert code == 0 and "commit 1" in out
        code, out, err = _run(capsys, ["versions", f"{server.url}/root", "--json"])
        assert code == 0 and [v["tag"] for v in json.loads(out)] == ["v1"], err


def test_a_server_answering_403_for_missing_names_reads_like_404(
    roots: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # S3 and GCS answer 403 for a missing key to readers who may not list: once the root
    # index was readable, a 403 means "absent" (the tombstone and next-commit probes).
    with static_http_server(roots["root"].parent) as server:
        server.missing_status = 403
        url = _url(server)
        code, out, err = _run(capsys, ["keyset", url, "show", "early", "--json"])
        assert code == 0 and json.loads(out)["name"] == "early", err
        assert any(r.status == 403 for r in server.requests)
        code, out, err = _run(capsys, ["versions", url, "--json"])
        assert code == 0 and [v["tag"] for v in json.loads(out)] == ["v1", "v2"], err
        code, _, err = _run(capsys, ["keyset", url, "show", "nope"])
        assert code == 1 and "no keyset 'nope'" in err


@pytest.mark.parametrize("store_kind", ["local", "s3"])
def test_export_from_http_to_local_and_s3(
    roots: dict[str, Path], store_factory: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = store_factory(label="from-http")
    with static_http_server(roots["export"]) as server:
        argv = ["export", server.url, dest.url, "--json", "--quiet"]
        argv += [
            f"--dest-storage-option={k}={json.dumps(v)}" for k, v in dest.storage_options.items()
        ]
        code, out, err = _run(capsys, argv)
        assert code == 0, err
        report = json.loads(out)
        assert report["committed"] and report["keysets"] == ["late"]
        _no_listing(server)
    copy = shardlake.open(dest.url, **dest.storage_options)
    want = shardlake.open(str(roots["export"]))
    assert [v.hash for v in copy.versions()] == [v.hash for v in want.versions()]
    assert copy.scrub().ok and copy.keysets.get("late").keys == want.keysets.get("late").keys


def test_a_keyset_is_checked_against_the_digest_the_index_records(
    roots: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Another valid keyset under this name decodes fine: only the index's sha256 catches it
    # (keysets written before content digests carry none of their own).
    served = tmp_path / "root"
    shutil.copytree(roots["root"], served)
    shutil.copy(served / "keysets" / "early.parquet", served / "keysets" / "late.parquet")
    with static_http_server(tmp_path) as server:
        code, _, err = _run(capsys, ["keyset", f"{server.url}/root", "show", "late"])
        assert code == 1 and "keysets/late.parquet" in err and "index.json" in err
        assert "corrupt at rest" in err
        code, out, err = _run(capsys, ["keyset", f"{server.url}/root", "show", "early", "--json"])
        assert code == 0 and json.loads(out)["name"] == "early", err


def test_a_lost_index_write_leaves_the_publish_standing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source, root = make_root(tmp_path, [3, 2])

    def refuse_index(request: Request, send: Callable[[], Any]) -> Any:
        if request.op == "write" and request.key == ROOT_INDEX:
            raise PermissionError("index write refused")
        return send()

    flaky = shardlake.open(open_store(str(root)).with_layers(refuse_index))
    with caplog.at_level("WARNING", logger="shardlake.index"):
        flaky.pack(str(source), tag="v2", base="v1")
    assert [v.tag for v in flaky.versions()] == ["v1", "v2"]  # published all the same
    assert "shardlake index" in caplog.text and "index.json was not updated" in caplog.text
    local = shardlake.open(str(root))
    assert not local.scrub().ok  # the stale index is reported ...
    local.write_index()
    assert local.scrub().ok  # ... until it is rewritten


def test_https_with_a_verified_certificate_and_ssl_options(
    roots: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tls = self_signed_certificate(tmp_path)
    with static_http_server(roots["export"], tls=tls) as server:
        assert server.url.startswith("https://")
        # Not trusted: refused at once (no retries), in one line saying what to do.
        code, _, err = _run(capsys, ["versions", server.url])
        assert code == 1 and "certificate is not trusted" in err and "SSL_CERT_FILE" in err
        assert len(err.strip().splitlines()) == 1
        # The certificate trusted (the process's CA file): verified TLS, commands as over HTTP.
        env = {**os.environ, "SSL_CERT_FILE": tls[0], "PYTHONPATH": os.pathsep.join(sys.path)}
        done = subprocess.run(
            [sys.executable, "-m", "shardlake.cli.main", "scrub", server.url, "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0 and json.loads(done.stdout)["ok"], done.stderr
        # Verification switched off by a storage option (passed through to aiohttp): the
        # 2-worker loader reads the export bit-exactly over TLS.
        code, out, err = _run(capsys, ["versions", server.url, "--storage-option", "ssl=false"])
        assert code == 0 and "v2" in out, err
        got = ShardDataset(
            server.url,
            keyset="late",
            batch_size=2,
            include_key=True,
            max_pad_fraction=0.5,
            storage_options={"ssl": False},
        )
        want = ShardDataset(
            str(roots["export"]),
            keyset="late",
            batch_size=2,
            include_key=True,
            max_pad_fraction=0.5,
        )
        for b, w in zip(got.loader(num_workers=2), want.loader(num_workers=2), strict=True):
            assert b["__key__"] == w["__key__"]
            assert all(np.array_equal(np.asarray(b[n]), np.asarray(w[n])) for n in w)


def test_https_to_a_plain_http_server_fails_at_once_saying_so(
    roots: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A TLS handshake that can never succeed is not retried until the deadline."""
    with static_http_server(roots["export"]) as server:
        url = server.url.replace("http://", "https://")
        argv = ["versions", url, "--storage-option", "retry_deadline=20"]
        code, _, err = _run(capsys, argv)
    assert code == 1, err
    assert "the endpoint does not speak TLS" in err and "with http://, not https://" in err, err
    assert "failed after" not in err, err


@pytest.mark.parametrize(
    ("client_kwargs", "said"),
    [
        ({"timeout": 5}, "timeout parameter cannot be of <class 'int'> type"),
        ({"timout": 5}, "unexpected keyword argument 'timout'"),
    ],
)
def test_a_client_kwargs_aiohttp_refuses_is_named_in_one_line(
    capsys: pytest.CaptureFixture[str], client_kwargs: dict[str, Any], said: str
) -> None:
    url = "http://127.0.0.1:9/root"  # refused before any request
    with pytest.raises(UsageError, match="storage option client_kwargs for http:// is refused"):
        shardlake.open(url, client_kwargs=client_kwargs).versions()
    argv = ["versions", url, "--storage-option", f"client_kwargs={json.dumps(client_kwargs)}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0] and "client_kwargs" in err[0], err
