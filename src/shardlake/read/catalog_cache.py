"""A node-local cache of catalog objects, so the ranks of one node read a catalog from the store
once.

Catalog objects (``catalog/partitions/<sha256>.parquet``, ``catalog/segments/<sha256>.parquet``)
are immutable and named by their content's sha256, which the version record carries. The cache
keeps one file per object, ``<dir>/shardlake-catalog-1/<sha256>``, whatever store it came from:

* **verified on read**: a hit is used only when its size and sha256 match the reference; a file
  that does not (a torn disk, a hand edit) is deleted and the object is read from the store;
* **published atomically**: an object is written to a temporary file in the same directory and
  renamed into place, so a reader sees a whole file or none;
* **read once per node**: a miss takes an exclusive ``flock`` on the object's lock file before
  reading the store, so of 8 ranks starting together one reads and the other 7 find its file;
* **bounded**: after a publish, files beyond ``max_bytes`` (default 4 GiB) are evicted least
  recently used first (a hit refreshes the file's mtime, or an arrays file's stamp's).

Beside the objects it keeps small *derived* values that are a pure function of a version's
content (the loader's selection digest of a whole version, keyed by the version hash and row
count): a JSON file named by the sha256 of what it is of, holding that description, the value
and a checksum of both; one that does not check out is deleted and the value computed again.
Larger derived values, arrays (the loader's row-table columns of a whole version), are one
memory-mappable file each (``<name>.arrays``): a header naming what it is of, the arrays' dtypes,
shapes and offsets, the data's size and sha256, then the data, 64-byte aligned. A reader maps it
(the ranks of a node then share its pages) after checking its size and its header, and the
data's sha256 once per node: the process that hashed the data (or wrote the file) publishes a
stamp beside it (``<name>.arrays.checked``: the file's name, device, inode, size, mtime and
ctime, and the header's data sha256), and a later reader whose file still has that
stat skips the hash (gigabytes at 10^8 samples, paid by every rank at every start). A stamp
that is torn, of another file, or no longer matches (the file replaced, truncated, written to
or touched since), or written within the tick of the file's ctime (which a later edit in that
tick would keep), is ignored: the data is hashed again. So an edit is found out; a corruption
that changes no metadata (the medium's) is not, after the node's first check. A file that
does not check out (torn, truncated, edited) is deleted, with its stamp, and built again.

Where: ``$SHARDLAKE_CATALOG_CACHE`` when set (empty or ``off`` disables the cache), else
``$XDG_CACHE_HOME/shardlake/catalog``, else ``~/.cache/shardlake/catalog``. The budget is
``$SHARDLAKE_CATALOG_CACHE_BYTES``. A cache directory that cannot be created or written is
skipped (the store is read as without a cache): the cache is never the canonical copy.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import mmap
import os
import secrets
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..errors import UsageError

__all__ = [
    "ARRAYS_SUFFIX",
    "LAYOUT",
    "CatalogCache",
    "DerivedArrays",
    "catalog_cache",
]

T = TypeVar("T")

ENV_DIR = "SHARDLAKE_CATALOG_CACHE"
ENV_BYTES = "SHARDLAKE_CATALOG_CACHE_BYTES"
DEFAULT_MAX_BYTES = 4 * 2**30
LAYOUT = "shardlake-catalog-1"
TEMP_MARK = ".tmp."
LOCK_SUFFIX = ".lock"
DERIVED = "shardlake.catalog-cache.derived/1"
DERIVED_SUFFIX = ".derived"
ARRAYS = "shardlake.catalog-cache.arrays/1"
ARRAYS_SUFFIX = ".arrays"
ARRAYS_MAGIC = b"SLKARR01"
ALIGN = 64
SUFFIXES = (DERIVED_SUFFIX, ARRAYS_SUFFIX)
STAMP = "shardlake.catalog-cache.checked/1"
STAMP_SUFFIX = ".checked"  # beside an arrays file: its data was checked (see the docstring)
STAMP_STAT = ("st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns")

# What an arrays entry holds: a small JSON-able document and named 1-d arrays.
DerivedArrays = tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]
OFF = ("", "off", "0", "false", "no")


def default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shardlake" / "catalog"


class CatalogCache:
    """Content-addressed local copies of catalog objects (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES):
        if max_bytes < 0:
            raise UsageError(f"catalog cache size {max_bytes} must be >= 0")
        self.root = Path(directory) / LAYOUT
        self.max_bytes = int(max_bytes)
        self.hits = 0
        self.misses = 0
        self.discarded = 0  # files that failed their check

    def path(self, sha256: str) -> Path:
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise UsageError(f"not a sha256 digest: {sha256!r}")
        return self.root / sha256

    def get(self, sha256: str, size: int) -> bytes | None:
        """The cached object's bytes, or ``None`` (absent, or failed its check and deleted)."""
        path = self.path(sha256)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
            self.discarded += 1
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # least recently used is evicted first
        self.hits += 1
        return data

    def put(self, sha256: str, data: bytes) -> None:
        """Publish verified bytes (temporary file, then rename); errors leave no entry."""
        if hashlib.sha256(data).hexdigest() != sha256:
            raise UsageError(f"catalog cache: bytes are not object {sha256[:12]}...")
        self._publish(sha256, data)

    def _publish(self, name: str, data: bytes | list[Any]) -> os.stat_result | None:
        """Write ``data`` (bytes, or buffers written one after another) as entry ``name``;
        the published file's stat (``None``: not published, or replaced since)."""
        path = self.root / name
        temp = path.with_name(f"{name}{TEMP_MARK}{os.getpid()}.{secrets.token_hex(4)}")
        try:
            with open(temp, "wb") as fh:
                for part in [data] if isinstance(data, bytes) else data:
                    fh.write(part)
                written = os.fstat(fh.fileno()).st_ino
            os.replace(temp, path)
            st = os.stat(path)  # after the rename, which may change the ctime
        except OSError:
            with contextlib.suppress(OSError):
                temp.unlink()
            return None
        self._evict(keep=path)
        return st if st.st_ino == written else None

    def fetch(self, sha256: str, size: int, read: Callable[[], bytes]) -> bytes:
        """The object from the cache, else from ``read()`` (which checks it), published; one
        process per node reads a missing object, the others wait for it and hit."""
        return self._once(
            self.path(sha256).with_name(sha256 + LOCK_SUFFIX),
            lambda: self.get(sha256, size),
            read,
            lambda data: self.put(sha256, data),
        )

    def _once(
        self,
        lock_path: Path,
        lookup: Callable[[], T | None],
        make: Callable[[], T],
        publish: Callable[[T], None],
    ) -> T:
        """``lookup()``, else ``make()`` and ``publish`` it under a per-entry lock, so one process
        per node makes a missing entry and the others wait for it and hit."""
        found = lookup()
        if found is not None:
            return found
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            lock = open(lock_path, "ab")  # noqa: SIM115
        except OSError:
            self.misses += 1
            return make()  # an unwritable cache is no cache
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                found = lookup()  # published while this process waited
                if found is not None:
                    return found
                self.misses += 1
                made = make()
                publish(made)
                return made
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # --- derived values ---------------------------------------------------------------------

    def get_derived(self, what: str) -> str | None:
        """The value cached for ``what`` (a description naming everything it depends on), or
        ``None`` (absent, or failed its check and deleted)."""
        path = self.root / _derived_name(what)
        try:
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return None
        value = doc.get("value") if isinstance(doc, dict) else None
        if (
            not isinstance(value, str)
            or doc.get("of") != what
            or doc.get("check") != _derived_check(what, value)
        ):
            self.discarded += 1
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        with contextlib.suppress(OSError):
            os.utime(path)
        self.hits += 1
        return value

    def put_derived(self, what: str, value: str) -> None:
        """Publish a derived value (atomically; errors leave no entry)."""
        doc = {"format": DERIVED, "of": what, "value": value, "check": _derived_check(what, value)}
        with contextlib.suppress(OSError):
            self.root.mkdir(parents=True, exist_ok=True)
        self._publish(_derived_name(what), json.dumps(doc, sort_keys=True).encode())

    def fetch_derived(self, what: str, compute: Callable[[], str]) -> str:
        """The value of ``what`` from the cache, else ``compute()``d and published; one process
        per node computes it, the others wait for it and hit (as :meth:`fetch`)."""
        return self._once(
            self.root / (_derived_name(what) + LOCK_SUFFIX),
            lambda: self.get_derived(what),
            compute,
            lambda value: self.put_derived(what, value),
        )

    def get_arrays(self, what: str, *, verify: bool = True) -> DerivedArrays | None:
        """The arrays cached for ``what``, mapped read-only from their file (shared with the
        other processes mapping it), or ``None`` (absent, or failed its check and deleted).
        ``verify=False`` skips the data's sha256 (the size and header are still checked): for
        the file this process has just written."""
        path = self.root / _arrays_name(what)
        try:
            fh = open(path, "rb")  # noqa: SIM115 - closed below, after the check reads it
        except FileNotFoundError:
            return None
        except OSError:
            self._discard(path)
            return None
        hashed: list[str] = []
        with fh:
            try:
                st = os.fstat(fh.fileno())  # before the hash: a later edit changes it
                if st.st_size == 0:
                    raise ValueError("empty")
                view = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):
                self._discard(path)
                return None

            def check(data_sha256: str, start: int) -> bool:
                if not verify or _stamped(path, st, data_sha256):
                    return True
                hashed.append(data_sha256)
                return _file_sha256(fh, start) == data_sha256

            try:
                found = _decode_arrays(view, what, check)
            except (OSError, ValueError, KeyError, TypeError, struct.error):
                found = None
        if found is None:
            with contextlib.suppress(BufferError):
                view.close()
            self._discard(path)
            return None
        if hashed:  # checked here: the node's later readers need not hash it again
            _write_stamp(path, st, hashed[0])
        elif verify:
            with contextlib.suppress(OSError):  # the stamp, not the file: its ctime is checked
                os.utime(_stamp_path(path))
        self.hits += 1
        return found

    def _discard(self, path: Path) -> None:
        self.discarded += 1
        with contextlib.suppress(OSError):
            _remove(path)

    def put_arrays(self, what: str, doc: Mapping[str, Any], arrays: Mapping[str, Any]) -> None:
        """Publish derived arrays (atomically; errors leave no entry), stamped as checked:
        this process computed the data it wrote."""
        with contextlib.suppress(OSError):
            self.root.mkdir(parents=True, exist_ok=True)
        parts, data_sha256 = _encode_arrays(what, doc, arrays)
        path = self.root / _arrays_name(what)
        st = self._publish(path.name, parts)
        if st is not None:
            _write_stamp(path, st, data_sha256)

    def fetch_arrays(self, what: str, make: Callable[[], DerivedArrays]) -> DerivedArrays:
        """The arrays of ``what`` mapped from the cache, else ``make()``d and published; one
        process per node makes them, the others wait and map its file (as :meth:`fetch`).
        The maker maps its published file back too (its pages are then shared with the other
        ranks instead of being a private copy); what it made is returned where that fails."""
        made: list[DerivedArrays] = []

        def publish(value: DerivedArrays) -> None:
            self.put_arrays(what, *value)
            made.append(value)

        found = self._once(
            self.root / (_arrays_name(what) + LOCK_SUFFIX),
            lambda: self.get_arrays(what),
            make,
            publish,
        )
        if not made:
            return found
        hits = self.hits
        mapped = self.get_arrays(what, verify=False)
        self.hits = hits  # the maker's own file: not a hit
        return found if mapped is None else mapped

    def drop(self, objects: Iterable[str], mentioning: Iterable[str]) -> int:
        """Delete the objects of sha256 ``objects`` and every derived value whose description
        names one of ``mentioning`` (version hashes a forget redacted); how many files went."""
        marks = [m for m in mentioning if m]
        gone = 0
        for sha in objects:
            with contextlib.suppress(OSError):
                _remove(self.root / sha)
                gone += 1
        for path, _size, _mtime in list(self.entries()):
            if not path.name.endswith(SUFFIXES):
                continue
            try:
                with open(path, "rb") as fh:
                    head = fh.read(1 << 16)  # a derived document, or an arrays header
            except OSError:
                continue
            if any(m.encode() in head for m in marks):
                with contextlib.suppress(OSError):
                    _remove(path)
                    gone += 1
        return gone

    def entries(self) -> Iterator[tuple[Path, int, float]]:
        """``(path, size, mtime)`` of every published object. A stamp counts with its file
        (its bytes; its mtime, which a hit refreshes); one whose file is gone, on its own."""
        try:
            names = set(os.listdir(self.root))
        except OSError:
            return
        for name in names:
            entry = name.removesuffix(STAMP_SUFFIX)
            if not _entry_name(entry) or (entry != name and entry in names):
                continue  # temporary and lock files; a stamp counted with its file
            with contextlib.suppress(OSError):
                st = os.stat(self.root / name)
                size, mtime = st.st_size, st.st_mtime
                if name + STAMP_SUFFIX in names:
                    with contextlib.suppress(OSError):
                        stamp = os.stat(self.root / (name + STAMP_SUFFIX))
                        size, mtime = size + stamp.st_size, max(mtime, stamp.st_mtime)
                yield self.root / name, size, mtime

    def _evict(self, keep: Path) -> None:
        found = sorted(self.entries(), key=lambda e: e[2])
        total = sum(size for _p, size, _m in found)
        for path, size, _mtime in found:
            if total <= self.max_bytes:
                break
            if path == keep:
                continue
            with contextlib.suppress(OSError):
                _remove(path)
            total -= size


