"""``export``: copy a version's closure to another store, or write it back out as npz + json.

A closure export makes the destination a self-contained root: same ``dataset_id``, the version
document byte for byte (so the same hash), its manifests and shards, its keysets, and a fresh
commit log whose ``latest`` is the exported version. The root marker is written first (so a
re-run recognises its own partial export) and the commit last (so nothing half-copied is ever
referenced). Every shard is verified at the destination against the manifest's CRC-32s;
objects already present and verified are skipped, which makes a re-run resume.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..access import npz_bytes, sidecar_json
from ..errors import (
    AlreadyExistsError,
    ConflictError,
    FormatError,
    IntegrityError,
    KeyNotFoundError,
    NotFoundError,
)
from ..format.codec import Decoder
from ..format.layout import ROOT_MARKER, keyset_key, version_key
from ..format.manifest import parse_manifest, read_entry_manifest
from ..keysets import Keyset, list_keysets, load_keyset
from ..store import Store, open_store
from ..versions import RootState, _commit, ensure_root, load_version, read_root_marker, read_state
from .common import Progress, check_shard_payloads, rows_by_shard


@dataclass
class ExportReport:
    source: str
    dest: str
    version: str
    version_hash: str
    copied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    bytes_copied: int = 0
    keysets: list[str] = field(default_factory=list)
    committed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "dest": self.dest,
            "version": self.version,
            "version_hash": self.version_hash,
            "copied": len(self.copied),
            "skipped": len(self.skipped),
            "bytes_copied": self.bytes_copied,
            "keysets": self.keysets,
            "committed": self.committed,
        }


def _select_keysets(src: Store, version_hash: str, names: Sequence[str] | None) -> list[Keyset]:
    if names is None:
        return [k for k in list_keysets(src) if k.version_hash == version_hash]
    out = []
    for name in names:
        keyset = load_keyset(src, name)
        if keyset.version_hash != version_hash:
            raise ConflictError(
                f"keyset {name!r} is bound to version {keyset.version_tag!r}, not the exported one"
            )
        out.append(keyset)
    return out


def _check_dest(src_marker: dict[str, Any], dest: Store) -> None:
    marker = read_root_marker(dest)
    if marker is None:
        if dest.list(""):
            raise ConflictError(
                f"{dest.url} is not empty and not a shardlake root; export needs an empty "
                "destination or a root of the same dataset"
            )
        return
    if marker.get("dataset_id") != src_marker.get("dataset_id"):
        raise ConflictError(
            f"{dest.url} already holds a different dataset (id {marker.get('dataset_id')}, "
            f"exporting {src_marker.get('dataset_id')})"
        )


def _copy_small(src: Store, dest: Store, key: str, report: ExportReport) -> bytes:
    """Copy a small immutable object (manifest, keyset) unless the same bytes are there."""
    data = src.read(key)
    try:
        if dest.read(key) == data:
            report.skipped.append(key)
            return data
    except KeyNotFoundError:
        pass
    dest.write(key, data)
    report.copied.append(key)
    report.bytes_copied += len(data)
    return data


def _shard_ok(dest: Store, pid: str, key: str, size: int, rows: list[dict[str, Any]]) -> bool:
    try:
        if dest.size(key) != size:
            return False
    except KeyNotFoundError:
        return False
    return all(p is None for _r, _b, p in check_shard_payloads(dest, pid, key, rows, decode=False))


def export_version(
    src_url: str | Store,
    dest_url: str | Store,
    *,
    version: str = "latest",
    keysets: Sequence[str] | None = None,
    src_options: dict[str, Any] | None = None,
    dest_options: dict[str, Any] | None = None,
    progress: bool | None = None,
) -> ExportReport:
    """Copy ``version``'s closure from ``src_url`` to ``dest_url``; see the module docs."""
    src = open_store(src_url, src_options)
    dest = open_store(dest_url, dest_options)
    src_marker = read_root_marker(src)
    if src_marker is None:
        raise NotFoundError(f"{src.url} is not a shardlake root")
    ver = load_version(src, version)
    chosen = _select_keysets(src, ver.hash, keysets)
    _check_dest(src_marker, dest)
    # The marker goes first and byte for byte (same dataset_id and created_at), so a re-run
    # recognises its own partial export and the copy is indistinguishable from the source.
    dest.ensure_create_enforced()
    with contextlib.suppress(AlreadyExistsError):
        dest.create(ROOT_MARKER, src.read(ROOT_MARKER))
    ensure_root(dest, dataset_id=str(src_marker["dataset_id"]))
    report = ExportReport(src.url, dest.url, ver.tag, ver.hash)
    total = sum(len(e["shards"]) for e in ver.partitions)
    bar = Progress(total, "export", enabled=progress)
    for entry in ver.partitions:
        pid = entry["id"]
        data = _copy_small(src, dest, entry["manifest"], report)
        table, meta = parse_manifest(data, dest.key_url(entry["manifest"]))
        if meta.partition_id != pid or meta.manifest_rev != entry["manifest_rev"]:
            raise FormatError(
                f"{src.key_url(entry['manifest'])}: manifest does not belong to partition {pid} "
                f"revision {entry['manifest_rev']}"
            )
        groups = rows_by_shard(table)
        for index, shard in enumerate(entry["shards"]):
            key, size = shard["key"], int(shard["size"])
            rows = groups.get(index, [])
            if _shard_ok(dest, pid, key, size, rows):
                report.skipped.append(key)
                bar.update()
                continue
            src.copy_to(dest, key)
            report.copied.append(key)
            report.bytes_copied += size
            problems = [
                p for _r, _b, p in check_shard_payloads(dest, pid, key, rows, decode=False) if p
            ]
            if problems or dest.size(key) != size:
                dest.delete(key)  # never leave a bad copy for a resume to trust
                source_bad = [
                    p for _r, _b, p in check_shard_payloads(src, pid, key, rows, decode=False) if p
                ]
                first = source_bad or problems
                where = "source" if source_bad else "copy"
                detail = str(first[0]) if first else f"size differs from {size}"
                raise IntegrityError(
                    f"export of {src.key_url(key)} failed verification ({where}): {detail}"
                )
            bar.update()
    bar.close()
    for keyset in chosen:
        _copy_small(src, dest, keyset_key(keyset.name), report)
        report.keysets.append(keyset.name)
    for ref in ver.catalog_objects():  # before the record that references them
        ref.check(_copy_small(src, dest, ref.key, report), src.key_url(ref.key))
    doc_key = version_key(ver.tag, ver.hash)
    _copy_small(src, dest, doc_key, report)
    state = read_state(dest)
    if state.versions.get(ver.tag) == ver.hash and state.latest == ver.tag:
        return report  # an earlier run already committed it
    if ver.tag in state.versions or ver.tag in state.retired:
        raise ConflictError(f"{dest.url}: already has a different version tagged {ver.tag!r}")
    versions = dict(state.versions)
    versions[ver.tag] = ver.hash
    new = RootState(state.seq + 1, versions, state.retired, ver.tag)
    _commit(dest, state, new, "export", {"tag": ver.tag, "version": ver.hash, "source": src.url})
    report.committed = True
    return report


