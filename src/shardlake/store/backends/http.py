"""Plain HTTP(S) roots, read-only: GET and ``Range`` through fsspec's HTTP filesystem.

A static web server, CDN or artifact host can serve a root (``docs/storage.md``, "Serving a
root over HTTPS"); it cannot list. The listings a reader needs are answered by a
:class:`RootListing` that the layer knowing the root's layout installs
(:func:`list_roots_with`; ``meta.rootindex`` answers from the root's index document,
``docs/format.md``, "Root index"): this backend knows nothing of that document but its key.
Any other listing, and every write, is refused with one line.

Ranged reads send ``Range``; a server that answers with the whole object (200, not 206) is
reported once per server (:class:`RangeIgnoredWarning`) and the requested bytes are cut from
the body, read only as far as needed.
"""

from __future__ import annotations

import asyncio
import builtins
import re
import ssl
import threading
import warnings
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

import fsspec
from fsspec.asyn import sync

from ...errors import CapabilityError, EndpointError, ReadOnlyStoreError, UsageError
from ..classify import chain
from ..retry import RetryPolicy
from .base import Backend, Entry, Leftover, nested_options
from .registry import WRITABLE_STORES

__all__ = [
    "HTTPBackend",
    "HTTPSBackend",
    "RangeIgnoredWarning",
    "RootListing",
    "list_roots_with",
]

_CONTENT_RANGE_RE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
# Ranged GETs of one read_ranges call in flight at once.
_CONCURRENCY = 16
_CHUNK = 1 << 20


class RootListing(Protocol):
    """Listings of a root that cannot be listed, from what the root publishes; installed by
    the layer that knows the root's layout (``meta.rootindex``), never known here."""

    # The document every served root holds: once it was read, a 403 for a key means "absent".
    index_key: str

    def list(
        self,
        prefix: str,
        read: Callable[[str], bytes],
        exists: Callable[[str], bool],
        url: Callable[[str], str],
    ) -> builtins.list[tuple[str, int]] | None:
        """``(key, size)`` of the objects under the directory ``prefix`` (``"commits/"``),
        keys relative to the root; None where that listing cannot be answered. ``read`` and
        ``exists`` take keys relative to the root (``read`` raises ``FileNotFoundError``),
        ``url`` names one for messages."""


_listing: RootListing | None = None


def list_roots_with(listing: RootListing) -> None:
    """Answer the listings of HTTP roots with ``listing`` (called by ``meta.rootindex``)."""
    global _listing
    _listing = listing


class RangeIgnoredWarning(UserWarning):
    """A server answered a ranged GET with the whole object (200 instead of 206)."""


_warned_servers: set[str] = set()
_warned_lock = threading.Lock()


def _warn_range_ignored(server: str) -> None:
    with _warned_lock:
        if server in _warned_servers:
            return
        _warned_servers.add(server)
    warnings.warn(
        f"{server} ignores HTTP Range requests (answered 200 with the whole object instead of "
        "206): reads stay correct but fetch every object from its start; serve the root with "
        "a server that honours Range",
        RangeIgnoredWarning,
        stacklevel=2,
    )


def _untrusted_certificate(exc: BaseException) -> bool:
    return any(
        isinstance(seen, ssl.SSLCertVerificationError)
        or any(cls.__name__ == "ClientConnectorCertificateError" for cls in type(seen).__mro__)
        for seen in chain(exc)
    )


