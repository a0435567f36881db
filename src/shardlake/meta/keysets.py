"""Keysets: named, immutable sample selections bound to one version's hash.

A keyset is ``keysets/<name>.parquet`` with columns ``key`` and ``partition`` (sorted by key) and
``shardlake.*`` key-value metadata naming the dataset, the version tag and hash it was made
from, and how it was made. It is published with create-if-absent, so it is never overwritten,
and using it with any other version is refused (:meth:`Keyset.check_version`).

For the loader: ``load_keyset(store, name)`` returns a :class:`Keyset` with ``version_tag``,
``version_hash`` and ``keys``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import (
    AlreadyExistsError,
    ConflictError,
    FormatError,
    NotFoundError,
    SelectionError,
    SourceError,
)
from ..format.layout import KEYSETS_DIR, check_name, keyset_key
from ..query.dataset import Dataset, open_dataset
from ..read.verified import read_verified
from ..source import pathlists
from ..store import Store, open_store
from .versions import Version, canonical_json, ensure_root, utc_now

KEYSET_SCHEMA = "shardlake.keyset/1"
_PREFIX = "shardlake."
SHOW_MAX = 20


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

    def __len__(self) -> int:
        return len(self.keys)

    def check_version(self, version: Version) -> None:
        """Refuse to use this keyset with any version but the one it was made from."""
        if version.hash != self.version_hash:
            raise SelectionError(
                f"keyset {self.name!r} is bound to version {self.version_tag!r} "
                f"({self.version_hash}), not {version.tag!r} ({version.hash}); "
                "create a new keyset for that version"
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
        }


# --- key lists -------------------------------------------------------------------------------


def parse_key_list(
    data: bytes, where: str, *, strip_prefix: str | None = None
) -> tuple[list[str], list[str]]:
    """Keys from a key-list file: ``(keys, unmapped_entries)``, in file order.

    Accepted forms (see :mod:`shardlake.source.pathlists`): a text file with one key per line (blank
    lines and ``#`` lines ignored), or a JSON list of strings such as the training lists of
    absolute ``.npz`` paths. With ``strip_prefix`` every entry must start with it (``OLD_ROOT``);
    the prefix and a trailing ``.npz`` are removed. Entries that cannot be mapped are returned as
    ``unmapped``.
    """
    mapping = _map(data, where, strip_prefix, None)
    return mapping.keys, mapping.unmapped


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


def keys_from_file(
    ds: Dataset, path: str, *, strip_prefix: str | None = None
) -> pathlists.KeyMapping:
    """The keys a local key-list file names in version ``ds`` (``-``: stdin).

    Absolute entries map to keys by ``strip_prefix`` or, without one, by the version's source
    namespace (the packed source's path), so a training list of absolute paths needs nothing
    more."""
    namespace = None if strip_prefix is not None else ds.version.record.source_namespace
    return read_key_list(path, strip_prefix=strip_prefix, source=namespace)


def match_keys(
    ds: Dataset,
    keys: Sequence[str],
    unmapped: Sequence[str] = (),
    *,
    allow_unmatched: int | None = None,
    local_paths: Mapping[str, str] | None = None,
) -> pa.Table:
    """The manifest rows (``key``, ``partition``) of ``keys`` in ``ds``.

    Every entry that matches no key (plus ``unmapped`` ones) counts as unmatched; unless
    ``allow_unmatched`` equals that count exactly, :class:`SelectionError` reports the count
    and the first 20, naming those that are ``is_skipped`` frames (known from the sidecar beside
    the listed file, ``local_paths``) and how many frames the version left out as skipped.
    """
    selection = ds.select(keys=keys)
    unmatched = list(unmapped) + selection.missing()
    if len(unmatched) != (allow_unmatched or 0):
        raise SelectionError(
            _unmatched_message(ds, unmatched, allow_unmatched, local_paths or {}),
            options=("allow_unmatched",),
        )
    return selection.rows(["key", "partition"], allow_missing=None)


def _unmatched_message(
    ds: Dataset, unmatched: list[str], allow: int | None, local_paths: Mapping[str, str]
) -> str:
    from ..source.sidecar import skipped_note

    skipped = {k for k in unmatched if k in local_paths and _is_skipped_frame(local_paths[k])}
    shown = ", ".join(
        repr(k) + (" (skipped frame)" if k in skipped else "") for k in unmatched[:SHOW_MAX]
    )
    what = (
        f"{len(unmatched)} entr{'y' if len(unmatched) == 1 else 'ies'} match no key in "
        f"version {ds.version.tag!r}"
    )
    notes = []
    if skipped:
        notes.append(f"{len(skipped)} of them are is_skipped frames")
    left_out = skipped_note(ds.version.record)
    if left_out:
        notes.append(left_out + ", or allow exactly that many unmatched entries")
    if allow is not None:
        notes.append(f"allow_unmatched is {allow}")
    if notes:
        what += " (" + "; ".join(notes) + ")"
    return what + (f": {shown}" if shown else "")


def _is_skipped_frame(npz_path: str) -> bool:
    """Whether the sidecar beside a listed local ``.npz`` says ``is_skipped`` (False if none)."""
    from ..source.sidecar import is_skipped, read_sidecar

    sidecar = npz_path[: -len(pathlists.NPZ)] + ".json"
    if not os.path.isfile(sidecar):
        return False
    try:
        return is_skipped(read_sidecar(sidecar))
    except SourceError:
        return False


# --- create / load ---------------------------------------------------------------------------


def _encode(
    name: str, rows: pa.Table, version: Version, dataset_id: str, recipe: dict[str, Any]
) -> bytes:
    rows = rows.select(["key", "partition"]).sort_by("key")
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
    meta[CONTENT_DIGEST] = content_digest(
        {k: str(v) for k, v in meta.items()},
        rows.column("key").to_pylist(),
        rows.column("partition").to_pylist(),
    )
    kv = {(_PREFIX + k).encode(): str(v).encode() for k, v in meta.items()}
    sink = io.BytesIO()
    pq.write_table(rows.replace_schema_metadata(kv), sink, compression="zstd")
    return sink.getvalue()


def create_keyset(
    url: str | Store,
    name: str,
    *,
    version: str = "latest",
    where: str | None = None,
    keys: Sequence[str] | None = None,
    key_file: str | None = None,
    strip_prefix: str | None = None,
    unmapped: Sequence[str] = (),
    allow_unmatched: int | None = None,
    storage_options: dict[str, Any] | None = None,
    local_paths: Mapping[str, str] | None = None,
) -> Keyset:
    """Select samples of ``version`` by ``where``, ``keys`` or ``key_file`` and publish keyset
    ``name``.

    Exactly one of the three (``key_file``: see :func:`keys_from_file`). Refused with
    :class:`ConflictError` if the name is taken (keysets are immutable); nothing is written on
    any error. ``local_paths`` (key -> listed local npz) lets an unmatched key be named as an
    ``is_skipped`` frame.
    """
    check_name("keyset", name)
    if sum(x is not None for x in (where, keys, key_file)) != 1:
        raise SelectionError(
            "give exactly one of where, keys and key_file", options=("where", "keys", "key_file")
        )
    if allow_unmatched is not None and allow_unmatched < 0:
        raise SelectionError("allow_unmatched must be >= 0", options=("allow_unmatched",))
    store = open_store(url, storage_options)
    key = keyset_key(name)
    if store.exists(key):
        raise ConflictError(
            f"{store.key_url(key)}: keyset {name!r} already exists; keysets are immutable"
        )
    ds = open_dataset(store, version)
    if key_file is not None:
        listed = keys_from_file(ds, key_file, strip_prefix=strip_prefix)
        keys, unmapped, local_paths = listed.keys, listed.unmapped, listed.local_paths
    if where is not None:
        rows = ds.select(where=where).rows(["key", "partition"])
        recipe: dict[str, Any] = {"where": where}
    else:
        keys = keys or []
        rows = match_keys(
            ds, keys, unmapped, allow_unmatched=allow_unmatched, local_paths=local_paths
        )
        recipe = {"keys": len(keys), "unmatched": len(unmapped) + len(keys) - rows.num_rows}
    return _publish(store, name, rows, ds.version, recipe)


def _publish(
    store: Store, name: str, rows: pa.Table, version: Version, recipe: dict[str, Any]
) -> Keyset:
    key = keyset_key(name)
    marker = ensure_root(store)
    data = _encode(name, rows, version, str(marker["dataset_id"]), recipe)
    try:
        store.create(key, data)
    except AlreadyExistsError as exc:
        raise ConflictError(
            f"{store.key_url(key)}: keyset {name!r} was created by another writer meanwhile"
        ) from exc
    return decode_keyset(data, name, store.key_url(key))


# The keyset's digest over its own content (docs/format.md, "Integrity"); older keysets lack it.
CONTENT_DIGEST = "content_sha256"


def content_digest(meta: Mapping[str, str], keys: list[str], partitions: list[str]) -> str:
    """sha256 of the canonical JSON of a keyset's rows and ``shardlake.*`` metadata (without
    the digest itself): any flipped byte that parquet decodes anyway changes it.

    The body is ``{"keys": [...], "metadata": {...}, "partitions": [...]}``; its two long
    lists are written by :func:`_json_strings` (json.dumps takes ~3 s per million keys).
    """
    metadata = canonical_json({k: v for k, v in meta.items() if k != CONTENT_DIGEST})
    h = hashlib.sha256()
    for part in (b'{"keys":', _json_strings(keys), b',"metadata":', metadata):
        h.update(part)
    for part in (b',"partitions":', _json_strings(partitions), b"}"):
        h.update(part)
    return h.hexdigest()


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
        kv = {
            k.decode()[len(_PREFIX) :]: v.decode()
            for k, v in (table.schema.metadata or {}).items()
            if k.startswith(_PREFIX.encode())
        }
        if kv.get("format") != KEYSET_SCHEMA:
            raise FormatError(f"{where}: not a shardlake keyset (format {kv.get('format')!r})")
        keyset = Keyset(
            name=kv.get("name", name),
            version_tag=kv["version_tag"],
            version_hash=kv["version_hash"],
            keys=table.column("key").to_pylist(),
            partitions=table.column("partition").to_pylist(),
            dataset_id=kv.get("dataset_id", ""),
            recipe=json.loads(kv.get("recipe", "{}")),
            created_at=kv.get("created_at", ""),
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


def load_keyset(
    url: str | Store, name: str, storage_options: dict[str, Any] | None = None
) -> Keyset:
    """Read keyset ``name``; :class:`NotFoundError` if there is none."""
    check_name("keyset", name)
    store = open_store(url, storage_options)
    try:
        return load_keyset_bytes(store, name)[0]
    except FileNotFoundError:
        available = list_keyset_names(store)
        hint = f"; keysets here: {', '.join(available[:20])}" if available else "; there are none"
        raise NotFoundError(f"{store.url}: no keyset {name!r}{hint}") from None


def load_keyset_bytes(store: Store, name: str) -> tuple[Keyset, bytes]:
    """Keyset ``name`` and its verified bytes (a mismatch is re-read, then refused)."""
    key = keyset_key(name)
    where = store.key_url(key)
    return read_verified(store, key, lambda data: decode_keyset(data, name, where))


def list_keyset_names(store: Store) -> list[str]:
    suffix = ".parquet"
    return [
        k[len(KEYSETS_DIR) + 1 : -len(suffix)]
        for k in store.list(KEYSETS_DIR)
        if k.endswith(suffix) and "/" not in k[len(KEYSETS_DIR) + 1 :]
    ]


def list_keysets(url: str | Store, storage_options: dict[str, Any] | None = None) -> list[Keyset]:
    store = open_store(url, storage_options)
    return [load_keyset(store, name) for name in list_keyset_names(store)]


@dataclass(frozen=True)
class DisjointReport:
    a: str
    b: str
    overlap: int
    examples: list[str]
    same_version: bool

    @property
    def disjoint(self) -> bool:
        return self.overlap == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "disjoint": self.disjoint,
            "overlap": self.overlap,
            "examples": self.examples,
            "same_version": self.same_version,
        }


def check_disjoint(
    url: str | Store, a: str, b: str, storage_options: dict[str, Any] | None = None
) -> DisjointReport:
    """Compare two keysets' keys; ``overlap`` counts keys in both (first 20 as examples)."""
    store = open_store(url, storage_options)
    ka, kb = load_keyset(store, a), load_keyset(store, b)
    both = sorted(set(ka.keys).intersection(kb.keys))
    return DisjointReport(a, b, len(both), both[:SHOW_MAX], ka.version_hash == kb.version_hash)


def referenced_versions(keysets: Iterable[Keyset]) -> set[tuple[str, str]]:
    """``(tag, hash)`` of every version some keyset is bound to (gc keeps them)."""
    return {(k.version_tag, k.version_hash) for k in keysets}
