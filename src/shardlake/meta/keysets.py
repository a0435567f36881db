"""Keysets: named, immutable sample selections bound to one version's hash.

A keyset is ``keysets/<name>.parquet`` with columns ``key`` and ``partition`` (in the order of
the key list it was made from; made by ``where``, sorted by key) and
``shardlake.*`` key-value metadata naming the dataset, the version tag and hash it was made
from, and how it was made. It is published with create-if-absent, so it is never overwritten,
and using it with any other version is refused (:meth:`Keyset.check_version`).

Selecting the keys (by ``where`` or a key list) is the query layer's
(:mod:`shardlake.query.keyset_build`); this module stores, reads and lists keysets.

For the loader: ``load_keyset(store, name)`` returns a :class:`Keyset` with ``version_tag``,
``version_hash`` and ``keys``.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import (
    AlreadyExistsError,
    ConflictError,
    FormatError,
    NotFoundError,
    SelectionError,
    SourceError,
)
from ..format.layout import KEYSETS_DIR, check_name, keyset_key, natural_key
from ..read.verified import read_verified
from ..source import pathlists
from ..store import Store
from .commits import read_state, refresh_index
from .rootindex import check_indexed, indexed_keyset, write_index
from .rootmarker import ensure_root, require_root
from .state import canonical_json, utc_now
from .versions import StoredVersion

__all__ = [
    "Keyset",
    "KeysetObject",
    "content_digest",
    "decode_keyset",
    "delete_keyset",
    "is_retired",
    "list_keyset_names",
    "list_keysets",
    "load_keyset",
    "load_keyset_bytes",
    "load_keyset_object",
    "publish_keyset",
    "read_key_list",
    "redact_keyset",
    "reindex_keysets",
    "referenced_versions",
    "tombstone_key",
]

KEYSET_SCHEMA = "shardlake.keyset/1"
_PREFIX = "shardlake."


@dataclass(frozen=True)
class Keyset:
    """A published keyset."""

    name: str
    version_tag: str
    version_hash: str
    keys: list[str]
    partitions: list[str] = field(default_factory=list)  # per key, same order
    dataset_id: str = ""
    recipe: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""
    rebased_from: str = ""  # "NAME@hash" of the keyset it was rebased from, if any

    def __len__(self) -> int:
        return len(self.keys)

    def check_version(self, version: StoredVersion) -> None:
        """Refuse to use this keyset with any version but the one it was made from."""
        if version.hash != self.version_hash:
            raise SelectionError(
                f"keyset {self.name!r} is bound to version {self.version_tag!r} "
                f"({self.version_hash}), not {version.tag!r} ({version.hash}); carry it to that "
                f"version as a new keyset with Root.keysets.rebase({self.name!r}, "
                f"{version.tag!r}, new_name=...)",
                hint=f"shardlake keyset ROOT rebase {self.name} --version {version.tag} "
                "--as NEW_NAME",
            )

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version_tag,
            "version_hash": self.version_hash,
            "samples": len(self.keys),
            "partitions": len(set(self.partitions)),
            "dataset_id": self.dataset_id,
            "recipe": self.recipe,
            "created_at": self.created_at,
            "rebased_from": self.rebased_from or None,
        }


# --- key lists -------------------------------------------------------------------------------


def _map(
    data: bytes, where: str, strip_prefix: str | None, source: str | None
) -> pathlists.KeyMapping:
    try:
        entries = pathlists.parse_entries(data, where)
    except SourceError as exc:
        raise SelectionError(str(exc)) from exc
    return pathlists.map_keys(
        entries, strip_prefix=strip_prefix, json_list=pathlists.is_json_list(data), source=source
    )


def read_key_list(
    path: str, *, strip_prefix: str | None = None, source: str | None = None
) -> pathlists.KeyMapping:
    """The keys of a local key-list file (or ``-`` for stdin), with the local file each
    absolute entry names (so that a key matching nothing can be told to be a skipped frame).

    ``source`` (the version's ``source_namespace``) maps absolute entries under it without a
    ``strip_prefix``."""
    import sys

    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except OSError as exc:
        raise SelectionError(f"cannot read key list {path}: {exc.strerror or exc}") from exc
    return _map(data, path, strip_prefix, source)


# --- create / load ---------------------------------------------------------------------------


def _encode(
    name: str,
    rows: pa.Table,
    version: StoredVersion,
    dataset_id: str,
    recipe: dict[str, Any],
    rebased_from: str = "",
) -> tuple[bytes, Keyset]:
    """The keyset object's bytes, and the keyset they decode to (made from the same lists,
    not decoded again: at 2M keys that is a second ~1 s)."""
    rows = rows.select(["key", "partition"])  # in the caller's order (a key list's is kept)
    keys: list[str] = rows.column("key").to_pylist()
    partitions: list[str] = rows.column("partition").to_pylist()
    meta = {
        "format": KEYSET_SCHEMA,
        "name": name,
        "version_tag": version.tag,
        "version_hash": version.hash,
        "dataset_id": dataset_id,
        "recipe": json.dumps(recipe, sort_keys=True),
        "created_at": utc_now(),
        "samples": str(rows.num_rows),
    }
    if rebased_from:
        meta["rebased_from"] = rebased_from
    meta[CONTENT_DIGEST] = content_digest({k: str(v) for k, v in meta.items()}, keys, partitions)
    kv = {(_PREFIX + k).encode(): str(v).encode() for k, v in meta.items()}
    sink = io.BytesIO()
    pq.write_table(rows.replace_schema_metadata(kv), sink, compression="zstd")
    keyset = Keyset(
        name=name,
        version_tag=version.tag,
        version_hash=version.hash,
        keys=keys,
        partitions=partitions,
        dataset_id=dataset_id,
        recipe=json.loads(meta["recipe"]),
        created_at=meta["created_at"],
        rebased_from=rebased_from,
    )
    return sink.getvalue(), keyset


def publish_keyset(
    store: Store,
    name: str,
    rows: pa.Table,
    version: StoredVersion,
    recipe: dict[str, Any],
    *,
    rebased_from: str = "",
) -> Keyset:
    key = keyset_key(name)
    marker = ensure_root(store)
    data, keyset = _encode(name, rows, version, str(marker["dataset_id"]), recipe, rebased_from)
    tomb = tombstone_key(name)
    if store.exists(tomb) and not store.exists(key):
        # The name was retired and its keyset is gone: the new one must not read as retired.
        store.delete(tomb)
    try:
        store.create(key, data)
    except AlreadyExistsError as exc:
        raise ConflictError(
            f"{store.key_url(key)}: keyset {name!r} was created by another writer meanwhile"
        ) from exc
    refresh_index(store)
    return keyset


def redact_keyset(
    store: Store, keyset: Keyset, version: StoredVersion, forgotten: set[str]
) -> Keyset:
    """Rewrite keyset ``keyset.name`` in place (one atomic overwrite): bound to ``version``
    (the redacted successor of its version), without the ``forgotten`` keys. The one case a
    keyset is overwritten: ``forget`` must not leave a forgotten key in any object."""
    pairs = [
        (k, p) for k, p in zip(keyset.keys, keyset.partitions, strict=True) if k not in forgotten
    ]
    rows = pa.table(
        {
            "key": pa.array([k for k, _ in pairs], pa.string()),
            "partition": pa.array([p for _, p in pairs], pa.string()),
        }
    )
    origin = f"{keyset.name}@{keyset.version_hash}"
    recipe = {**keyset.recipe, "redacted_from": origin}
    data, redacted = _encode(
        keyset.name, rows, version, keyset.dataset_id, recipe, keyset.rebased_from
    )
    store.write(keyset_key(keyset.name), data)
    reindex_keysets(store)
    return redacted


def reindex_keysets(store: Store) -> None:
    """Rewrite ``index.json`` hashing every keyset again (after one was rewritten in place)."""
    write_index(store, read_state(store), rehash=True)


# The keyset's digest over its own content (docs/format.md, "Integrity"); older keysets lack it.
CONTENT_DIGEST = "content_sha256"


def content_digest(meta: Mapping[str, str], keys: list[str], partitions: list[str]) -> str:
    """sha256 of the canonical JSON of a keyset's rows and ``shardlake.*`` metadata (without
    the digest itself): any flipped byte that parquet decodes anyway changes it.

    The body is ``{"keys": [...], "metadata": {...}, "partitions": [...]}``; its two long
    lists are written by :func:`_json_strings` (json.dumps takes ~3 s per million keys).
    """
    return _digest(meta, _json_strings(keys), _json_strings(partitions))


def _digest(meta: Mapping[str, str], keys: bytes, partitions: bytes) -> str:
    metadata = canonical_json({k: v for k, v in meta.items() if k != CONTENT_DIGEST})
    h = hashlib.sha256()
    for part in (b'{"keys":', keys, b',"metadata":', metadata, b',"partitions":', partitions):
        h.update(part)
    h.update(b"}")
    return h.hexdigest()


def _json_array(values: pa.Array) -> bytes | None:
    """:func:`_json_strings` of a string array without a Python string a value; None where a
    value is null or needs escaping (the caller takes the list path)."""
    if values.null_count:
        return None
    if len(values) == 0:
        return b"[]"
    if pc.any(pc.match_substring_regex(values, r'[\x00-\x1f"\\]')).as_py():
        return None
    one = pa.LargeListArray.from_arrays(pa.array([0, len(values)], pa.int64()), values)
    joined: str = pc.binary_join(one, pa.scalar('","', pa.large_string()))[0].as_py()
    return b'["' + joined.encode() + b'"]'


# Bytes JSON escapes besides quote and backslash (UTF-8 never uses them inside a character).
_CONTROL_BYTES = bytes(range(0x20))


def _json_strings(values: list[str]) -> bytes:
    """The canonical JSON of a list of strings: joined directly when none needs escaping
    (no quote, backslash or control character), else by :func:`json.dumps`."""
    if not values:
        return b"[]"
    body = '","'.join(values).encode()
    plain = body.count(b'"') == 2 * (len(values) - 1) and b"\\" not in body
    if plain and len(body.translate(None, _CONTROL_BYTES)) == len(body):
        return b'["' + body + b'"]'
    return json.dumps(values, separators=(",", ":"), ensure_ascii=False).encode()


def decode_keyset(data: bytes, name: str, where: str) -> Keyset:
    try:
        # A C++ buffer, not a Python file object: pq.read_table(BytesIO) let an Arrow pool thread
        # drop the last reference to the Python file at interpreter exit -> SIGABRT (issue #10).
        table = pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)
        kv = _footer(table.schema.metadata, where)
        keyset = _bound(
            kv,
            name,
            keys=table.column("key").to_pylist(),
            partitions=table.column("partition").to_pylist(),
        )
    except FormatError:
        raise
    except (pa.ArrowException, OSError, KeyError, ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"{where}: keyset is unreadable ({exc})") from exc
    if int(kv.get("samples", len(keyset.keys))) != len(keyset.keys):
        raise FormatError(f"{where}: keyset row count does not match its metadata")
    digest = kv.get(CONTENT_DIGEST)
    if digest is not None and digest != content_digest(kv, keyset.keys, keyset.partitions):
        raise FormatError(f"{where}: keyset content does not match its {CONTENT_DIGEST}")
    return keyset


def load_keyset(store: Store, name: str) -> Keyset:
    """Read keyset ``name``; :class:`NotFoundError` if there is none."""
    check_name("keyset", name)
    try:
        keyset = load_keyset_bytes(store, name)[0]
        if not is_retired(store, keyset):
            return keyset
    except FileNotFoundError:
        pass
    raise _not_found(store, name) from None


@dataclass(frozen=True)
class KeysetObject:
    """A live keyset's object as read: its bytes, their sha256 (the object's identity: a name
    bound again, or a keyset rewritten by forget, is another object) and its binding read from
    the parquet footer alone (``head``: no keys). The keys (millions of strings, with their
    content digest) are decoded only when :meth:`keyset` is called."""

    head: Keyset
    data: bytes = field(repr=False)
    sha256: str
    where: str

    def keyset(self, store: Store) -> Keyset:
        """The whole keyset, checked against its content digest. Bytes that fail are read
        again as :func:`load_keyset_bytes` does; refused if the object changed meanwhile."""
        try:
            return decode_keyset(self.data, self.head.name, self.where)
        except FormatError:
            keyset, data = load_keyset_bytes(store, self.head.name)
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise ConflictError(f"{self.where}: keyset changed while it was read; try again")
        return keyset

    def key_array(self, store: Store) -> pa.Array:
        """The keyset's keys, first occurrences in its order, as one Arrow string array:
        checked against its content digest in Arrow (no Python string a key) where every key
        is plain (no escape in its JSON), ascending (so each once) and the digest recorded;
        else through :meth:`keyset`."""
        try:
            table = pq.ParquetFile(pa.BufferReader(self.data)).read(use_threads=False)
            meta = {
                k.decode()[len(_PREFIX) :]: v.decode()
                for k, v in (table.schema.metadata or {}).items()
                if k.startswith(_PREFIX.encode())
            }
            keys = table.column("key").combine_chunks().cast(pa.large_string())
            parts = table.column("partition").combine_chunks().cast(pa.large_string())
            body, places = _json_array(keys), _json_array(parts)
            n = len(keys)
            ascending = n < 2 or pc.all(pc.greater(keys.slice(1), keys.slice(0, n - 1))).as_py()
            if (
                body is not None
                and places is not None
                and ascending
                and CONTENT_DIGEST in meta
                and int(meta.get("samples", -1)) == n
                and _digest(meta, body, places) == meta[CONTENT_DIGEST]
            ):
                return keys.cast(pa.string())
        except (pa.ArrowException, OSError, KeyError, ValueError, UnicodeDecodeError):
            pass
        return pa.array(list(dict.fromkeys(self.keyset(store).keys)), pa.string())


def load_keyset_object(store: Store, name: str) -> KeysetObject:
    """Keyset ``name``'s object with only its footer decoded (:class:`NotFoundError` if there
    is none, as :func:`load_keyset`): what a reader needs that may not need its keys."""
    check_name("keyset", name)
    key = keyset_key(name)
    where = store.key_url(key)
    indexed = indexed_keyset(store, name)

    def check(data: bytes) -> Keyset:
        check_indexed(indexed, data, where)
        return _decode_head(data, name, where)

    try:
        head, data = read_verified(store, key, check)
        if not is_retired(store, head):
            return KeysetObject(head, data, hashlib.sha256(data).hexdigest(), where)
    except FileNotFoundError:
        pass
    raise _not_found(store, name) from None


def _decode_head(data: bytes, name: str, where: str) -> Keyset:
    """A keyset's binding from its parquet footer (``keys`` left empty)."""
    try:
        kv = _footer(pq.ParquetFile(pa.BufferReader(data)).schema_arrow.metadata, where)
        return _bound(kv, name, keys=[], partitions=[])
    except FormatError:
        raise
    except (pa.ArrowException, OSError, KeyError, ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"{where}: keyset is unreadable ({exc})") from exc


