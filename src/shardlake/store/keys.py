"""Validation of store keys: ``/``-separated paths relative to a store's root."""

from __future__ import annotations

from ..errors import InvalidKeyError

__all__ = [
    "TEMP_PREFIX",
    "check_key",
    "check_prefix",
    "join_key",
]

# Temp files of in-flight local writes carry this prefix; keys may not, so listings skip them.
TEMP_PREFIX = ".shardlake-tmp-"


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid relative key, else raise :class:`InvalidKeyError`."""
    if not isinstance(key, str) or not key:
        raise InvalidKeyError(f"invalid key {key!r}: keys are non-empty strings")
    if key.startswith("/"):
        raise InvalidKeyError(f"invalid key {key!r}: keys are relative (no leading '/')")
    if "\\" in key or "\x00" in key:
        raise InvalidKeyError(f"invalid key {key!r}: no backslashes or NUL bytes")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidKeyError(f"invalid key {key!r}: no empty, '.' or '..' path segments")
    if any(p.startswith(TEMP_PREFIX) for p in parts):
        raise InvalidKeyError(
            f"invalid key {key!r}: segments starting {TEMP_PREFIX!r} are reserved"
        )
    return key


def check_prefix(prefix: str) -> str:
    """Normalise a listing prefix to ``""`` (everything) or a directory ending in ``/``."""
    if prefix in ("", "/"):
        return ""
    stripped = prefix.rstrip("/")
    check_key(stripped)
    return stripped + "/"


def join_key(*parts: str) -> str:
    """Join key segments with ``/`` and validate the result."""
    return check_key("/".join(p.strip("/") for p in parts if p))
