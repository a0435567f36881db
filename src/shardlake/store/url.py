"""Parsing of store URLs (each backend splits its own roots: ``Backend.split_root``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import InvalidURLError
from .backends.registry import backend_class, path_protocol
from .redact import redact

__all__ = [
    "ParsedURL",
    "location",
    "parse_url",
    "redact",
]


@dataclass(frozen=True)
class ParsedURL:
    """A store URL split into fsspec protocol and root path (no trailing slash)."""

    protocol: str
    root: str
    url: str  # normalised, redacted form for messages
    bucket: str | None = None  # the first path component where the backend has buckets


def parse_url(url: str) -> ParsedURL:
    """Parse ``/abs/path``, ``file://``, ``memory://``, ``s3://bucket/prefix``, ``gs://...``."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidURLError("store URL is empty: give an absolute path or a URL like s3://bucket")
    url = url.strip()
    if "://" not in url:
        if not os.path.isabs(url):
            raise InvalidURLError(
                f"store path {url!r} is relative: give an absolute path (e.g. {os.path.abspath(url)})"
            )
        return ParsedURL(path_protocol(), os.path.normpath(url), os.path.normpath(url))
    parts = urlsplit(url)
    protocol = parts.scheme.lower()
    if not protocol:
        raise InvalidURLError(f"store URL {redact(url)!r} has no protocol")
    rest = url.split("://", 1)[1]
    if "@" in rest.split("/", 1)[0]:
        raise InvalidURLError(
            f"store URL {redact(url)!r} carries credentials: remove them from the URL and pass "
            "them via storage_options or the backend's environment variables"
        )
    if "?" in rest or "#" in rest:
        raise InvalidURLError(
            f"store URL {redact(url)!r} has a query or fragment: pass options via storage_options"
        )
    cls = backend_class(protocol)
    root, shown = cls.split_root(protocol, rest, url)
    bucket = root.split("/", 1)[0] if cls.bucket_noun is not None else None
    return ParsedURL(protocol, root, shown, bucket)


def location(url: str | os.PathLike[str], name: str = "url") -> str:
    """``url`` as the store layer takes it: a local path made absolute, a URL unchanged.

    An empty or blank ``url`` is refused naming the argument ``name``: made absolute it would
    be the current directory, which no caller means (an unset config field, usually)."""
    url = os.fspath(url)
    if not isinstance(url, str) or not url.strip():
        raise InvalidURLError(
            f"{name} is empty ({url!r}): give the dataset root as an absolute path or a URL "
            "like s3://bucket/prefix (an empty root is never the current directory)"
        )
    if "://" not in url:
        url = os.path.abspath(os.path.expanduser(url))
    return url
