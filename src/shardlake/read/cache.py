"""A node-local epoch cache of sample payloads fetched from a (remote) store.

Why: every epoch over a remote store fetches every byte again. With ``cache_dir`` the loader
keeps the payloads it fetched as local files and reads them from there the next epoch.

What is cached: one file per fetched sample payload (the compressed bytes of one member of a
shard), under ``<cache_dir>/shardlake-cache-1/<digest of the shard key>/<offset>-<size>-<crc32>``.
Shard keys name immutable, content-addressed data revisions, so an entry never goes stale: the
same name always means the same bytes. The cache is never the canonical copy: an entry that
fails its check (size and CRC-32 against the manifest, on every read) is deleted and the payload
is fetched from the store again.

Sharing: every DataLoader worker of every rank on a node may use one directory at once. An
entry is written to a temporary file and renamed into place (readers see a whole entry or none;
a killed writer leaves only a temporary file, which a later scan removes once its writer process
is gone). The bytes in use are counted in a small ledger file updated under an exclusive
``flock``; a scan of the directory corrects the ledger whenever the budget looks exhausted.

Eviction knows the plan: the loader tells the cache which payloads its selection needs
(:meth:`EpochCache.want`); only entries outside that set (other selections or versions) are
evicted. When the selection's payloads do not all fit into ``cache_bytes``, a fixed part of them
stays cached, the rest is fetched from the store every epoch (one warning says so), and nothing
the epoch still needs is ever thrown out to make room for something it needs just as much.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import warnings
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "LAYOUT",
    "CacheBudgetWarning",
    "EpochCache",
]

DEFAULT_CACHE_BYTES = 64 * 2**30  # when cache_dir is given without cache_bytes
LAYOUT = "shardlake-cache-1"
LEDGER = "usage"
TEMP_MARK = ".tmp."


class CacheBudgetWarning(UserWarning):
    """The epoch cache cannot hold the whole selection; the rest is re-fetched every epoch."""


def shard_dir_name(shard_key: str) -> str:
    """The directory of one shard's entries (a digest: keys may be long or contain slashes)."""
    return hashlib.sha256(shard_key.encode("utf-8")).hexdigest()[:32]


def entry_name(offset: int, size: int, crc32: int) -> str:
    return f"{offset:012x}-{size:x}-{crc32 & 0xFFFFFFFF:08x}"


