"""Forget's shard rewrite: a shard copied without the forgotten members (read by ranges), the
partition entry that references the rewritten revision, and the salted digests a receipt keeps.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import AlreadyExistsError, FormatError
from ..format.codec import Decoder
from ..format.documents import PartitionEntry, ShardEntry
from ..format.layout import MEMBER_SUFFIX, manifest_key, short_hash, unescape_member_key
from ..format.manifest import ManifestMeta, parse_manifest, write_manifest
from ..format.tar import ShardWriter, iter_members
from ..read.manifests import read_entry_manifest
from ..store import Store

__all__ = [
    "DIGEST_RULE",
    "ShardRewrite",
    "_member_keys",
    "_new_data_rev",
    "_redacted_entry",
    "rewrite_shard",
    "salted",
]

DIGEST_RULE = "sha256(salt || x)"


# --- digests ---------------------------------------------------------------------------------


def salted(salt: str, data: bytes | memoryview | str) -> str:
    """The receipt's digest: sha256 of the salt's bytes, then ``data`` (a key: its UTF-8)."""
    h = hashlib.sha256(bytes.fromhex(salt))
    h.update(data.encode() if isinstance(data, str) else data)
    return h.hexdigest()


# --- the shard rewrite (a task: runs on the executor) ----------------------------------------


@dataclass(frozen=True)
class ShardRewrite:
    """A rewritten shard: its new entry (``members`` 0: nothing left, not written), where each
    kept key now lies, and the salted digests of the forgotten payloads."""

    old: str
    new: ShardEntry
    positions: dict[str, tuple[int, int]]  # key -> (member, offset)
    digests: list[str]
    forgotten: list[str]  # keys found in it
    read_bytes: int
    written: int


def _member_key(name: str, where: str) -> str:
    if not name.endswith(MEMBER_SUFFIX):
        raise FormatError(f"{where}: member {name!r} is not a shardlake sample member")
    return unescape_member_key(name[: -len(MEMBER_SUFFIX)])


class _RangeReader(io.RawIOBase):
    """A shard read sequentially through ranged reads of ``window`` bytes: a rewrite holds one
    window and one member in memory, never the whole shard."""

    def __init__(self, store: Store, key: str, size: int, window: int = 16 * 2**20) -> None:
        self.store, self.key, self.size, self.window = store, key, size, window
        self.pos = 0
        self.start = 0
        self.buf = b""
        self.fetched = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = base + offset
        return self.pos

    def readinto(self, b: Any) -> int:
        if self.pos >= self.size:
            return 0
        if not (self.start <= self.pos < self.start + len(self.buf)):
            end = min(self.size, self.pos + max(self.window, len(b)))
            self.buf = self.store.read_range(self.key, self.pos, end)
            self.start = self.pos
            self.fetched += len(self.buf)
        at = self.pos - self.start
        n = min(len(b), len(self.buf) - at)
        b[:n] = self.buf[at : at + n]
        self.pos += n
        return n

    def take(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` (one member's payload)."""
        self.seek(offset)
        out = bytearray()
        while len(out) < size:
            chunk = self.read(size - len(out))
            if not chunk:
                raise FormatError(f"{self.store.key_url(self.key)}: ends inside a member")
            out += chunk
        return bytes(out)


def rewrite_shard(
    store: Store, old_key: str, new_key: str, drop: frozenset[str], salt: str, size: int = -1
) -> ShardRewrite:
    """Write ``new_key``: shard ``old_key`` without the members of ``drop``'s keys; the members
    kept are byte-identical (same deterministic header, same payload bytes, same padding). The
    shard is streamed (ranged reads in, a streaming upload out); nothing is written when no
    member is left."""
    where = store.key_url(old_key)
    reader = _RangeReader(store, old_key, store.size(old_key) if size < 0 else size)
    decoder = Decoder()
    positions: dict[str, tuple[int, int]] = {}
    digests, forgotten = [], []
    with contextlib.ExitStack() as stack:
        writer: ShardWriter | None = None
        # tarfile seeks back to its next header itself, so payloads are read in between.
        for member in iter_members(reader, where):  # type: ignore[arg-type]
            key = _member_key(member.name, where)
            payload = reader.take(member.offset, member.size)
            if key in drop:
                forgotten.append(key)
                digests.append(salted(salt, decoder.decompress(payload, f"{where} key {key!r}")))
                continue
            if writer is None:
                # Opened at the first member kept: visible only when the block exits cleanly.
                writer = ShardWriter(stack.enter_context(store.open_writer(new_key)))
            positions[key] = writer.add(key, payload)
        if writer is None:
            return ShardRewrite(
                old_key, ShardEntry(new_key, 0, 0), {}, digests, forgotten, reader.size, 0
            )
        writer.close()
    # Deterministic bytes: a rerun after a kill writes the very same object again.
    entry = ShardEntry(new_key, writer.bytes_written, writer.members)
    return ShardRewrite(
        old_key, entry, positions, digests, forgotten, reader.size, writer.bytes_written
    )


