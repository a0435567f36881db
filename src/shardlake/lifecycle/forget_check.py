"""``shardlake forget --check``: whether a completed forget left any trace of what it forgot
reachable (versions, keysets, catalogs, caches named by its receipt).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..errors import FormatError, KeyNotFoundError, NotFoundError
from ..format.codec import Decoder
from ..format.layout import MEMBER_SUFFIX, unescape_member_key
from ..format.tar import iter_members
from ..meta.commits import read_state
from ..meta.keysets import list_keysets
from ..meta.rootmarker import require_root
from ..progress.bar import plural
from ..read.receipts import committed_receipts, list_receipt_ids
from ..store import Store

__all__ = ["ForgetCheckReport", "check_forget"]


# --- forget --check --------------------------------------------------------------------------


@dataclass
class ForgetCheckReport:
    """What ``forget --check`` found: ``ok`` when no object under the root holds a forgotten
    key or payload, no superseded object is left, and no keyset is bound to a redacted
    version."""

    forgets: list[str]
    objects: int
    bytes_read: int
    offending: list[str]
    incomplete: list[str]

    @property
    def ok(self) -> bool:
        return not self.offending and not self.incomplete

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "forgets": self.forgets,
            "objects": self.objects,
            "bytes_read": self.bytes_read,
            "offending": self.offending,
            "incomplete": self.incomplete,
        }

    def summary(self) -> str:
        if not self.forgets:
            return "no committed forget in this root; nothing to check"
        lines = [f"{o}" for o in self.offending]
        lines += [f"forget {f} is not complete (re-run shardlake forget)" for f in self.incomplete]
        verdict = "OK" if self.ok else "FAILED"
        lines.append(
            f"{verdict}: {len(self.forgets)} forget(s), {plural(self.objects, 'object')} "
            f"({plural(self.bytes_read, 'byte')}) re-read, {len(self.offending)} offending"
        )
        return "\n".join(lines)


class _Matcher:
    """Salted digests of each receipt: does a key or payload match any of them?"""

    def __init__(self, receipts: Sequence[Mapping[str, Any]]) -> None:
        self.sets = [
            (
                str(r["forget_id"]),
                hashlib.sha256(bytes.fromhex(str(r["salt"]))),
                set(r["selection"]["key_digests"]),
                set(r["payload_digests"]),
            )
            for r in receipts
        ]

    def _hits(self, data: bytes | memoryview, which: int) -> list[str]:
        out = []
        for fid, prefix, keys, payloads in self.sets:
            h = prefix.copy()
            h.update(data)
            if h.hexdigest() in (keys if which == 0 else payloads):
                out.append(fid)
        return out

    def key(self, key: str) -> list[str]:
        return self._hits(key.encode(), 0)

    def payload(self, raw: bytes) -> list[str]:
        return self._hits(raw, 1)


def _keys_of_parquet(data: bytes) -> list[str]:
    import pyarrow.parquet as pq

    table = pq.ParquetFile(pa.BufferReader(data)).read(columns=["key"], use_threads=False)
    return [k for k in table.column("key").to_pylist() if k is not None]


def check_forget(store: Store, forget_id: str | None = None) -> ForgetCheckReport:
    """Re-read every object under the root: no manifest, catalog segment or keyset lists a
    forgotten key, and no shard member (decompressed) carries a forgotten payload or key;
    every superseded object is gone. ``forget_id``: only that forget's receipt."""
    if forget_id is not None:
        if forget_id not in list_receipt_ids(store):
            raise NotFoundError(f"{store.url}: no forget receipt {forget_id!r}")
        receipts = [r for r in committed_receipts(store) if r["forget_id"] == forget_id]
        if not receipts:
            raise NotFoundError(f"{store.url}: forget {forget_id} never committed")
    else:
        require_root(store, read_state(store))
        receipts = committed_receipts(store)
    report = ForgetCheckReport([str(r["forget_id"]) for r in receipts], 0, 0, [], [])
    if not receipts:
        return report
    match = _Matcher(receipts)
    decoder = Decoder()
    superseded = {k: str(r["forget_id"]) for r in receipts for k in r["superseded"]}
    report.incomplete = [str(r["forget_id"]) for r in receipts if not r.get("completed_at")]
    for key in sorted(store.list("")):
        if key in superseded:
            report.offending.append(f"{key}: superseded by forget {superseded[key]}, still there")
        try:
            data = store.read(key)
        except KeyNotFoundError:
            continue
        report.objects += 1
        report.bytes_read += len(data)
        report.offending.extend(_check_object(store, key, data, match, decoder))
    redacted = {str(v["old"]): str(r["forget_id"]) for r in receipts for v in r["versions"]}
    for keyset in list_keysets(store):
        if keyset.version_hash in redacted:
            report.offending.append(
                f"keysets/{keyset.name}.parquet: bound to version {keyset.version_hash}, "
                f"redacted by forget {redacted[keyset.version_hash]}"
            )
    return report


def _check_object(
    store: Store, key: str, data: bytes, match: _Matcher, decoder: Decoder
) -> list[str]:
    where = store.key_url(key)
    out = []
    if key.endswith(".tar"):
        view = memoryview(data)
        try:
            members = list(iter_members(data, where))
        except FormatError as exc:
            return [f"{key}: unreadable tar ({exc}); cannot prove it holds no forgotten payload"]
        for m in members:
            payload = view[m.offset : m.offset + m.size]
            name = m.name[: -len(MEMBER_SUFFIX)] if m.name.endswith(MEMBER_SUFFIX) else m.name
            for fid in match.key(unescape_member_key(name)):
                out.append(f"{key}: member {m.name!r} is a key forgotten by {fid}")
            try:
                raw = decoder.decompress(payload, where)
            except Exception:  # noqa: BLE001 - not a zstd member: compare its bytes as they are
                raw = bytes(payload)
            for fid in match.payload(raw):
                out.append(f"{key}: member {m.name!r} carries a payload forgotten by {fid}")
        return out
    if key.endswith(".parquet"):
        try:
            keys = _keys_of_parquet(data)
        except (pa.ArrowException, OSError, KeyError):
            keys = []  # no key column (a partitions table)
        hits = {fid for k in keys for fid in match.key(k)}
        for fid in sorted(hits):
            out.append(f"{key}: lists a key forgotten by {fid}")
        return out
    return out