def _entry_name(name: str) -> bool:
    """An object's or a derived file's name (not a temporary, lock or stamp file's)."""
    return len(name) == 64 or any(
        len(name) == 64 + len(suffix) and name.endswith(suffix) for suffix in SUFFIXES
    )


def _remove(path: Path) -> None:
    """Delete an entry (raises where it cannot), then its lock file and stamp."""
    path.unlink()
    for extra in (path.name + LOCK_SUFFIX, path.name + STAMP_SUFFIX):
        with contextlib.suppress(OSError):
            path.with_name(extra).unlink()


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + STAMP_SUFFIX)


def _stamp_doc(path: Path, st: os.stat_result, data_sha256: str) -> dict[str, Any]:
    """A stamp's content. A reader trusts only a stamp equal to the one it would write for
    the file as it finds it, so a torn or forged one is no stamp (it needs no checksum)."""
    doc: dict[str, Any] = {"format": STAMP, "of": path.name, "data_sha256": data_sha256}
    doc.update((field, getattr(st, field)) for field in STAMP_STAT)
    return doc


def _stamped(path: Path, st: os.stat_result, data_sha256: str) -> bool:
    """Whether ``path`` (of stat ``st``, header data sha256 ``data_sha256``) has a stamp of
    that very file as it is now, written after the tick of its ctime."""
    try:
        with open(_stamp_path(path), "rb") as fh:
            raw = fh.read(4096)
            written = os.fstat(fh.fileno()).st_mtime_ns
        doc = json.loads(raw)
    except (OSError, ValueError):
        return False
    return doc == _stamp_doc(path, st, data_sha256) and written > st.st_ctime_ns