def _member_keys(store: Store, key: str) -> list[str]:
    where = store.key_url(key)
    return [_member_key(m.name, where) for m in iter_members(store.read(key), where)]


def _new_data_rev(entry: PartitionEntry, holds: Mapping[str, set[str]]) -> str:
    """The revision directory of a partition revision's rewritten shards: a function of the
    revision and of what is erased from it, so a rerun rewrites into the same names."""
    gone = sorted({k for s in entry.shards for k in holds.get(s.key, ())})
    return "f" + short_hash("forget", entry.data_rev, *gone, length=23)


# --- successors ------------------------------------------------------------------------------


def _redacted_entry(
    store: Store,
    entry: PartitionEntry,
    forgotten: pa.Array,
    rewrites: Mapping[str, ShardRewrite],
    new_rev: str,
) -> tuple[PartitionEntry | None, pa.Table | None, int, int]:
    """``(entry, manifest table, samples removed, bytes written)``; entry None: every sample of
    the partition is forgotten (it leaves the version)."""
    table, meta = read_entry_manifest(store, entry)
    keep = table.filter(pc.invert(pc.is_in(table.column("key"), value_set=forgotten)))
    removed = table.num_rows - keep.num_rows
    if keep.num_rows == 0:
        return None, None, removed, 0
    new_shards: list[ShardEntry] = []
    index_of: dict[int, int] = {}
    for i, s in enumerate(entry.shards):
        done = rewrites.get(s.key)
        if done is None:
            index_of[i] = len(new_shards)
            new_shards.append(s)
        elif done.new.members:
            index_of[i] = len(new_shards)
            new_shards.append(done.new)
    keys = keep.column("key").to_pylist()
    shard_col = keep.column("shard").to_pylist()
    member_col = keep.column("member").to_pylist()
    offset_col = keep.column("offset").to_pylist()
    for j, key in enumerate(keys):
        old = entry.shards[shard_col[j]].key
        done = rewrites.get(old)
        if done is not None:
            if key not in done.positions:
                raise FormatError(f"{store.key_url(old)}: has no member for key {key!r}")
            member_col[j], offset_col[j] = done.positions[key]
        shard_col[j] = index_of[shard_col[j]]
    for name, values, kind in (
        ("shard", shard_col, pa.int32()),
        ("member", member_col, pa.int32()),
        ("offset", offset_col, pa.int64()),
    ):
        keep = keep.set_column(keep.column_names.index(name), name, pa.array(values, kind))
    manifest_rev = "f" + short_hash("forget", entry.manifest_rev, new_rev, length=23)
    mkey = manifest_key(entry.id, new_rev, manifest_rev)
    new_meta = ManifestMeta(
        meta.partition_id,
        meta.partition_path,
        new_rev,
        meta.meta_rev,
        manifest_rev,
        meta.recipe,
        meta.format_version,
    )
    keep = keep.replace_schema_metadata(None)
    data = write_manifest(keep, new_meta)
    written = len(data)
    try:
        store.create(mkey, data)
    except AlreadyExistsError:
        # A rerun: the same revision with the same rows (parquet bytes may differ).
        data = store.read(mkey)
        table2, meta2 = parse_manifest(data, store.key_url(mkey))
        if table2.num_rows != keep.num_rows or meta2.manifest_rev != manifest_rev:
            raise
        keep, written = table2, 0
    new_entry = replace(
        entry,
        data_rev=new_rev,
        manifest_rev=manifest_rev,
        manifest=mkey,
        samples=keep.num_rows,
        payload_bytes=int(pc.sum(keep.column("size")).as_py() or 0),
        shards=tuple(new_shards),
        manifest_sha256=hashlib.sha256(data).hexdigest(),
        manifest_size=len(data),
        segment=None,
    )
    return new_entry, keep, removed, written
