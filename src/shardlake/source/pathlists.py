"""The one path-list parser: the lists of frames people already have, in the forms they have.

A path list is either newline text (one entry a line; blank lines and ``#`` lines skipped) or a
JSON list of strings (the training lists of absolute ``.npz`` paths). Entries are relative to a
source tree, or absolute: an absolute entry is mapped by removing ``strip_prefix``, or, without
one, automatically when it lies under the source. Every error names the list, the first
offending entry (shortened, never the whole file) and its line (text) or index (JSON).

Used by ``pack``/``inspect``/``verify`` (:func:`source_npz_paths`) and by keysets
(:func:`map_keys`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import SourceError

__all__ = [
    "NPZ",
    "KeyMapping",
    "PathEntry",
    "is_json_list",
    "map_keys",
    "parse_entries",
    "read_entries",
    "source_npz_paths",
]

NPZ = ".npz"
SHOWN_CHARS = 120


@dataclass(frozen=True)
class PathEntry:
    """One entry of a path list and where it was read (``list.txt:3`` or ``list.json[2]``)."""

    text: str
    where: str


def shorten(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` as a repr, cut to ``limit`` characters so an error never echoes a whole file."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def parse_entries(data: bytes | str, where: str) -> list[PathEntry]:
    """The entries of a path list (text or a JSON list), each with its line or index."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SourceError(f"{where}: path list is not UTF-8 text ({exc})") from exc
    else:
        text = data
    if text.lstrip().startswith("["):
        return _json_entries(text, where)
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        entry = line.strip()
        if entry and not entry.startswith("#"):
            out.append(PathEntry(entry, f"{where}:{number}"))
    return out


def _json_entries(text: str, where: str) -> list[PathEntry]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(
            f"{where}:{exc.lineno}: not a valid JSON list ({exc.msg} at column {exc.colno})"
        ) from exc
    if not isinstance(doc, list):
        raise SourceError(f"{where}: a JSON path list must be a list of strings")
    out = []
    for index, item in enumerate(doc):
        if not isinstance(item, str) or not item.strip():
            raise SourceError(
                f"{where}[{index}]: entry {shorten(json.dumps(item))} is not a path string"
            )
        out.append(PathEntry(item.strip(), f"{where}[{index}]"))
    return out


def read_entries(path: str | os.PathLike[str]) -> list[PathEntry]:
    """:func:`parse_entries` over a local file (``-`` reads standard input)."""
    try:
        data = sys.stdin.buffer.read() if str(path) == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise SourceError(f"{path}: cannot read path list ({exc.strerror or exc})") from exc
    return parse_entries(data, str(path))


def _prefix(strip_prefix: str | None) -> str | None:
    return strip_prefix.rstrip("/") + "/" if strip_prefix else None


def _relative(entry: PathEntry, source: str | None, prefix: str | None) -> str | None:
    """The entry as a ``/``-separated path relative to the source, or None if unmappable."""
    text = entry.text.replace("\\", "/")
    if prefix is not None and text.startswith(prefix):
        text = text[len(prefix) :]
    elif text.startswith("/"):
        if source is None:
            return None
        rel = os.path.relpath(os.path.normpath(text), source).replace("\\", "/")
        if rel == ".." or rel.startswith("../"):
            return None
        text = rel
    while text.startswith("./"):
        text = text[2:]
    if not text or any(p in ("", ".", "..") for p in text.split("/")):
        raise SourceError(
            f"{entry.where}: {shorten(entry.text)} is not a relative path inside the source"
        )
    return text


def source_npz_paths(
    entries: Sequence[PathEntry],
    source: str | os.PathLike[str] | None,
    *,
    strip_prefix: str | None = None,
) -> list[str]:
    """The relative ``.npz`` paths of ``entries`` inside ``source``, in list order.

    Relative entries are taken as they are; absolute ones lose ``strip_prefix`` or, without it,
    the source's own absolute path. Refuses (naming the first such entry) entries outside the
    source, entries that are not ``.npz`` paths and duplicates. Without ``source`` an absolute
    entry maps only through ``strip_prefix``.
    """
    root = os.path.abspath(source) if source is not None else None
    prefix = _prefix(strip_prefix)
    seen: dict[str, str] = {}
    out = []
    for entry in entries:
        rel = _relative(entry, root, prefix)
        if rel is None:
            how = (
                f"the stripped prefix {strip_prefix}"
                if strip_prefix
                else f"the source {root or '?'}"
            )
            raise SourceError(
                f"{entry.where}: {shorten(entry.text)} is absolute but not under {how}; a list "
                "written elsewhere needs its old root as the prefix to strip",
                options=("strip_prefix",),
            )
        if not rel.endswith(NPZ):
            raise SourceError(f"{entry.where}: {shorten(entry.text)} is not an .npz path")
        if rel in seen:
            raise SourceError(
                f"{entry.where}: duplicate key {rel[: -len(NPZ)]!r} (first at {seen[rel]})"
            )
        seen[rel] = entry.where
        out.append(rel)
    return out


@dataclass(frozen=True)
class KeyMapping:
    """Keys mapped from a list: ``keys`` in list order, ``unmapped`` entries, and for each key
    the local path of its listed file when the entry named one (to look at its sidecar)."""

    keys: list[str]
    unmapped: list[str]
    local_paths: dict[str, str]


def map_keys(
    entries: Sequence[PathEntry],
    *,
    strip_prefix: str | None = None,
    json_list: bool = False,
    source: str | None = None,
) -> KeyMapping:
    """Sample keys from path-list entries (for keysets and ``remove``).

    With ``strip_prefix`` every entry must start with the prefix, which is removed along with a
    trailing ``.npz``; entries that do not are returned as ``unmapped``. Without it, an absolute
    entry under ``source`` (the packed source's absolute path) is mapped relative to it, another
    absolute entry is ``unmapped``, and a relative entry is a key as it stands (a trailing
    ``.npz`` is dropped from JSON lists).
    """
    prefix = _prefix(strip_prefix) or (_prefix(source) if source else None)
    keys: list[str] = []
    unmapped: list[str] = []
    local: dict[str, str] = {}
    for entry in entries:
        key = entry.text
        if prefix is not None and key.startswith(prefix):
            key = key[len(prefix) :]
        elif strip_prefix or (os.path.isabs(key) and source):
            unmapped.append(entry.text)
            continue
        if key.endswith(NPZ) and (key != entry.text or json_list):
            if os.path.isabs(entry.text):
                local[key[: -len(NPZ)]] = entry.text
            key = key[: -len(NPZ)]
        keys.append(key)
    return KeyMapping(keys, unmapped, local)


def is_json_list(data: bytes | str) -> bool:
    """Whether ``data`` is a JSON path list rather than newline text."""
    head = data.lstrip()[:1]
    return head in (b"[", "[")