def _write_stamp(path: Path, st: os.stat_result, data_sha256: str) -> None:
    """Publish ``path``'s stamp (temporary file, then rename; errors leave none). Its mtime
    must pass the file's ctime: an edit within the ctime's tick (timestamps are a clock tick
    coarse) would keep the ctime the stamp records; it waits a tick or two for that."""
    stamp = _stamp_path(path)
    temp = stamp.with_name(f"{stamp.name}{TEMP_MARK}{os.getpid()}.{secrets.token_hex(4)}")
    try:
        temp.write_text(json.dumps(_stamp_doc(path, st, data_sha256), sort_keys=True))
        for _ in range(25):
            if os.stat(temp).st_mtime_ns > st.st_ctime_ns:
                break
            time.sleep(0.002)
            os.utime(temp)
        os.replace(temp, stamp)
    except OSError:
        with contextlib.suppress(OSError):
            temp.unlink()


def _derived_name(what: str) -> str:
    return hashlib.sha256(f"{DERIVED}|name|{what}".encode()).hexdigest() + DERIVED_SUFFIX


def _derived_check(what: str, value: str) -> str:
    return hashlib.sha256(f"{DERIVED}|check|{what}|{value}".encode()).hexdigest()


def _arrays_name(what: str) -> str:
    return hashlib.sha256(f"{ARRAYS}|name|{what}".encode()).hexdigest() + ARRAYS_SUFFIX


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _encode_arrays(
    what: str, doc: Mapping[str, Any], arrays: Mapping[str, Any]
) -> tuple[list[Any], str]:
    """magic, header length (u64), header JSON, then each array's bytes at a 64-byte offset,
    as buffers to write one after another (no joined copy), and the data's sha256. The header
    holds the data's size and sha256, so a torn or edited file is found out."""
    specs, parts, pos = [], [], 0
    digest = hashlib.sha256()
    for name, value in arrays.items():
        array = np.ascontiguousarray(value)
        if array.ndim != 1:
            raise UsageError(f"catalog cache: array {name!r} is not 1-d")
        raw = array.view(np.uint8).data  # its bytes, not a copy
        specs.append({"name": name, "dtype": array.dtype.str, "count": len(array), "at": pos})
        pad = b"\0" * (_aligned(len(raw)) - len(raw))
        digest.update(raw)
        digest.update(pad)
        parts += [raw, pad]
        pos += len(raw) + len(pad)
    header = json.dumps(
        {
            "format": ARRAYS,
            "of": what,
            "doc": doc,
            "arrays": specs,
            "data_bytes": pos,
            "data_sha256": digest.hexdigest(),
        },
        sort_keys=True,
    ).encode()
    head = ARRAYS_MAGIC + struct.pack("<Q", len(header)) + header
    return [head + b"\0" * (_aligned(len(head)) - len(head)), *parts], digest.hexdigest()