class HTTPBackend(Backend):
    """``http://HOST[:PORT]/PATH``: read-only, listings from above (:class:`RootListing`), ranged
    GETs."""

    protocols = ("http",)
    extra = "http"
    endpoint_in_url = True
    scheme = "http"
    read_only = "read-only over HTTP"

    @classmethod
    def make_filesystem(
        cls, protocol: str, storage_options: dict[str, Any], policy: RetryPolicy
    ) -> fsspec.AbstractFileSystem:
        # The store's policy retries; each attempt is bounded by its request timeout.
        import aiohttp

        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=policy.request_timeout, sock_read=policy.request_timeout
        )
        options = nested_options(storage_options, "client_kwargs", {"timeout": timeout})
        fs = fsspec.filesystem(protocol, **options)
        try:  # the session now: a bad client_kwargs fails here, named, not at the first read
            sync(fs.loop, fs.set_session)
        except (TypeError, ValueError) as exc:
            raise UsageError(
                f"storage option client_kwargs for {protocol}:// is refused by "
                f"aiohttp.ClientSession: {exc}",
                options=("client_kwargs",),
            ) from exc
        return fs

    def _url(self, path: str) -> str:
        return f"{self.scheme}://{path.lstrip('/')}"

    def _server(self) -> str:
        return f"{self.scheme}://{self.root.split('/', 1)[0]}"

    def _request_kwargs(self, extra_headers: Mapping[str, str]) -> dict[str, Any]:
        """The filesystem's request options (headers, auth, ssl...) with ``extra_headers``."""
        kwargs = dict(getattr(self.fs, "kwargs", {}) or {})
        headers = dict(kwargs.pop("headers", None) or {})
        headers.update(extra_headers)
        kwargs["headers"] = headers
        return kwargs

    def _run(self, coro_fn: Any, *args: Any) -> Any:
        try:
            return sync(self.fs.loop, coro_fn, *args)
        except Exception as exc:
            if _untrusted_certificate(exc):  # no retry can fix it: say what does, at once
                raise EndpointError(
                    f"{self._server()}: the server's TLS certificate is not trusted ({exc}); "
                    "trust its CA (SSL_CERT_FILE=ca.pem) or, for a test server only, set the "
                    "storage option ssl=false"
                ) from exc
            raise

    # --- reads -------------------------------------------------------------------------------

    # Set once the root index was read: the server serves this root to us, so a 403 for a key
    # means "absent" (S3 and GCS answer 403 for a missing key to readers who may not list).
    _served = False

    async def _absent(self, path: str, status: int) -> bool:
        """Whether a reply of ``status`` for ``path`` means "no such key"."""
        if status == 404:
            return True
        if status != 403 or _listing is None:
            return False
        index = self.root.rstrip("/") + "/" + _listing.index_key
        if not self._served and path != index:
            try:
                await self._get(index)  # readable: the 403 was for a missing key
                self._served = True
            except Exception:  # noqa: BLE001 - not readable either: a real refusal
                return False
        return self._served

    def read(self, path: str) -> bytes:
        return bytes(self._run(self._get, path))

    async def _get(self, path: str) -> bytes:
        url = self._url(path)
        session = await self.fs.set_session()
        kwargs = self._request_kwargs({})
        async with session.get(self.fs.encode_url(url), **kwargs) as r:
            if await self._absent(path, r.status):
                raise FileNotFoundError(url)
            r.raise_for_status()
            return bytes(await r.read())

    def read_range(self, path: str, start: int, end: int) -> bytes:
        return bytes(self._run(self._get_range, path, start, end))

    def read_ranges(
        self, paths: list[str], starts: list[int], ends: list[int], *, views: bool = False
    ) -> list[bytes | memoryview]:
        async def all_ranges() -> list[bytes]:
            gate = asyncio.Semaphore(_CONCURRENCY)

            async def one(path: str, start: int, end: int) -> bytes:
                async with gate:
                    return await self._get_range(path, start, end)

            return list(
                await asyncio.gather(
                    *(one(p, s, e) for p, s, e in zip(paths, starts, ends, strict=True))
                )
            )

        out: list[bytes | memoryview] = list(self._run(all_ranges))
        return out

    async def _get_range(self, path: str, start: int, end: int) -> bytes:
        url = self._url(path)
        session = await self.fs.set_session()
        kwargs = self._request_kwargs(
            {"Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"}
        )
        async with session.get(self.fs.encode_url(url), **kwargs) as r:
            if await self._absent(path, r.status):
                raise FileNotFoundError(url)
            if r.status == 416:  # starts at or past the end: an empty slice
                return b""
            r.raise_for_status()
            if r.status == 206:
                got = _CONTENT_RANGE_RE.match(r.headers.get("Content-Range", ""))
                if got is not None and int(got.group(1)) != start:
                    raise OSError(
                        f"{url}: asked for bytes from {start}, the server sent "
                        f"{r.headers.get('Content-Range')}"
                    )
                return bytes(await r.read())
            # 200: the whole object. Read only as far as the range goes, then drop the rest.
            _warn_range_ignored(self._server())
            body = bytearray()
            while len(body) < end:
                chunk = await r.content.read(min(_CHUNK, end - len(body)))
                if not chunk:
                    break
                body += chunk
            return bytes(body[start:end])

    def stat(self, path: str) -> tuple[int, float | None]:
        size, mtime = self._run(self._head, path)
        return int(size), mtime

    async def _head(self, path: str) -> tuple[int, float | None]:
        url = self._url(path)
        session = await self.fs.set_session()
        kwargs = self._request_kwargs({"Accept-Encoding": "identity"})
        kwargs.setdefault("allow_redirects", True)
        async with session.head(self.fs.encode_url(url), **kwargs) as r:
            if await self._absent(path, r.status):
                raise FileNotFoundError(url)
            r.raise_for_status()
            length = r.headers.get("Content-Length")
            modified = r.headers.get("Last-Modified")
        mtime = None
        if modified:
            try:
                mtime = parsedate_to_datetime(modified).timestamp()
            except (TypeError, ValueError):
                mtime = None
        if length is None:  # no length on HEAD: let fsspec find it (a GET, not read)
            info = await self.fs._info(url)
            length = info.get("size")
            if length is None:
                raise OSError(f"{url}: the server gives no Content-Length")
        return int(length), mtime

    # --- listings, answered from above (RootListing) ------------------------------------------

    def list(self, prefix_path: str) -> list[Entry]:
        base = self.root.rstrip("/") + "/"
        rel = prefix_path[len(base) :] if prefix_path.startswith(base) else prefix_path
        listing = _listing
        found = None
        if listing is not None:

            def read(key: str) -> bytes:
                data = self.read(base + key)
                if key == listing.index_key:
                    self._served = True
                return data

            found = listing.list(
                rel, read, lambda key: self.exists(base + key), lambda key: self._url(base + key)
            )
        if found is None:
            known = "what the root publishes" if listing is None else listing.index_key
            raise CapabilityError(
                f"{self._url(prefix_path)}: listing {rel or 'the root'} is not possible over "
                f"HTTP (only what {known} names is known); run this command where the root is "
                f"stored ({WRITABLE_STORES})"
            )
        return [(base + key, size, None) for key, size in found]

    # --- writes: refused ---------------------------------------------------------------------

    def _refuse(self, path: str) -> ReadOnlyStoreError:
        return ReadOnlyStoreError(
            f"{self._url(path)}: the root is read-only over HTTP; write to the store it is "
            f"served from ({WRITABLE_STORES})"
        )

    def write(self, path: str, data: bytes) -> None:
        raise self._refuse(path)

    def create(self, path: str, data: bytes) -> None:
        raise self._refuse(path)

    def _open_for_write(self, path: str) -> Any:
        raise self._refuse(path)

    def delete(self, path: str) -> None:
        raise self._refuse(path)

    def leftovers(self, prefix_path: str) -> builtins.list[Leftover]:
        return []


class HTTPSBackend(HTTPBackend):
    """``https://HOST[:PORT]/PATH``: as :class:`HTTPBackend`, over TLS."""

    protocols = ("https",)
    scheme = "https"
    read_only = "read-only over HTTPS"
