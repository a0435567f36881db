"""Storage options checked against what the protocol's filesystem accepts.

fsspec filesystems take their options as keywords, and most pass the ones they do not name on
(``**kwargs``) to a library that fails on the first request, if at all: s3fs hands them to
aiobotocore's session (``AioSession.__init__() got an unexpected keyword argument 'endpoint'``),
``LocalFileSystem`` keeps them silently. The names a filesystem accepts are those of the
``__init__`` of each class along its MRO up to the first that takes no ``**kwargs``, plus
fsspec's documented base options and the keywords of the library the rest is handed to.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ...errors import UsageError

__all__ = [
    "READ_CLIENT_OPTION",
    "RETRY_ATTEMPT_TIMEOUT_OPTION",
    "RETRY_DEADLINE_OPTION",
    "SHARDLAKE_OPTIONS",
    "accepted_options",
    "check_storage_options",
]

# shardlake's own storage options, the one list: ``StoreConfig.parse`` takes them out of the
# options (store/config.py), so the filesystem never sees them.
READ_CLIENT_OPTION = "read_client"  # which client reads: "obstore", "fsspec" (or its name)
RETRY_DEADLINE_OPTION = "retry_deadline"  # seconds: RetryPolicy.deadline
RETRY_ATTEMPT_TIMEOUT_OPTION = "retry_attempt_timeout"  # seconds: RetryPolicy.attempt_timeout
SHARDLAKE_OPTIONS = frozenset(
    {READ_CLIENT_OPTION, RETRY_DEADLINE_OPTION, RETRY_ATTEMPT_TIMEOUT_OPTION}
)
# fsspec.AbstractFileSystem: its instance cache and listings cache (DirCache) options.
_BASE_OPTIONS = frozenset(
    {"skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths"}
)


def _keywords(func: Callable[..., Any]) -> tuple[set[str], bool]:
    """Keyword parameter names of ``func`` and whether it takes ``**kwargs``."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return set(), True
    named = {
        p.name
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
    }
    return named, any(p.kind is p.VAR_KEYWORD for p in params)


def _documented_keywords(cls: type) -> set[str]:
    """``:keyword [type] name:`` entries of a class docstring (azure-identity documents its
    credentials' keyword arguments so)."""
    return set(re.findall(r":keyword (?:[^:]*\s)?(\w+):", cls.__doc__ or ""))


def _s3_session() -> set[str]:
    from aiobotocore.session import AioSession

    return _keywords(AioSession.__init__)[0]


def _azure_credential() -> set[str]:
    from azure.identity.aio import DefaultAzureCredential

    return _documented_keywords(DefaultAzureCredential)


def _http_request() -> set[str]:
    from aiohttp import ClientSession

    return _keywords(ClientSession._request)[0] - {"method", "str_or_url"}


def _s3_client() -> set[str]:
    from botocore.session import Session

    return _keywords(Session.create_client)[0] - {"service_name"}


def _s3_config() -> set[str]:
    from aiobotocore.config import AioConfig
    from botocore.config import Config

    return set(Config.OPTION_DEFAULTS) | _keywords(AioConfig.__init__)[0]


# Options that are themselves keyword dictionaries, and what they are handed to.
_NESTED: dict[str, dict[str, Callable[[], set[str]]]] = {
    "S3FileSystem": {"client_kwargs": _s3_client, "config_kwargs": _s3_config},
}


# Where a filesystem hands the options it does not name (by class name: no import needed).
_FORWARDED: dict[str, Callable[[], set[str]]] = {
    "S3FileSystem": _s3_session,
    "AzureBlobFileSystem": _azure_credential,
    "HTTPFileSystem": _http_request,
}


# Filesystems whose every consumer of options is known (another one, e.g. sftp handing its
# options to paramiko, is not checked).
_KNOWN = frozenset(
    {
        "S3FileSystem",
        "GCSFileSystem",
        "AzureBlobFileSystem",
        "LocalFileSystem",
        "MemoryFileSystem",
        "HTTPFileSystem",
    }
)


@functools.cache
def accepted_options(fs_class: type) -> frozenset[str] | None:
    """Every storage option ``fs_class`` accepts, or None where that cannot be told."""
    from fsspec import AbstractFileSystem

    if not any(cls.__name__ in _KNOWN for cls in fs_class.__mro__):
        return None
    names: set[str] = set()
    for cls in fs_class.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        if cls is AbstractFileSystem or cls is object:
            return frozenset(names | _BASE_OPTIONS)
        named, more = _keywords(init)
        names |= named
        forwarded = _FORWARDED.get(cls.__name__)
        if forwarded is not None:
            try:
                names |= forwarded()
            except ImportError:
                return None
        if not more:
            return frozenset(names)
    return frozenset(names | _BASE_OPTIONS)


def check_storage_options(protocol: str, options: Mapping[str, Any]) -> None:
    """Raise :class:`UsageError` naming a storage option the protocol's filesystem does not
    accept, and the nearest one it does (values are never shown: they may be secrets)."""
    import fsspec

    try:
        fs_class = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError):
        return  # a missing package: make_backend names the extra to install
    accepted = accepted_options(fs_class)
    if accepted is None:
        return
    unknown = sorted(set(options) - accepted - SHARDLAKE_OPTIONS)
    if unknown:
        raise UsageError(_unknown_message(protocol, fs_class, unknown[0], accepted))
    for cls in fs_class.__mro__:
        for option, keywords in _NESTED.get(cls.__name__, {}).items():
            given = options.get(option)
            if not isinstance(given, Mapping):
                continue
            valid = keywords()
            for name in sorted(set(given) - valid):
                raise UsageError(_unknown_message(protocol, fs_class, f"{option}.{name}", valid))


def _unknown_message(protocol: str, fs_class: type, name: str, accepted: Iterable[str]) -> str:
    nested, _, key = name.rpartition(".")
    valid = sorted(set(accepted) | (set() if nested else SHARDLAKE_OPTIONS))
    where = f"unknown storage option {name!r} for {protocol}:// ({fs_class.__name__})"
    near = [f"{nested}.{n}" if nested else n for n in difflib.get_close_matches(key, valid, n=1)]
    if near:
        return f"{where} - did you mean {near[0]}?"
    public = [v for v in valid if not v.startswith("_")]
    return f"{where}; valid: {', '.join(public)}"
