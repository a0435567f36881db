"""Pass 1 of a pack: discover a source tree, group files into partitions, fingerprint them.

The source is a local directory (or NFS mount). A **frame** is an ``<name>.npz`` file; its sidecar
is the ``<name>.json`` beside it; every other file (a converter's ``routes/*.json`` summaries,
logs, JSON without an npz) is "not a frame": reported by ``inspect``, ignored by ``pack`` unless
``strict``. A sample key is the npz path relative to the source without ``.npz``.

The **source fingerprint** of a partition is stat-based: a hash over every sample's relative
path, size and ``mtime_ns`` of its npz and of its sidecar (or "no sidecar"). It costs one
``stat`` per file, so a 5-million-file corpus is fingerprinted without reading it; touching a
file (new mtime) makes the partition rebuild, which is safe because revisions are content
hashes: an unchanged content yields the same ``data_rev`` and the existing shards are reused.
"""

from __future__ import annotations

import concurrent.futures as cf
import fnmatch
import os
import re
import stat as stat_mod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SourceError, UsageError
from ..format.layout import partition_id, short_hash
from ..progress.bar import plural
from .pathlists import read_entries, source_npz_paths

__all__ = [
    "NPZ",
    "SIDECAR",
    "PartitionRule",
    "SourcePartition",
    "SourceTree",
    "discover",
    "inspect_source",
    "read_path_list",
    "scoped_frame_keys",
]

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
                    f"partition regex {self.regex!r} is not a valid regex ({exc})",
                    options=("partition_regex",),
                ) from exc
            if "partition" not in compiled.groupindex:
                raise UsageError(
                    f"partition regex {self.regex!r} needs a named group (?P<partition>...)",
                    options=("partition_regex",),
                )
        elif self.depth is None or self.depth < 1:
            raise UsageError("partition_depth must be >= 1", options=("partition_depth",))

    @classmethod
    def from_options(cls, depth: int | None, regex: str | None) -> PartitionRule | None:
        """The rule the options ask for, or None when neither is given (inherit / default)."""
        if depth is not None and regex is not None:
            raise UsageError(
                "partition_depth and partition_regex cannot be combined",
                options=("partition_depth", "partition_regex"),
            )
        if regex is not None:
            return cls(depth=None, regex=regex)
        if depth is not None:
            return cls(depth=depth)
        return None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PartitionRule:
        if "regex" in doc:
            return cls(depth=None, regex=str(doc["regex"]))
        return cls(depth=int(doc["depth"]))

    def to_json(self) -> dict[str, Any]:
        return {"regex": self.regex} if self.regex is not None else {"depth": self.depth}

    def describe(self) -> str:
        # Neutral words: this text reaches both the Python API and the CLI.
        return f"partition regex {self.regex!r}" if self.regex else f"partition depth {self.depth}"

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
    not_frames: list[str] = field(default_factory=list)  # neither an npz nor an npz's sidecar
    unreadable: list[str] = field(default_factory=list)  # "relpath: reason"
    outside: list[str] = field(default_factory=list)  # npz files in no partition
    excluded: int = 0  # files left out by --include/--exclude

    @property
    def samples(self) -> int:
        return sum(p.samples for p in self.partitions.values())

    def check_packable(self, *, strict: bool = False) -> None:
        """Raise :class:`SourceError` naming the first offending file of each kind; files that
        are not frames are ignored unless ``strict``."""
        if self.unreadable:
            raise SourceError(
                f"{self.root}: cannot read {plural(len(self.unreadable), 'file')}, first: {self.unreadable[0]}"
            )
        if strict and self.not_frames:
            raise SourceError(
                f"{self.root / self.not_frames[0]}: not a frame (.npz) nor a frame's sidecar "
                f"({len(self.not_frames)} such file(s)); strict discovery refuses them: pack "
                "without strict to ignore them, or leave them out with an exclude glob",
                options=("strict", "exclude"),
            )
        if self.outside:
            raise SourceError(
                f"{self.root / self.outside[0]}: not inside any partition under "
                f"{self.rule.describe()} ({len(self.outside)} such file(s))"
            )
        if not self.partitions:
            raise SourceError(f"{self.root}: no .npz files found (empty source)")


def read_path_list(
    path: str | os.PathLike[str],
    source: str | os.PathLike[str] | None = None,
    *,
    strip_prefix: str | None = None,
) -> list[str]:
    """The relative npz paths of a ``--path-list`` file (text or JSON, relative or absolute
    entries; see :mod:`shardlake.source.pathlists`). Without ``source`` only relative entries map."""
    return source_npz_paths(read_entries(path), source, strip_prefix=strip_prefix)