@dataclass
class NpzExportReport:
    dest: str
    version: str
    samples: int = 0
    sidecars: int = 0
    bytes_written: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "dest": self.dest,
            "version": self.version,
            "samples": self.samples,
            "sidecars": self.sidecars,
            "bytes_written": self.bytes_written,
        }


def export_npz(
    src_url: str | Store,
    dest_url: str | Store,
    *,
    version: str = "latest",
    keyset: str | None = None,
    src_options: dict[str, Any] | None = None,
    dest_options: dict[str, Any] | None = None,
    progress: bool | None = None,
) -> NpzExportReport:
    """Write ``<key>.npz`` (+ ``<key>.json`` sidecar) for every sample of ``version``.

    Arrays come back bit-exact (names, order, dtype, shape, bytes); sidecars are rebuilt from
    the manifest columns (see :func:`shardlake.access.sidecar_of`).
    """
    src = open_store(src_url, src_options)
    dest = open_store(dest_url, dest_options)
    ver = load_version(src, version)
    wanted: set[str] | None = None
    if keyset is not None:
        ks = load_keyset(src, keyset)
        ks.check_version(ver)
        wanted = set(ks.keys)
    report = NpzExportReport(dest.url, ver.tag)
    decoder = Decoder()
    bar = Progress(len(wanted) if wanted is not None else ver.samples, "export", enabled=progress)
    for entry in ver.partitions:
        pid = entry["id"]
        table, _meta = read_entry_manifest(src, entry)
        full = {r["key"]: r for r in table.to_pylist() if wanted is None or r["key"] in wanted}
        for index, rows in sorted(rows_by_shard(table).items()):
            rows = [r for r in rows if r["key"] in full]
            shard = entry["shards"][index]["key"]
            for row, payload, problem in check_shard_payloads(src, pid, shard, rows, decode=False):
                if problem is not None or payload is None:
                    raise IntegrityError(str(problem or f"{src.key_url(shard)} key {row['key']!r}"))
                arrays = decoder.decode(payload, f"{src.key_url(shard)} key {row['key']!r}")
                data = npz_bytes(arrays)
                dest.write(row["key"] + ".npz", data)
                report.samples += 1
                report.bytes_written += len(data)
                side = sidecar_json(full[row["key"]])
                if side is not None:
                    dest.write(row["key"] + ".json", side)
                    report.sidecars += 1
                    report.bytes_written += len(side)
                bar.update()
    bar.close()
    return report
