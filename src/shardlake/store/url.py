"""Parsing and redaction of store URLs."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import InvalidURLError

__all__ = [
    "ParsedURL",
    "location",
    "parse_url",
    "redact",
]

_SECRET_QUERY = re.compile(r"(?i)(secret|token|key|password|signature|credential)[^=&]*=[^&]*")
# Userinfo of any URL in the text (a library's message quotes the endpoint URL it used).
_USERINFO = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s\"'<>]*@")

# Protocols with a bucket as the first path component.
BUCKET_PROTOCOLS = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"}


def redact(url: str) -> str:
    """Mask userinfo and secret-looking query parameters of URLs in ``url`` (a URL, or a message
    quoting some) for messages and reprs."""
    url = _USERINFO.sub(r"\1***@", url)
    return _SECRET_QUERY.sub(lambda m: m.group(0).split("=", 1)[0] + "=***", url)


@dataclass(frozen=True)
class ParsedURL:
    """A store URL split into fsspec protocol and root path (no trailing slash)."""

    protocol: str
    root: str
    url: str  # normalised, redacted form for messages

    @property
    def bucket(self) -> str | None:
        if self.protocol in BUCKET_PROTOCOLS:
            return self.root.split("/", 1)[0]
        return None


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
        return ParsedURL("file", os.path.normpath(url), os.path.normpath(url))
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
    if protocol == "file":
        if not rest.startswith("/"):
            raise InvalidURLError(
                f"store URL {redact(url)!r} is not absolute: write file:///absolute/path"
            )
        path = os.path.normpath(rest)
        return ParsedURL("file", path, f"file://{path}")
    if protocol == "memory":
        path = "/" + rest.strip("/")
        return ParsedURL("memory", path.rstrip("/") or "/", f"memory://{rest.strip('/')}")
    root = rest.strip("/")
    if protocol in BUCKET_PROTOCOLS and not root:
        raise InvalidURLError(
            f"store URL {redact(url)!r} names no bucket: use {protocol}://BUCKET/PREFIX"
        )
    if ".." in root.split("/"):
        raise InvalidURLError(f"store URL {redact(url)!r} contains a '..' segment")
    return ParsedURL(protocol, root, f"{protocol}://{root}")


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