def _entry_offset(name: str) -> int | None:
    head, _, rest = name.partition("-")
    if not rest or TEMP_MARK in name:
        return None
    try:
        return int(head, 16)
    except ValueError:
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class EpochCache:
    """Payload files under ``cache_dir``, at most ``cache_bytes`` of them (see the module doc).

    Parameters
    ----------
    cache_dir:
        A local directory (created if missing); share it between the ranks and workers of a node.
    cache_bytes:
        The budget for entries, in bytes.
    """

    def __init__(self, cache_dir: str | os.PathLike[str], cache_bytes: int) -> None:
        if int(cache_bytes) < 0:
            raise UsageError(f"cache_bytes must be >= 0, got {cache_bytes}")
        self.root = Path(cache_dir) / LAYOUT
        self.cache_bytes = int(cache_bytes)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cache_dir {str(cache_dir)!r} is not usable: {exc}") from exc
        self._wanted: dict[str, np.ndarray[Any, Any]] = {}
        self._warned = False
        self._full = False
        self.hits = self.misses = self.rejected = self.stored = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"root": str(self.root.parent), "cache_bytes": self.cache_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"], state["cache_bytes"])  # type: ignore[misc]

    # --- entries -------------------------------------------------------------------------------

    def drop_shards(self, shard_keys: Iterable[str]) -> int:
        """Delete every entry of ``shard_keys`` (shards a forget deleted); how many went. The
        ledger is corrected by the next scan."""
        gone = 0
        for key in shard_keys:
            folder = self.root / shard_dir_name(key)
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                with contextlib.suppress(OSError):
                    (folder / name).unlink()
                    gone += 1
            with contextlib.suppress(OSError):
                folder.rmdir()
        return gone

    def path(self, shard_key: str, offset: int, size: int, crc32: int) -> Path:
        return self.root / shard_dir_name(shard_key) / entry_name(offset, size, crc32)

    def get(self, shard_key: str, offset: int, size: int, crc32: int) -> bytes | None:
        """The cached payload, checked (size, CRC-32); ``None`` if absent or bad (bad is deleted)."""
        path = self.path(shard_key, offset, size, crc32)
        try:
            with open(path, "rb") as fh:
                data = fh.read(size + 1)
        except FileNotFoundError:
            self.misses += 1
            return None
        if len(data) != size or zlib.crc32(data) & 0xFFFFFFFF != crc32 & 0xFFFFFFFF:
            self.rejected += 1
            self._discard(path)
            return None
        self.hits += 1
        return data

    def put(self, shard_key: str, offset: int, size: int, crc32: int, data: Any) -> bool:
        """Store a payload already checked against the manifest; False when there is no room."""
        if self._full or len(data) != size or size > self.cache_bytes:
            return self._refuse()
        path = self.path(shard_key, offset, size, crc32)
        if path.exists():
            return True
        path.parent.mkdir(exist_ok=True)
        temp = path.with_name(f"{path.name}{TEMP_MARK}{os.getpid()}.{secrets.token_hex(4)}")
        try:
            with open(temp, "wb") as fh:
                fh.write(data)
            with self._ledger() as ledger:
                if path.exists():  # another process stored it meanwhile: count it once
                    return True
                if ledger.used + size > self.cache_bytes:
                    ledger.used = self._scan()
                    if ledger.used + size > self.cache_bytes:
                        ledger.used -= self._evict(ledger.used + size - self.cache_bytes)
                if ledger.used + size > self.cache_bytes:
                    self._full = True  # what is cached is all needed: stop trying (no churn)
                    return self._refuse()
                os.replace(temp, path)
                ledger.used += size
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
        self.stored += 1
        return True

    def _refuse(self) -> bool:
        self.rejected += 1
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"epoch cache {self.root.parent} is full (cache_bytes={self.cache_bytes}) with "
                "payloads this selection needs; the rest is fetched from the store every epoch "
                "(raise cache_bytes to cache the whole selection)",
                CacheBudgetWarning,
                stacklevel=3,
            )
        return False

    @staticmethod
    def _discard(path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    # --- what the plan needs -------------------------------------------------------------------

    def want(self, entries: Iterable[tuple[str, np.ndarray[Any, Any]]]) -> None:
        """Declare the payloads the current selection needs: ``(shard_key, offsets)`` pairs.

        Entries outside this set may be evicted; entries inside it never are.
        """
        wanted: dict[str, list[np.ndarray[Any, Any]]] = {}
        for shard_key, offsets in entries:
            wanted.setdefault(shard_dir_name(shard_key), []).append(np.asarray(offsets))
        self._wanted = {d: np.unique(np.concatenate(v)) for d, v in wanted.items()}

    # --- accounting ----------------------------------------------------------------------------

    def usage(self) -> int:
        """Bytes held by complete entries (a scan; also corrects the ledger, drops dead temps)."""
        with self._ledger() as ledger:
            ledger.used = self._scan()
            return ledger.used

    @contextlib.contextmanager
    def _ledger(self) -> Iterator[_Ledger]:
        path = self.root / LEDGER
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, 64, 0).strip()
            ledger = _Ledger(int(raw) if raw.isdigit() else self._scan())
            yield ledger
            text = str(max(0, ledger.used)).encode()
            os.pwrite(fd, text.ljust(20), 0)
        finally:
            os.close(fd)  # releases the lock

    def _entries(self) -> Iterator[tuple[Path, os.DirEntry[str]]]:
        with os.scandir(self.root) as shard_dirs:
            for shard_dir in shard_dirs:
                if not shard_dir.is_dir():
                    continue
                with os.scandir(shard_dir.path) as files:
                    for entry in files:
                        yield Path(shard_dir.path), entry

    def _scan(self) -> int:
        """Bytes of complete entries; removes temporary files whose writer is gone."""
        used = 0
        for _, entry in self._entries():
            if TEMP_MARK in entry.name:
                pid = entry.name.rsplit(TEMP_MARK, 1)[1].split(".")[0]
                if not pid.isdigit() or not _pid_alive(int(pid)):
                    self._discard(Path(entry.path))
                continue
            with contextlib.suppress(FileNotFoundError):
                used += entry.stat().st_size
        return used

    def _evict(self, need: int) -> int:
        """Delete entries the selection does not need until ``need`` bytes are freed."""
        freed = 0
        for shard_dir, entry in self._entries():
            if freed >= need:
                break
            offset = _entry_offset(entry.name)
            if offset is None:
                continue
            wanted = self._wanted.get(shard_dir.name)
            if wanted is not None:
                i = int(np.searchsorted(wanted, offset))
                if i < len(wanted) and int(wanted[i]) == offset:
                    continue
            try:
                size = entry.stat().st_size
                os.unlink(entry.path)
            except FileNotFoundError:
                continue
            freed += size
        return freed


class _Ledger:
    def __init__(self, used: int) -> None:
        self.used = used
