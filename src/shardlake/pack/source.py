"""Pass 1 of a pack: discover a source tree, group files into partitions, fingerprint them.

The source is a local directory (or NFS mount) of ``<name>.npz`` files with optional
``<name>.json`` sidecars. A sample key is the npz path relative to the source without ``.npz``.

The **source fingerprint** of a partition is stat-based: a hash over every sample's relative
path, size and ``mtime_ns`` of its npz and of its sidecar (or "no sidecar"). It costs one
``stat`` per file, so a 5-million-file corpus is fingerprinted without reading it; touching a
file (new mtime) makes the partition rebuild, which is safe because revisions are content
hashes: an unchanged content yields the same ``data_rev`` and the existing shards are reused.
"""

from __future__ import annotations

import os
import re
import stat as stat_mod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SourceError, UsageError
from ..format.layout import partition_id, short_hash

NPZ = ".npz"
SIDECAR = ".json"


@dataclass(frozen=True)
class PartitionRule:
    """How sample paths map to partitions: the first ``depth`` directory levels, or a regex
    whose named group ``partition`` (searched in the relative npz path) is the partition path."""

    depth: int | None = 1
    regex: str | None = None

    def __post_init__(self) -> None:
        if self.regex is not None:
            try:
                compiled = re.compile(self.regex)
            except re.error as exc:
                raise UsageError(
                    f"--partition-regex {self.regex!r} is not a valid regex ({exc})"
                ) from exc
            if "partition" not in compiled.groupindex:
                raise UsageError(
                    f"--partition-regex {self.regex!r} needs a named group (?P<partition>...)"
                )
        elif self.depth is None or self.depth < 1:
            raise UsageError("--partition-depth must be >= 1")

    @classmethod
    def from_options(cls, depth: int | None, regex: str | None) -> PartitionRule | None:
        """The rule the options ask for, or None when neither is given (inherit / default)."""
        if depth is not None and regex is not None:
            raise UsageError("--partition-depth and --partition-regex cannot be combined")
        if regex is not None:
            return cls(depth=None, regex=regex)
        if depth is not None:
            return cls(depth=depth)
        return None

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> PartitionRule:
        if "regex" in doc:
            return cls(depth=None, regex=str(doc["regex"]))
        return cls(depth=int(doc["depth"]))

    def to_json(self) -> dict[str, Any]:
        return {"regex": self.regex} if self.regex is not None else {"depth": self.depth}

    def describe(self) -> str:
        return (
            f"--partition-regex {self.regex!r}" if self.regex else f"--partition-depth {self.depth}"
        )

    def partition_of(self, relpath: str) -> str | None:
        """The partition path of ``relpath`` (``/``-separated), or None if it is in none."""
        if self.regex is not None:
            match = re.search(self.regex, relpath)
            if match is None or not match.group("partition"):
                return None
            return match.group("partition").strip("/") or None
        depth = self.depth or 1  # __post_init__ requires depth when there is no regex
        parts = relpath.split("/")
        if len(parts) <= depth:
            return None
        return "/".join(parts[:depth])


@dataclass(frozen=True)
class SourceFile:
    """One sample in the source: its key and the stat of its npz and sidecar."""

    key: str  # relative npz path without .npz
    size: int
    mtime_ns: int
    sidecar_size: int | None = None
    sidecar_mtime_ns: int | None = None

    @property
    def npz(self) -> str:
        return self.key + NPZ

    @property
    def sidecar(self) -> str | None:
        return self.key + SIDECAR if self.sidecar_size is not None else None


@dataclass
class SourcePartition:
    """The files of one partition, sorted by key, and its stat-based fingerprints."""

    id: str
    path: str
    files: list[SourceFile] = field(default_factory=list)

    @property
    def samples(self) -> int:
        return len(self.files)

    @property
    def npz_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def missing_sidecars(self) -> list[str]:
        return [f.npz for f in self.files if f.sidecar_size is None]

    def npz_fingerprint(self) -> str:
        """Hash over (key, size, mtime_ns) of every npz: unchanged tensors, same value."""
        parts = [f"{f.key}\0{f.size}\0{f.mtime_ns}" for f in self.files]
        return short_hash("npz-fingerprint", "\n".join(parts), length=32)

    def fingerprint(self) -> str:
        """The partition's source fingerprint: npz and sidecar stats of every sample."""
        parts = [
            f"{f.key}\0{f.size}\0{f.mtime_ns}\0{f.sidecar_size}\0{f.sidecar_mtime_ns}"
            for f in self.files
        ]
        return short_hash("source-fingerprint", "\n".join(parts), length=32)