def _footer(metadata: Mapping[bytes, bytes] | None, where: str) -> dict[str, str]:
    """A keyset object's own key-value metadata, refused unless it names the keyset schema."""
    kv = {
        k.decode()[len(_PREFIX) :]: v.decode()
        for k, v in (metadata or {}).items()
        if k.startswith(_PREFIX.encode())
    }
    if kv.get("format") != KEYSET_SCHEMA:
        raise FormatError(f"{where}: not a shardlake keyset (format {kv.get('format')!r})")
    return kv


def _bound(kv: Mapping[str, str], name: str, keys: list[str], partitions: list[str]) -> Keyset:
    """The keyset a footer's metadata describes, with ``keys`` and their ``partitions``."""
    return Keyset(
        name=kv.get("name", name),
        version_tag=kv["version_tag"],
        version_hash=kv["version_hash"],
        keys=keys,
        partitions=partitions,
        dataset_id=kv.get("dataset_id", ""),
        recipe=json.loads(kv.get("recipe", "{}")),
        created_at=kv.get("created_at", ""),
        rebased_from=kv.get("rebased_from", ""),
    )


def _not_found(store: Store, name: str) -> NotFoundError:
    available = [k.name for k in list_keysets(store)]
    hint = f"; keysets here: {', '.join(available[:20])}" if available else "; there are none"
    return NotFoundError(f"{store.url}: no keyset {name!r}{hint}")


