"""The endpoint a store talks to, found where its client finds it and checked before any request.

A custom endpoint (``endpoint_url``, s3fs' ``client_kwargs.endpoint_url``, or what the backend's
client reads from the environment: ``Backend.environment_endpoint``) that can never work fails here,
at once and naming what to fix: no scheme, a scheme other than http(s), no host, or credentials
in the URL (refused with the secret masked: a client would send them or refuse the request).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..errors import InvalidURLError
from .backends.registry import backend_class
from .redact import redact

__all__ = [
    "Endpoint",
    "check_endpoint",
    "configured_endpoint",
    "endpoint_id",
    "endpoint_key",
]


# The schemes an endpoint URL may have: its client speaks HTTP to it.
_ENDPOINT_SCHEME = re.compile(r"https?")


@dataclass(frozen=True)
class Endpoint:
    """A custom endpoint URL and where it was given (for messages)."""

    url: str
    source: str


def configured_endpoint(protocol: str, options: Mapping[str, Any]) -> Endpoint | None:
    """The custom endpoint the protocol's client would use, in its order of precedence:
    the storage options, then the environment (``Backend.environment_endpoint``; S3:
    ``AWS_ENDPOINT_URL_S3`` before ``AWS_ENDPOINT_URL``, as botocore; GCS:
    ``STORAGE_EMULATOR_HOST``, as gcsfs). None: the client's default endpoint.
    ``StoreConfig.parse`` asks once per store (``StoreConfig.endpoint``)."""
    given = options.get("endpoint_url")
    if given:
        return Endpoint(str(given), "storage option endpoint_url")
    client = options.get("client_kwargs")
    if isinstance(client, Mapping) and client.get("endpoint_url"):
        return Endpoint(str(client["endpoint_url"]), "storage option client_kwargs.endpoint_url")
    found = backend_class(protocol).environment_endpoint()
    return None if found is None else Endpoint(*found)


def endpoint_id(protocol: str, options: Mapping[str, Any], root: str = "") -> str:
    """:func:`endpoint_key` of the endpoint ``options`` (and the environment) configure."""
    return endpoint_key(protocol, configured_endpoint(protocol, options), root)


def endpoint_key(protocol: str, endpoint: Endpoint | None, root: str = "") -> str:
    """Which server a store's requests go to (``scheme://host:port``, or the protocol's default
    endpoint as ``s3:``), so an answer from it can be remembered without its credentials.
    Where the URL names the endpoint (``http(s)://``), the root is its own (``root``: host and
    path)."""
    if backend_class(protocol).endpoint_in_url and root:
        return f"{protocol}://{root.split('/', 1)[0]}"
    if endpoint is None:
        return f"{protocol}:"
    try:
        parts = urlsplit(endpoint.url)
        port = parts.port
    except ValueError:
        return redact(endpoint.url)  # check_endpoint refuses it before any request
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


def check_endpoint(found: Endpoint | None) -> None:
    """Raise :class:`InvalidURLError` for a custom endpoint no request could reach."""
    if found is None:
        return
    shown = redact(found.url)
    where = f"endpoint URL {shown!r} ({found.source})"
    if "://" not in found.url:
        raise InvalidURLError(f"{where} has no scheme: write http://{shown} or https://{shown}")
    try:
        parts = urlsplit(found.url)
    except ValueError as exc:
        raise InvalidURLError(f"{where} cannot be parsed: {exc}") from None
    scheme = parts.scheme.lower()
    if not _ENDPOINT_SCHEME.fullmatch(scheme):
        raise InvalidURLError(
            f"{where} has scheme {scheme!r}: an endpoint URL starts with http:// or https://"
        )
    if "@" in parts.netloc:
        raise InvalidURLError(
            f"{where} carries credentials: remove them from the URL and give them as storage "
            "options (key/secret) or the client's environment variables"
        )
    try:
        _ = parts.port  # raises for a port that is not a number in range
    except ValueError:
        raise InvalidURLError(f"{where} has an invalid port") from None
    if not parts.hostname:
        raise InvalidURLError(f"{where} names no host: write {scheme}://HOST:PORT")
