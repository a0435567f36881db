"""The backend interface: the generic fsspec backend every other one refines.

Backends work on filesystem paths (``Store.path``) and raise the underlying library's
exceptions; ``Store`` validates keys, retries and translates errors.  Ranges handed to a backend
are never empty (``end > start``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, BinaryIO, ClassVar

import fsspec

from ...errors import InvalidURLError
from ..classify import status_of
from ..layers import note_read_client
from ..redact import redact
from ..retry import RetryPolicy

if TYPE_CHECKING:
    from ..endpoint import Endpoint

__all__ = [
    "Backend",
    "BucketBackend",
    "EndpointMismatch",
    "Entry",
    "Leftover",
    "is_already_exists",
    "is_unsatisfiable_range",
    "nested_options",
]

Entry = tuple[str, int, "float | None"]


@dataclass(frozen=True)
class Leftover:
    """Staging a killed writer left behind: a local temp file or an unfinished multipart upload."""

    path: str
    started: float | None  # seconds since the epoch, None where unknown
    upload_id: str | None = None


def is_unsatisfiable_range(exc: BaseException) -> bool:
    """True for "range starts at or past the end" (HTTP 416) from s3fs / gcsfs."""
    if getattr(exc, "code", None) == 416 or getattr(exc, "status", None) == 416:
        return True
    text = str(exc).lower()
    return "range is not satisfiable" in text or "invalidrange" in text


def is_already_exists(exc: BaseException) -> bool:
    """True for a refused create-if-absent (EEXIST, HTTP 412 PreconditionFailed)."""
    if isinstance(exc, FileExistsError):
        return True
    if getattr(exc, "code", None) == 412 or getattr(exc, "status", None) == 412:
        return True
    return "preconditionfailed" in str(exc).replace(" ", "").lower()


class Backend:
    """Generic fsspec backend; subclasses override the atomic primitives.

    For protocols without a dedicated subclass, create-if-absent is whatever the fsspec
    implementation's ``pipe_file(mode="create")`` does (often check-then-write, not atomic).
    """

    # --- the backend's facts: all the store layer and the registry know of it ---------------
    # (docs/architecture.md, "Add a backend"). The URL schemes it serves, its name first.
    protocols: ClassVar[tuple[str, ...]] = ()
    # The extra that installs its packages: pip install 'shardlake[<extra>]'.
    extra: ClassVar[str | None] = None
    # What the first component of a root is ("bucket", "container"); None: a plain path.
    bucket_noun: ClassVar[str | None] = None
    # What to set when no credentials are found (environment variables, storage options).
    credential_hint: ClassVar[str] = "configure the backend's credentials"
    # Requests cross a network (an endpoint that answered is remembered: store.retry).
    networked: ClassVar[bool] = True
    # Roots are paths of this machine's filesystem.
    local_paths: ClassVar[bool] = False
    # The URL's host is the endpoint (no endpoint is configured apart from the URL).
    endpoint_in_url: ClassVar[bool] = False
    # The fsspec client obstore stands in for on reads (``read_client`` takes its name too);
    # None: obstore does not read this backend (see :meth:`obstore_config`).
    fsspec_client: ClassVar[str | None] = None
    # Why the store cannot be written ("read-only over HTTP"), or None where it can.
    read_only: str | None = None

    @classmethod
    def split_root(cls, protocol: str, rest: str, url: str) -> tuple[str, str]:
        """``(root, url for messages)`` of a URL ``protocol://rest``; :class:`InvalidURLError`
        for one that names no root (no bucket where the backend has buckets, a ``..``)."""
        root = rest.strip("/")
        if cls.bucket_noun is not None and not root:
            upper = cls.bucket_noun.upper()
            raise InvalidURLError(
                f"store URL {redact(url)!r} names no {cls.bucket_noun}: use "
                f"{protocol}://{upper}/PREFIX"
            )
        if ".." in root.split("/"):
            raise InvalidURLError(f"store URL {redact(url)!r} contains a '..' segment")
        return root, f"{protocol}://{root}"

    @classmethod
    def environment_endpoint(cls) -> tuple[str, str] | None:
        """``(url, where)``: the custom endpoint the client takes from the environment when the
        storage options name none (``endpoint_url``, ``client_kwargs.endpoint_url``)."""
        return None

    @classmethod
    def obstore_config(
        cls, options: dict[str, Any], endpoint: Endpoint | None
    ) -> dict[str, Any] | str:
        """obstore's store keywords for these fsspec storage ``options`` and the store's
        ``endpoint``, or why obstore cannot read this store as the fsspec client would."""
        return f"obstore does not read {cls.protocols[0] if cls.protocols else 'it'}://"

    @classmethod
    def obstore_store(cls, bucket: str, config: dict[str, Any], common: dict[str, Any]) -> Any:
        """obstore's store of ``bucket`` (:meth:`obstore_config` keywords, ``common`` client
        and retry settings); only called where :attr:`fsspec_client` is set."""
        raise NotImplementedError(f"obstore does not read {cls.__name__} stores")

    # Keyword arguments of ``cat_file`` for a whole-object read (per filesystem class).
    whole_read_options: Mapping[str, Any] = MappingProxyType({})

    def batches_single_ranges(self) -> bool:
        """Whether a ``Store.read_ranges`` call of one range goes to :meth:`read_ranges` (a
        faster multi-read client, e.g. obstore on S3, GCS, Azure) rather than :meth:`read_range`."""
        return False

    def __init__(
        self, fs: fsspec.AbstractFileSystem, root: str, policy: RetryPolicy | None = None
    ) -> None:
        self.fs = fs
        self.root = root
        self.policy = policy or RetryPolicy()  # for requests a library sends on our behalf

    @classmethod
    def make_filesystem(
        cls, protocol: str, storage_options: dict[str, Any], policy: RetryPolicy
    ) -> fsspec.AbstractFileSystem:
        """The filesystem for ``protocol``; backends of networked stores override this to cap
        their library's own retries and timeouts at ``policy`` (the store retries, not them)."""
        return fsspec.filesystem(protocol, **storage_options)

    def make_bucket(self, bucket: str) -> bool:
        """Create ``bucket`` (the URL's first component) unless it exists (fsspec ``mkdir``,
        which s3fs, gcsfs and adlfs implement); True when it was created."""
        fs = self.fs
        fs.invalidate_cache()
        if fs.exists(bucket):
            return False
        fs.mkdir(bucket)
        fs.invalidate_cache()
        return True

    def leftovers(self, prefix_path: str) -> list[Leftover]:
        """Staging left by killed streaming writers under ``prefix_path`` (none by default)."""
        return []

    def discard_leftover(self, leftover: Leftover) -> None:
        raise NotImplementedError(f"{type(self).__name__} leaves no staging behind")

    def _fresh(self, path: str | None = None) -> None:
        """Drop cached listings so a check sees what other writers did since."""

    # --- reads -------------------------------------------------------------------------------

    def read(self, path: str) -> bytes:
        self._fresh(path)
        return bytes(self.fs.cat_file(path, **self.whole_read_options))

    def read_range(self, path: str, start: int, end: int) -> bytes:
        try:
            found = bytes(self.fs.cat_file(path, start=start, end=end))
            note_read_client("fsspec")
            return found
        except Exception as exc:
            if is_unsatisfiable_range(exc):  # start at/after the end: an empty slice
                return b""
            raise

    def read_ranges(
        self, paths: list[str], starts: list[int], ends: list[int], *, views: bool = False
    ) -> list[bytes | memoryview]:
        """The ranges, in order; ``views``: memoryviews of the client's buffers are fine."""
        found = self.fs.cat_ranges(paths, starts, ends, on_error="return")
        note_read_client("fsspec")
        out: list[bytes | memoryview] = []
        for item in found:
            if isinstance(item, BaseException):
                if not is_unsatisfiable_range(item):
                    raise item
                item = b""
            out.append(bytes(item))
        return out

    def stat(self, path: str) -> tuple[int, float | None]:
        self._fresh(path)
        info = self.fs.info(path)
        if info.get("type") == "directory":
            raise FileNotFoundError(path)
        return int(info.get("size") or 0), _mtime_of(info)

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
        except FileNotFoundError:
            return False
        return True

    def _normalise(self, path: str) -> str:
        # fsspec object stores return "bucket/key"; the memory filesystem "/key".
        if self.root.startswith("/"):
            return path if path.startswith("/") else "/" + path
        return path.lstrip("/")

    def list(self, prefix_path: str) -> list[Entry]:
        """Objects strictly under the directory ``prefix_path`` (which ends in ``/``)."""
        self._fresh()
        try:
            found = self.fs.find(prefix_path.rstrip("/"), detail=True, withdirs=False)
        except FileNotFoundError:
            return []
        out: list[Entry] = []
        for raw, info in found.items():
            if info.get("type") == "directory":
                continue
            path = self._normalise(str(info.get("name") or raw))
            # find("a") may return the object "a" itself or, on some stores, "ab/..."
            if path.startswith(prefix_path):
                out.append((path, int(info.get("size") or 0), _mtime_of(info)))
        return out

    # --- writes ------------------------------------------------------------------------------

    def write(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data)
        self._fresh(path)

    def create(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data, mode="create")
        self._fresh(path)

    def _open_for_write(self, path: str) -> Any:
        # Never mode "xb": s3fs turns an empty "xb" file into an unconditional PUT.
        return self.fs.open(path, "wb")

    @contextmanager
    def open_writer(self, path: str) -> Iterator[BinaryIO]:
        handle = self._open_for_write(path)
        try:
            yield handle
        except BaseException:
            _discard(handle)
            raise
        self._commit_writer(handle, path)
        self._fresh(path)

    def _commit_writer(self, handle: Any, path: str) -> None:
        """Make a streamed write visible (close it); a backend may settle its races here."""
        handle.close()

    def delete(self, path: str) -> None:
        with suppress(FileNotFoundError):
            self.fs.rm_file(path)
        self._fresh(path)