def _file_sha256(fh: io.BufferedReader, start: int) -> str:
    """sha256 of an open file from ``start`` on, read through a small buffer. Hashing the
    mapping instead would make every page of it resident in this process, and count in its
    PSS, including columns the process never reads."""
    digest = hashlib.sha256()
    buffer = bytearray(1 << 20)
    view = memoryview(buffer)
    fh.seek(start)
    while n := fh.readinto(buffer):
        digest.update(view[:n])
    return digest.hexdigest()


def _decode_arrays(
    view: mmap.mmap, what: str, check: Callable[[str, int], bool]
) -> DerivedArrays | None:
    """The document and arrays of a mapped arrays file (views into ``view``), or ``None``
    when the file is not whole or not of ``what``, or ``check(data_sha256, data_start)``
    (the header's sha256 of the data, and where the data starts) is false."""
    if view[: len(ARRAYS_MAGIC)] != ARRAYS_MAGIC:
        return None
    (length,) = struct.unpack_from("<Q", view, len(ARRAYS_MAGIC))
    start = len(ARRAYS_MAGIC) + 8
    if start + length > len(view):
        return None
    header = json.loads(view[start : start + length])
    base = _aligned(start + length)
    if (
        not isinstance(header, dict)
        or header.get("format") != ARRAYS
        or header.get("of") != what
        or len(view) != base + int(header["data_bytes"])
    ):
        return None
    if not check(str(header["data_sha256"]), base):
        return None
    data_bytes = len(view) - base
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    for spec in header["arrays"]:
        dtype = np.dtype(spec["dtype"])
        count, at = int(spec["count"]), int(spec["at"])
        if at < 0 or at + count * dtype.itemsize > data_bytes:
            return None
        arrays[spec["name"]] = np.frombuffer(view, dtype, count, base + at)
    doc = header["doc"]
    return (doc, arrays) if isinstance(doc, dict) else None


def catalog_cache() -> CatalogCache | None:
    """The cache the environment configures (see the module docstring), or ``None`` (off)."""
    setting = os.environ.get(ENV_DIR)
    if setting is not None and setting.strip().lower() in OFF:
        return None
    directory = Path(setting) if setting else default_dir()
    raw = os.environ.get(ENV_BYTES)
    try:
        max_bytes = DEFAULT_MAX_BYTES if not raw else int(raw)
    except ValueError as exc:
        raise UsageError(f"{ENV_BYTES}={raw!r} is not a byte count") from exc
    return CatalogCache(directory, max_bytes)
