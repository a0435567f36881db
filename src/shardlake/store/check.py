"""``check_store``: the checks a team runs against an object store before trusting it.

Every check runs on fresh keys under ``_shardlake/check/<uuid>/`` and everything written there
is deleted afterwards. The create-if-absent checks are the ones a publish requires
(:meth:`Store.ensure_create_enforced`); the others test the promises readers rely on. Two
entries are figures, not verdicts: small-object latency and large-object throughput (``ok``
unless the operation failed).
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import AlreadyExistsError, KeyNotFoundError
from .core import Store, open_store
from .probe import ProbeCheck, check_create_race, check_create_sequential

CHECK_PREFIX = "_shardlake/check"
SMALL_OBJECTS = 10
SMALL_SIZE = 1024
LARGE_SIZE = 8 * 1024 * 1024

__all__ = ["StoreReport", "check_store"]


@dataclass
class StoreReport:
    """The outcome of :func:`check_store`: ``safe`` when every check passed."""

    url: str
    checks: list[ProbeCheck] = field(default_factory=list)
    bucket_created: bool = False  # check_store(create_bucket=True) made the bucket

    @property
    def safe(self) -> bool:
        return all(check.ok for check in self.checks)

    def failed(self) -> list[str]:
        return [check.name for check in self.checks if not check.ok]

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "safe": self.safe,
            "bucket_created": self.bucket_created,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
        }


def check_store(
    url: str | Store, *, create_bucket: bool = False, **storage_options: Any
) -> StoreReport:
    """Run the named checks against the store at ``url``; never raises for a failed check.

    Checks: create-if-absent, create-if-absent-race, read-after-write, ranged-read,
    list-after-write, delete, small-object-latency, large-object-throughput. With
    ``create_bucket`` the bucket (Azure: container) the URL names is created first where it
    does not exist (:meth:`Store.create_bucket`; ``report.bucket_created`` says whether).
    """
    store = open_store(url, storage_options or None)
    store.require_writable("check-store")  # its checks write: an HTTP root is refused at once
    created = store.create_bucket() if create_bucket else False
    prefix = f"{CHECK_PREFIX}/{uuid.uuid4().hex}"
    report = StoreReport(store.url, bucket_created=created)
    steps: list[tuple[str, Callable[[], ProbeCheck]]] = [
        ("create-if-absent", lambda: check_create_sequential(store, f"{prefix}/create")),
        ("create-if-absent-race", lambda: check_create_race(store, f"{prefix}/race")),
        ("read-after-write", lambda: _read_after_write(store, prefix)),
        ("ranged-read", lambda: _ranged_read(store, prefix)),
        ("list-after-write", lambda: _list_after_write(store, prefix)),
        ("delete", lambda: _delete(store, prefix)),
        ("small-object-latency", lambda: _latency(store, prefix)),
        ("large-object-throughput", lambda: _throughput(store, prefix)),
    ]
    try:
        for name, step in steps:
            try:
                report.checks.append(step())
            except Exception as exc:  # noqa: BLE001 - a failed check is reported, not raised
                report.checks.append(ProbeCheck(name, False, f"{type(exc).__name__}: {exc}"))
    finally:
        _clean(store, prefix)
    return report


def _clean(store: Store, prefix: str) -> None:
    for key in store.list(prefix + "/"):
        store.delete(key)


def _read_after_write(store: Store, prefix: str) -> ProbeCheck:
    name, key = "read-after-write", f"{prefix}/raw"
    first, second = os.urandom(4096), os.urandom(4096)
    store.write(key, first)
    if store.read(key) != first:
        return ProbeCheck(name, False, "a read right after a write returned other bytes")
    store.write(key, second)
    if store.read(key) != second:
        return ProbeCheck(name, False, "a read right after an overwrite returned the old bytes")
    return ProbeCheck(name, True, "writes and overwrites are read back at once")


def _ranged_read(store: Store, prefix: str) -> ProbeCheck:
    name, key = "ranged-read", f"{prefix}/ranged"
    data = os.urandom(256 * 1024)
    store.write(key, data)
    wanted = [(0, 100), (1000, 70_000), (200_000, 256 * 1024), (250_000, 300_000)]
    if store.read_range(key, 1000, 70_000) != data[1000:70_000]:
        return ProbeCheck(name, False, "read_range returned the wrong bytes")
    got = store.read_ranges([(key, s, e) for s, e in wanted])
    for (s, e), blob in zip(wanted, got, strict=True):
        if blob != data[s:e]:
            return ProbeCheck(name, False, f"range [{s}, {e}) returned the wrong bytes")
    return ProbeCheck(name, True, f"{len(wanted) + 1} ranges exact, clipped at the end")


def _list_after_write(store: Store, prefix: str) -> ProbeCheck:
    name, base = "list-after-write", f"{prefix}/list"
    keys = [f"{base}/k{i}" for i in range(3)] + [f"{base}/sub/k"]
    for key in keys:
        store.write(key, b"x")
    listed = store.list(base + "/")
    if listed != sorted(keys):
        return ProbeCheck(name, False, f"listed {listed}, wrote {sorted(keys)}")
    return ProbeCheck(name, True, f"{len(keys)} new objects listed at once")


def _delete(store: Store, prefix: str) -> ProbeCheck:
    name, key = "delete", f"{prefix}/delete"
    store.write(key, b"doomed")
    store.delete(key)
    store.delete(key)  # deleting a missing key is no error
    if store.exists(key):
        return ProbeCheck(name, False, "a deleted key still exists")
    try:
        store.read(key)
        return ProbeCheck(name, False, "a deleted key can still be read")
    except KeyNotFoundError:
        pass
    if key in store.list(prefix + "/"):
        return ProbeCheck(name, False, "a deleted key is still listed")
    try:
        store.create(key, b"again")  # a deleted key can be created again
    except AlreadyExistsError:
        return ProbeCheck(name, False, "create refused on a deleted key")
    return ProbeCheck(name, True, "deleted keys are gone from reads, exists and listings")


def _latency(store: Store, prefix: str) -> ProbeCheck:
    writes: list[float] = []
    reads: list[float] = []
    for i in range(SMALL_OBJECTS):
        key, data = f"{prefix}/small{i}", os.urandom(SMALL_SIZE)
        t0 = time.perf_counter()
        store.write(key, data)
        t1 = time.perf_counter()
        store.read(key)
        reads.append(time.perf_counter() - t1)
        writes.append(t1 - t0)
    return ProbeCheck(
        "small-object-latency",
        True,
        f"1 KiB objects: median write {statistics.median(writes) * 1000:.1f} ms, "
        f"median read {statistics.median(reads) * 1000:.1f} ms ({SMALL_OBJECTS} each)",
    )


def _throughput(store: Store, prefix: str) -> ProbeCheck:
    key, data = f"{prefix}/large", os.urandom(LARGE_SIZE)
    t0 = time.perf_counter()
    with store.open_writer(key) as out:
        out.write(data)
    t1 = time.perf_counter()
    back = store.read(key)
    t2 = time.perf_counter()
    mib = LARGE_SIZE / (1 << 20)
    if back != data:
        return ProbeCheck("large-object-throughput", False, "the large object read back differs")
    return ProbeCheck(
        "large-object-throughput",
        True,
        f"{mib:.0f} MiB object: write {mib / max(t1 - t0, 1e-9):.0f} MiB/s, "
        f"read {mib / max(t2 - t1, 1e-9):.0f} MiB/s",
    )
