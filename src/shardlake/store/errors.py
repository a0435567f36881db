"""Translation of backend exceptions (OSError, botocore, gcsfs HTTP errors) to shardlake errors."""

from __future__ import annotations

from ..errors import (
    AlreadyExistsError,
    KeyNotFoundError,
    ShardlakeError,
    StoreError,
    StorePermissionError,
)
from .url import redact


def _status(exc: BaseException) -> int | None:
    for attr in ("status", "status_code", "code"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    return None


def translate_error(exc: BaseException, op: str, url: str) -> BaseException:
    """Map ``exc`` raised by ``op`` on ``url`` to the matching shardlake error."""
    if isinstance(exc, ShardlakeError):
        return exc
    where = f"{op} {redact(url)}"
    text = str(exc)
    status = _status(exc)
    if isinstance(exc, FileExistsError) or status == 412 or "PreconditionFailed" in text:
        return AlreadyExistsError(f"{where}: already exists")
    if isinstance(exc, FileNotFoundError) or status == 404 or "NoSuchKey" in text:
        if "NoSuchBucket" in text or "bucket" in text.lower() and "not" in text.lower():
            return KeyNotFoundError(f"{where}: bucket does not exist")
        return KeyNotFoundError(f"{where}: no such key")
    if isinstance(exc, PermissionError) or status in (401, 403):
        return StorePermissionError(f"{where}: access denied (check credentials)")
    if isinstance(exc, (ValueError, TypeError)):
        return exc
    return StoreError(f"{where}: {type(exc).__name__}: {redact(text)}")