def scoped_frame_keys(
    frames: Iterable[str],
    *,
    source: str | os.PathLike[str] | None = None,
    path_list: str | os.PathLike[str] | None = None,
    strip_prefix: str | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> set[str]:
    """Those of ``frames`` (the keys of a source tree's npz files) that a pack with these
    scoping options would consider (for ``verify``): named by ``path_list`` (its absolute
    entries map through ``strip_prefix``, or ``source``, the tree's local path, if it has one)
    and passing the globs."""
    if path_list is not None:
        rels = read_path_list(path_list, source, strip_prefix=strip_prefix)
        listed = {rel[: -len(NPZ)] for rel in rels}
        frames = [key for key in frames if key in listed]
    return {key for key in frames if _selected(key + NPZ, include, exclude)}


def _selected(rel: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    """Whether ``rel`` passes the ``--include``/``--exclude`` globs (``*`` also crosses ``/``)."""
    if include and not any(fnmatch.fnmatchcase(rel, g) for g in include):
        return False
    return not any(fnmatch.fnmatchcase(rel, g) for g in exclude)


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
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> SourceTree:
    """Pass 1: find frames, group them into partitions and stat them. Reads no file contents.

    A frame is an ``.npz``; its sidecar is the ``.json`` with the same stem beside it; every
    other file (route summaries, logs, JSON without an npz) is listed in ``not_frames``.
    ``include``/``exclude`` globs (relative paths) choose which frames and other files are
    considered; a sidecar follows its frame. ``path_list`` (relative npz paths) scopes discovery
    to those files; ``only_partitions`` (ids or partition paths) keeps only those partitions.
    Two partition paths with the same id are a hard :class:`SourceError` (with ``collisions``
    given, they are appended there instead and the second partition is left out: ``inspect``
    reports them). Unreadable entries are collected, not raised (``inspect`` reports them;
    :meth:`SourceTree.check_packable` refuses them).
    """
    root = Path(source)
    if not root.is_dir():
        raise SourceError(f"{root}: source is not a directory")
    rule = rule or PartitionRule()
    if path_list is None:
        npz, sidecars, not_frames, unreadable, excluded = _scan_tree(root, include, exclude)
    else:
        chosen = [rel for rel in path_list if _selected(rel, include, exclude)]
        npz, sidecars, unreadable = _stat_listed(root, chosen)
        not_frames, excluded = [], len(path_list) - len(chosen)
    by_path, outside = _group_partitions(root, rule, npz, sidecars, collisions)
    if only_partitions is not None:
        by_path = _only(root, by_path, set(only_partitions))
    partitions = {p.id: p for p in sorted(by_path.values(), key=lambda p: p.path)}
    return SourceTree(root, rule, partitions, not_frames, sorted(unreadable), outside, excluded)


def _group_partitions(
    root: Path,
    rule: PartitionRule,
    npz: dict[str, os.stat_result],
    sidecars: dict[str, os.stat_result],
    collisions: list[str] | None,
) -> tuple[dict[str, SourcePartition], list[str]]:
    """Frames grouped by partition path (sorted keys), and the frames no partition holds."""
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
    return by_path, outside


def _only(
    root: Path, by_path: dict[str, SourcePartition], wanted: set[str]
) -> dict[str, SourcePartition]:
    """The partitions ``wanted`` names (by id or path); an unknown name is refused."""
    unknown = wanted - {p.id for p in by_path.values()} - set(by_path)
    if unknown:
        raise UsageError(f"no partition {sorted(unknown)[0]!r} in {root}", options=("partitions",))
    return {k: p for k, p in by_path.items() if p.id in wanted or p.path in wanted}


def _scan_tree(
    root: Path, include: Sequence[str], exclude: Sequence[str]
) -> tuple[dict[str, os.stat_result], dict[str, os.stat_result], list[str], list[str], int]:
    """Walk ``root``: frames and sidecars by key, other files, unreadable entries, excluded."""
    files, unreadable = _walk(root)
    frames: dict[str, os.stat_result] = {}
    excluded = 0
    for rel, st in files:
        if rel.endswith(NPZ):
            if _selected(rel, include, exclude):
                frames[rel[: -len(NPZ)]] = st
            else:
                excluded += 1
    sidecars: dict[str, os.stat_result] = {}
    not_frames: list[str] = []
    for rel, st in files:
        if rel.endswith(NPZ):
            continue
        stem = rel[: -len(SIDECAR)] if rel.endswith(SIDECAR) else None
        if stem is not None and stem in frames:
            sidecars[stem] = st  # a sidecar follows its frame
        elif _selected(rel, include, exclude):
            not_frames.append(rel)
        else:
            excluded += 1
    return frames, sidecars, sorted(not_frames), unreadable, excluded


def _stat_listed(
    root: Path, path_list: Sequence[str]
) -> tuple[dict[str, os.stat_result], dict[str, os.stat_result], list[str]]:
    """Stat the listed npz files and their sidecars: frames, sidecars, unreadable entries."""
    npz: dict[str, os.stat_result] = {}
    sidecars: dict[str, os.stat_result] = {}
    unreadable: list[str] = []
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
    return npz, sidecars, unreadable


# inspect suggests a deeper partition rule when depth 1 gives fewer than this many partitions
# and the directories that hold the frames give at least SUGGEST_FACTOR times as many.
SUGGEST_BELOW = 16
SUGGEST_FACTOR = 4


def suggest_depth(tree: SourceTree) -> str | None:
    """A hint when depth-1 partitions are very few and very large, with the numbers; else None.

    The suggested depth is that of the shallowest directory holding frames directly (a
    converter's log directory, e.g. ``<location>/<split>/<date>/<time>`` = 4).
    """
    if tree.rule.regex is not None or tree.rule.depth != 1:
        return None
    keys = [f.key for p in tree.partitions.values() for f in p.files]
    if not keys:
        return None
    depth = min(k.count("/") for k in keys)
    if depth <= 1:
        return None
    shallow = len(tree.partitions)
    counts: dict[str, int] = {}
    for key in keys:
        prefix = "/".join(key.split("/")[:depth])
        counts[prefix] = counts.get(prefix, 0) + 1
    if shallow >= SUGGEST_BELOW or len(counts) < SUGGEST_FACTOR * shallow:
        return None
    largest = max(p.samples for p in tree.partitions.values())
    sizes = sorted(counts.values())
    return (
        f"partition depth 1 gives {plural(shallow, 'partition')} of up to {plural(largest, 'frame')}; the frames "
        f"sit {depth} directories deep: partition depth {depth} gives {plural(len(counts), 'partition')} "
        f"of {sizes[0]}..{plural(sizes[-1], 'frame')} (median {sizes[len(sizes) // 2]})"
    )


def inspect_source(
    source: str | os.PathLike[str],
    *,
    partition_depth: int | None = None,
    partition_regex: str | None = None,
    path_list: str | os.PathLike[str] | None = None,
    strip_prefix: str | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    check_frames: bool = True,
) -> dict[str, Any]:
    """Read-only report of a source: per partition the sample, skipped, missing-sidecar and byte
    counts; plus id collisions, unreadable files, files that are not frames, malformed
    sidecars, and a partition-depth suggestion when depth 1 gives very few, very large
    partitions.

    ``check_frames``: read every ``.npz`` as pack would (zip structure, every member inflated
    and CRC-checked, dtypes) and list each one that cannot be packed under ``unreadable``;
    False lists and stats files only (fast on huge trees)."""
    rule = PartitionRule.from_options(partition_depth, partition_regex) or PartitionRule()
    paths = (
        read_path_list(path_list, source, strip_prefix=strip_prefix)
        if path_list is not None
        else None
    )
    collisions: list[str] = []
    tree = discover(
        source, rule, path_list=paths, collisions=collisions, include=include, exclude=exclude
    )
    bad_sidecars: list[str] = []
    rows = [_inspect_partition(tree.root, part, bad_sidecars) for part in tree.partitions.values()]
    unreadable = list(tree.unreadable)
    if check_frames:
        unreadable += _frame_problems(tree)
    return {
        "source": str(tree.root),
        "partition_rule": rule.to_json(),
        "partitions": rows,
        "samples": sum(r["samples"] for r in rows),
        "skipped": sum(r["skipped"] for r in rows),
        "missing_sidecars": sum(r["missing_sidecars"] for r in rows),
        "npz_bytes": sum(r["npz_bytes"] for r in rows),
        "collisions": collisions,
        "unreadable": unreadable,
        "not_frames": tree.not_frames,
        "excluded": tree.excluded,
        "outside_partitions": tree.outside,
        "bad_sidecars": bad_sidecars,
        "suggestion": suggest_depth(tree),
    }


def _frame_problem(root: Path, key: str) -> str | None:
    """Why the frame ``key`` cannot be packed (``relpath: reason``), or None."""
    from ..format.codec import check_array
    from .npz import load_npz

    rel = key + NPZ
    try:
        data = (root / rel).read_bytes()
    except OSError as exc:
        return f"{rel}: cannot read ({exc.strerror or exc})"
    try:
        for name, array in load_npz(data, rel).items():
            check_array(name, array, rel)
    except SourceError as exc:
        return str(exc)
    return None


def _frame_problems(tree: SourceTree) -> list[str]:
    """Every frame of ``tree`` that cannot be packed, in key order (a few threads: reading
    and inflating release the GIL)."""
    keys = [f.key for part in tree.partitions.values() for f in part.files]
    with cf.ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:
        found = pool.map(lambda key: _frame_problem(tree.root, key), keys, chunksize=64)
        return sorted(p for p in found if p is not None)


def _inspect_partition(
    root: Path, part: SourcePartition, bad_sidecars: list[str]
) -> dict[str, Any]:
    """One partition's row of :func:`inspect_source`; unreadable sidecars go to ``bad_sidecars``."""
    from .sidecar import is_skipped, read_sidecar

    skipped = 0
    sidecar_bytes = 0
    for f in part.files:
        if f.sidecar_size is None:
            continue
        sidecar_bytes += f.sidecar_size
        try:
            skipped += is_skipped(read_sidecar(root / (f.key + SIDECAR)))
        except SourceError as exc:
            bad_sidecars.append(str(exc))
    return {
        "id": part.id,
        "path": part.path,
        "samples": part.samples,
        "skipped": skipped,
        "missing_sidecars": len(part.missing_sidecars),
        "npz_bytes": part.npz_bytes,
        "sidecar_bytes": sidecar_bytes,
        "fingerprint": part.fingerprint(),
    }