@dataclass
class SourceTree:
    """Everything pass 1 found."""

    root: Path
    rule: PartitionRule
    partitions: dict[str, SourcePartition]  # id -> partition, sorted by path
    orphan_sidecars: list[str] = field(default_factory=list)  # sidecars without an npz
    unreadable: list[str] = field(default_factory=list)  # "relpath: reason"
    outside: list[str] = field(default_factory=list)  # npz files in no partition

    @property
    def samples(self) -> int:
        return sum(p.samples for p in self.partitions.values())

    def check_packable(self) -> None:
        """Raise :class:`SourceError` naming the first offending file of each kind."""
        if self.unreadable:
            raise SourceError(
                f"{self.root}: cannot read {len(self.unreadable)} file(s), first: {self.unreadable[0]}"
            )
        if self.orphan_sidecars:
            raise SourceError(
                f"{self.root / self.orphan_sidecars[0]}: sidecar without an npz "
                f"({len(self.orphan_sidecars)} orphan sidecar(s) in the source)"
            )
        if self.outside:
            raise SourceError(
                f"{self.root / self.outside[0]}: not inside any partition under "
                f"{self.rule.describe()} ({len(self.outside)} such file(s))"
            )
        if not self.partitions:
            raise SourceError(f"{self.root}: no .npz files found (empty source)")


def _normalise_relpath(line: str, where: str) -> str:
    rel = line.strip().replace("\\", "/")
    while rel.startswith("./"):
        rel = rel[2:]
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in rel.split("/")):
        raise SourceError(f"{where}: {line.strip()!r} is not a relative path inside the source")
    if not rel.endswith(NPZ):
        raise SourceError(f"{where}: {line.strip()!r} is not an .npz path")
    return rel