def load_keyset_bytes(store: Store, name: str) -> tuple[Keyset, bytes]:
    """Keyset ``name`` and its verified bytes (a mismatch is re-read, then refused)."""
    key = keyset_key(name)
    where = store.key_url(key)
    indexed = indexed_keyset(store, name)  # over HTTP: the digest the root index records

    def check(data: bytes) -> Keyset:
        check_indexed(indexed, data, where)
        return decode_keyset(data, name, where)

    return read_verified(store, key, check)


def list_keyset_names(store: Store) -> list[str]:
    suffix = ".parquet"
    names = [
        k[len(KEYSETS_DIR) + 1 : -len(suffix)]
        for k in store.list(KEYSETS_DIR)
        if k.endswith(suffix) and "/" not in k[len(KEYSETS_DIR) + 1 :]
    ]
    return sorted(names, key=natural_key)  # by name, not by object key (".parquet" < "-")


def list_keysets(store: Store) -> list[Keyset]:
    """Every live keyset (retired ones, and one deleted while listing, are left out)."""
    out = []
    for name in list_keyset_names(store):
        try:
            keyset = load_keyset_bytes(store, name)[0]
        except FileNotFoundError:
            continue  # deleted after its tombstone was written
        if not is_retired(store, keyset):
            out.append(keyset)
    if not out:  # none, or no root at all (a mistyped URL)
        require_root(store, read_state(store))
    return out


