"""The root index ``index.json`` (docs/format.md, section 12), pure: its bytes and their check.

What a reader that cannot list (a static HTTP server) needs to resolve ``latest``, a tag or a
keyset with GET alone: the commit the state was taken from, the state itself (live tags with
their version hashes, pruned tags, ``latest``) and every live keyset with the SHA-256 and size
of its object. Canonical JSON, sealed with ``index_sha256`` over the rest of the document.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import FormatError, UsageError
from .layout import check_name

__all__ = [
    "INDEX_SCHEMA",
    "IndexListing",
    "KeysetRef",
    "RootIndex",
]

INDEX_SCHEMA = "shardlake.index/1"
INDEX_DIGEST = "index_sha256"


def _canonical(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class KeysetRef:
    """A live keyset as the index names it: ``sha256hex`` and byte length of its parquet."""

    sha256: str
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "size": self.size}


@dataclass(frozen=True)
class RootIndex:
    """The root index document; :meth:`to_bytes` / :meth:`from_bytes` are its stored form."""

    commit: int
    versions: tuple[tuple[str, str], ...] = ()  # live [tag, version_hash], publish order
    retired: tuple[str, ...] = ()  # pruned tags (the key "retired" of docs/format.md)
    latest: str | None = None
    keysets: Mapping[str, KeysetRef] = field(default_factory=dict)
    written_at: str = ""

    def same_content(self, other: RootIndex) -> bool:
        """Equal but for when it was written."""
        return (self.commit, self.versions, self.retired, self.latest, dict(self.keysets)) == (
            other.commit,
            other.versions,
            other.retired,
            other.latest,
            dict(other.keysets),
        )

    def to_bytes(self) -> bytes:
        body = {
            "format": INDEX_SCHEMA,
            "commit": self.commit,
            "state": {
                "versions": [[t, h] for t, h in self.versions],
                "retired": list(self.retired),
                "latest": self.latest,
            },
            "keysets": {name: ref.to_json() for name, ref in sorted(self.keysets.items())},
            "written_at": self.written_at,
        }
        return _canonical({**body, INDEX_DIGEST: hashlib.sha256(_canonical(body)).hexdigest()})

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> RootIndex:
        """The index, refused (naming ``where``) unless its digest and shape check out."""
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise FormatError(f"{where}: not valid JSON ({exc})") from exc
        if not isinstance(doc, dict) or doc.get("format") != INDEX_SCHEMA:
            found = doc.get("format") if isinstance(doc, dict) else None
            raise FormatError(f"{where}: not a shardlake root index (format {found!r})")
        body = {k: v for k, v in doc.items() if k != INDEX_DIGEST}
        if hashlib.sha256(_canonical(body)).hexdigest() != doc.get(INDEX_DIGEST):
            raise FormatError(f"{where}: content does not match its {INDEX_DIGEST}")
        try:
            state = doc["state"]
            versions = tuple((str(t), str(h)) for t, h in state["versions"])
            keysets = {
                str(name): KeysetRef(str(ref["sha256"]), int(ref["size"]))
                for name, ref in doc["keysets"].items()
            }
            commit = doc["commit"]
            if not isinstance(commit, int) or commit < 0:
                raise ValueError(f"commit {commit!r}")
            return cls(
                commit=commit,
                versions=versions,
                retired=tuple(str(t) for t in state["retired"]),
                latest=state["latest"],
                keysets=keysets,
                written_at=str(doc.get("written_at", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise FormatError(f"{where}: malformed root index ({exc!r})") from exc


@dataclass(frozen=True)
class IndexListing:
    """What a reader that cannot list takes from the index in place of listings: the commit it
    names and the size of each live keyset. Shape-checked only: what is read through it is
    checked on its own (the index's digest is :meth:`RootIndex.from_bytes`'s check)."""

    commit: int
    keysets: Mapping[str, int] = field(default_factory=dict)  # name -> parquet size

    @classmethod
    def from_bytes(cls, data: bytes) -> IndexListing:
        """The listing facts of an index; :class:`ValueError` saying what is wrong."""
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("format") != INDEX_SCHEMA:
                raise ValueError(f"format {doc.get('format') if isinstance(doc, dict) else doc!r}")
            commit = doc["commit"]
            keysets = doc["keysets"]
            if not isinstance(commit, int) or commit < 0 or not isinstance(keysets, dict):
                raise ValueError("commit or keysets malformed")
            sizes: dict[str, int] = {}
            for name, ref in keysets.items():
                if not _is_name(name) or not isinstance(ref, dict):
                    raise ValueError(f"keyset entry {name!r} malformed")
                sizes[name] = int(ref.get("size") or 0)
        except (KeyError, TypeError) as exc:
            raise ValueError(str(exc)) from None
        return cls(commit, sizes)


def _is_name(name: object) -> bool:
    try:
        check_name("keyset", str(name))
    except UsageError:
        return False
    return isinstance(name, str)