def read_path_list(path: str | os.PathLike[str]) -> list[str]:
    """The relative npz paths in a ``--path-list`` file (blank lines and ``#`` comments skipped).

    A path listed twice is a duplicate key: :class:`SourceError` naming the file and the line.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"{path}: cannot read path list ({exc})") from exc
    seen: dict[str, int] = {}
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        rel = _normalise_relpath(line, f"{path}:{number}")
        if rel in seen:
            raise SourceError(
                f"{path}:{number}: duplicate key {rel[: -len(NPZ)]!r} (first on line {seen[rel]})"
            )
        seen[rel] = number
        out.append(rel)
    return out


def _walk(root: Path) -> tuple[list[tuple[str, os.stat_result]], list[str]]:
    """Every regular file under ``root`` as (relpath, stat), plus unreadable entries."""
    files: list[tuple[str, os.stat_result]] = []
    unreadable: list[str] = []
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            with os.scandir(root / rel_dir if rel_dir else root) as it:
                entries = list(it)
        except OSError as exc:
            unreadable.append(f"{rel_dir or '.'}: {exc.strerror or exc}")
            continue
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                st = entry.stat(follow_symlinks=True)
            except OSError as exc:
                if entry.name.endswith((NPZ, SIDECAR)):
                    unreadable.append(f"{rel}: {exc.strerror or exc}")
                continue
            if stat_mod.S_ISDIR(st.st_mode):
                stack.append(rel)
            elif stat_mod.S_ISREG(st.st_mode):
                files.append((rel, st))
            elif entry.name.endswith((NPZ, SIDECAR)):
                unreadable.append(f"{rel}: not a regular file")
    return files, unreadable


def discover(
    source: str | os.PathLike[str],
    rule: PartitionRule | None = None,
    *,
    path_list: Sequence[str] | None = None,
    only_partitions: Iterable[str] | None = None,
    collisions: list[str] | None = None,
) -> SourceTree:
    """Pass 1: find samples, group them into partitions and stat them. Reads no file contents.

    ``path_list`` (relative npz paths) scopes discovery to those files; ``only_partitions``
    (ids or partition paths) keeps only those partitions. Two partition paths with the same id
    are a hard :class:`SourceError` (with ``collisions`` given, they are appended there instead
    and the second partition is merged into nothing: ``inspect`` reports them). Unreadable entries and orphan sidecars are collected, not
    raised (``inspect`` reports them; :meth:`SourceTree.check_packable` refuses them).
    """
    root = Path(source)
    if not root.is_dir():
        raise SourceError(f"{root}: source is not a directory")
    rule = rule or PartitionRule()
    unreadable: list[str] = []
    npz: dict[str, os.stat_result] = {}
    sidecars: dict[str, os.stat_result] = {}
    if path_list is None:
        files, unreadable = _walk(root)
        for rel, st in files:
            if rel.endswith(NPZ):
                npz[rel[: -len(NPZ)]] = st
            elif rel.endswith(SIDECAR):
                sidecars[rel[: -len(SIDECAR)]] = st
        orphans = sorted(k + SIDECAR for k in sidecars if k not in npz)
    else:
        orphans = []
        for rel in path_list:
            key = rel[: -len(NPZ)]
            if key in npz:  # read_path_list already refuses these; direct API callers too
                raise SourceError(f"{root / rel}: duplicate key {key!r} in the path list")
            try:
                st = os.stat(root / rel)
            except OSError as exc:
                unreadable.append(f"{rel}: {exc.strerror or exc}")
                continue
            if not stat_mod.S_ISREG(st.st_mode):
                unreadable.append(f"{rel}: not a regular file")
                continue
            npz[key] = st
            try:
                sidecars[key] = os.stat(root / (key + SIDECAR))
            except FileNotFoundError:
                pass
            except OSError as exc:
                unreadable.append(f"{key + SIDECAR}: {exc.strerror or exc}")
    wanted = set(only_partitions) if only_partitions is not None else None
    by_path: dict[str, SourcePartition] = {}
    ids: dict[str, str] = {}
    outside: list[str] = []
    for key in sorted(npz):
        ppath = rule.partition_of(key + NPZ)
        if ppath is None:
            outside.append(key + NPZ)
            continue
        part = by_path.get(ppath)
        if part is None:
            pid = partition_id(ppath)
            if pid in ids and ids[pid] != ppath:
                message = (
                    f"{root}: partitions {ids[pid]!r} and {ppath!r} have the same id {pid}; "
                    "rename one of them or choose another partition rule"
                )
                if collisions is None:
                    raise SourceError(message)
                collisions.append(message)
                continue
            ids[pid] = ppath
            part = by_path[ppath] = SourcePartition(pid, ppath)
        st = npz[key]
        side = sidecars.get(key)
        part.files.append(
            SourceFile(
                key,
                st.st_size,
                st.st_mtime_ns,
                side.st_size if side is not None else None,
                side.st_mtime_ns if side is not None else None,
            )
        )
    if wanted is not None:
        unknown = wanted - {p.id for p in by_path.values()} - set(by_path)
        if unknown:
            raise UsageError(f"--partition: no partition {sorted(unknown)[0]!r} in {root}")
        by_path = {k: p for k, p in by_path.items() if p.id in wanted or p.path in wanted}
    partitions = {p.id: p for p in sorted(by_path.values(), key=lambda p: p.path)}
    return SourceTree(root, rule, partitions, orphans, sorted(unreadable), outside)


def inspect_source(
    source: str | os.PathLike[str],
    *,
    partition_depth: int | None = None,
    partition_regex: str | None = None,
    path_list: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Read-only report of a source: per partition the sample, skipped, missing-sidecar and byte
    counts; plus id collisions, unreadable files, orphan sidecars, malformed sidecars."""
    from .sidecar import is_skipped, read_sidecar

    rule = PartitionRule.from_options(partition_depth, partition_regex) or PartitionRule()
    paths = read_path_list(path_list) if path_list is not None else None
    collisions: list[str] = []
    tree = discover(source, rule, path_list=paths, collisions=collisions)
    bad_sidecars: list[str] = []
    rows = []
    for part in tree.partitions.values():
        skipped = 0
        sidecar_bytes = 0
        for f in part.files:
            if f.sidecar_size is None:
                continue
            sidecar_bytes += f.sidecar_size
            try:
                skipped += is_skipped(read_sidecar(tree.root / (f.key + SIDECAR)))
            except SourceError as exc:
                bad_sidecars.append(str(exc))
        rows.append(
            {
                "id": part.id,
                "path": part.path,
                "samples": part.samples,
                "skipped": skipped,
                "missing_sidecars": len(part.missing_sidecars),
                "npz_bytes": part.npz_bytes,
                "sidecar_bytes": sidecar_bytes,
                "fingerprint": part.fingerprint(),
            }
        )
    return {
        "source": str(tree.root),
        "partition_rule": rule.to_json(),
        "partitions": rows,
        "samples": sum(r["samples"] for r in rows),
        "skipped": sum(r["skipped"] for r in rows),
        "missing_sidecars": sum(r["missing_sidecars"] for r in rows),
        "npz_bytes": sum(r["npz_bytes"] for r in rows),
        "collisions": collisions,
        "unreadable": tree.unreadable,
        "orphan_sidecars": tree.orphan_sidecars,
        "outside_partitions": tree.outside,
        "bad_sidecars": bad_sidecars,
    }