# --- retiring --------------------------------------------------------------------------------

TOMBSTONE_SCHEMA = "shardlake.keyset-tombstone/1"


def tombstone_key(name: str) -> str:
    return f"{KEYSETS_DIR}/{name}.json"


def _tombstone(store: Store, name: str) -> dict[str, Any] | None:
    try:
        data = store.read(tombstone_key(name))
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise FormatError(f"{store.key_url(tombstone_key(name))}: not valid JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != TOMBSTONE_SCHEMA:
        raise FormatError(f"{store.key_url(tombstone_key(name))}: not a keyset tombstone")
    return doc


def _identity(keyset: Keyset) -> str:
    """What a tombstone names: the keyset's content (a later keyset of the same name differs)."""
    body = {"version_hash": keyset.version_hash, "created_at": keyset.created_at}
    return hashlib.sha256(canonical_json(body)).hexdigest()


def is_retired(store: Store, keyset: Keyset) -> bool:
    """Whether the tombstone of ``keyset``'s name retires this very keyset."""
    doc = _tombstone(store, keyset.name)
    return doc is not None and doc.get("keyset") == _identity(keyset)


def delete_keyset(store: Store, name: str) -> Keyset:
    """Retire keyset ``name``: write its tombstone (create-if-absent), then delete its parquet.

    The tombstone first, so a reader that still finds the parquet sees it retired and never
    half a keyset; gc then no longer keeps what only it pinned. Returns the retired keyset."""
    check_name("keyset", name)
    keyset = load_keyset(store, name)
    doc = {
        "format": TOMBSTONE_SCHEMA,
        "name": name,
        "keyset": _identity(keyset),
        "version_tag": keyset.version_tag,
        "version_hash": keyset.version_hash,
        "deleted_at": utc_now(),
    }
    key = tombstone_key(name)
    try:
        store.create(key, canonical_json(doc))
    except AlreadyExistsError:
        # A name reused after an earlier delete: that tombstone names the older keyset.
        store.delete(key)
        store.create(key, canonical_json(doc))
    store.delete(keyset_key(name))
    refresh_index(store)
    return keyset


def referenced_versions(keysets: Iterable[Keyset]) -> set[tuple[str, str]]:
    """``(tag, hash)`` of every version some keyset is bound to (gc keeps them)."""
    return {(k.version_tag, k.version_hash) for k in keysets}