def _discard(handle: Any) -> None:
    """Abandon a write handle so nothing is committed, not even by a later ``close``/``__del__``."""
    discard = getattr(handle, "discard", None)
    try:
        if callable(discard):
            discard()  # s3fs: abort the multipart upload; gcsfs: cancel the resumable session
    finally:
        # gcsfs' discard returns early (without closing) before an upload began; a later close()
        # from __del__ would then upload the buffered bytes.  Mark it closed so it never does.
        try:
            handle.buffer = None
            handle.closed = True
        except AttributeError:  # not an fsspec buffered file; nothing buffered to commit
            pass


def _mtime_of(info: dict[str, Any]) -> float | None:
    for name in ("mtime", "LastModified", "updated", "created"):
        value = info.get(name)
        if value is None:
            continue
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


def nested_options(
    storage_options: Mapping[str, Any],
    key: str,
    defaults: Mapping[str, Any],
    forced: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A copy of ``storage_options`` whose dict ``key`` (options a backend passes on to its
    client library) has ``defaults`` where the user set nothing and ``forced`` over what they
    set."""
    options = dict(storage_options)
    options[key] = {**defaults, **(options.get(key) or {}), **(forced or {})}
    return options


class EndpointMismatch(OSError):
    """The endpoint answered, but not in the store's protocol (a web page where S3 was expected)."""


_FORKED = "this process was forked after its parent started obstore's runtime"


class BucketBackend(Backend):
    """Object stores: listing caches are dropped before every check, and a request that fails
    permanently is explained (:meth:`explain`): a missing bucket says so (not "no such key",
    not an empty listing). Ranged multi-reads go through ``fast_reads`` (obstore, see
    ``backends.obstore``) where it is set and usable in this process."""

    _bucket_seen = False
    fast_reads: Any = None  # backends.obstore.ObstoreReads, unless read_client="fsspec"
    # Says why obstore, the default, cannot serve these reads (options it cannot sign with);
    # called at the first read it would have served (backends.obstore.warn_fallback).
    fast_reads_unavailable: Callable[[], None] | None = None

    def batches_single_ranges(self) -> bool:
        # The loader's chunks are one coalesced range each: they must reach obstore too (or
        # say why they cannot).
        return self.fast_reads is not None or self.fast_reads_unavailable is not None

    def read_ranges(
        self, paths: list[str], starts: list[int], ends: list[int], *, views: bool = False
    ) -> list[bytes | memoryview]:
        fast = self.fast_reads
        if fast is None:
            if self.fast_reads_unavailable is not None:
                self.fast_reads_unavailable()
            return super().read_ranges(paths, starts, ends, views=views)
        if not fast.usable():
            fast.warn(_FORKED)
            return super().read_ranges(paths, starts, ends, views=views)
        failed: BaseException | None = None
        try:
            out: list[bytes | memoryview] = fast.read_ranges(paths, starts, ends, views=views)
            if all(len(b) == e - s for b, s, e in zip(out, starts, ends, strict=True)):
                note_read_client("obstore")
                fast.served()
                return out
        except BaseException as exc:  # a Rust panic is a BaseException
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            failed = exc
        # The fsspec path answers with the store's semantics and errors (a range past the end,
        # a missing key, an outage). Where it reads in full what obstore failed to, obstore
        # may not work here at all: say so (see ObstoreReads.fell_back).
        found = super().read_ranges(paths, starts, ends, views=views)
        if failed is not None and all(
            len(b) == e - s for b, s, e in zip(found, starts, ends, strict=True)
        ):
            fast.fell_back(failed)
        return found

    def _fresh(self, path: str | None = None) -> None:
        self.fs.invalidate_cache(path)

    def explain(self, path: str, exc: BaseException | None) -> None:
        """Raise what a failure (or an empty listing: ``exc`` None) at ``path`` really means,
        when that is more than the reply said; return to let the original stand."""
        if exc is not None and not isinstance(exc, FileNotFoundError):
            return
        if self._bucket_seen:
            return
        bucket = path.split("/", 1)[0]
        if not self.fs.exists(bucket):
            raise FileNotFoundError(f"bucket does not exist: {bucket}")
        self._bucket_seen = True  # buckets rarely vanish; one check per filesystem suffices

    def list(self, prefix_path: str) -> list[Entry]:
        try:
            out = super().list(prefix_path)
        except Exception as exc:
            self.explain(prefix_path, exc)
            raise
        if not out:
            self.explain(prefix_path, None)
        return out

    def read(self, path: str) -> bytes:
        try:
            return super().read(path)
        except Exception as exc:
            self.explain(path, exc)
            raise

    def stat(self, path: str) -> tuple[int, float | None]:
        try:
            return super().stat(path)
        except Exception as exc:
            self.explain(path, exc)
            raise

    def write(self, path: str, data: bytes) -> None:
        try:
            super().write(path, data)
        except Exception as exc:
            self.explain(path, exc)
            raise

    def create(self, path: str, data: bytes) -> None:
        try:
            self._create(path, data)
        except Exception as exc:
            if not isinstance(exc, FileExistsError):
                self.explain(path, exc)
            raise
        self._fresh(path)

    def _create(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data, mode="create")

    def _create_or_exists(
        self, path: str, data: bytes, refused: Callable[[BaseException], bool], **upload: Any
    ) -> Any:
        """``pipe_file(mode="create")`` where the client may report the server's "it exists"
        reply as some other error: ``refused`` (the backend's reading of its protocol) says when
        it is one, and that is raised as :class:`FileExistsError`. Returns the client's reply."""
        try:
            return self.fs.pipe_file(path, data, mode="create", **upload)
        except FileExistsError:
            raise
        except Exception as exc:
            if refused(exc):
                raise FileExistsError(f"{path}: already exists (HTTP {status_of(exc)})") from exc
            raise
