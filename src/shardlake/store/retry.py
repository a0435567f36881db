"""Bounded, jittered exponential backoff for transient storage failures."""

from __future__ import annotations

import errno
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..errors import (
    AlreadyExistsError,
    KeyNotFoundError,
    RetriesExhaustedError,
    ShardlakeError,
    StorePermissionError,
    TransientStoreError,
    UsageError,
)
from .url import redact

T = TypeVar("T")

log = logging.getLogger("shardlake.store")

_TRANSIENT_ERRNOS = {
    errno.ESTALE,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ECONNREFUSED,
    errno.ETIMEDOUT,
    errno.EAGAIN,
    errno.EPIPE,
    errno.EIO,
}
_TRANSIENT_MARKERS = (
    "slowdown",
    "slow down",
    "throttl",
    "toomanyrequests",
    "too many requests",
    "internalerror",
    "internal error",
    "service unavailable",
    "serviceunavailable",
    "bad gateway",
    "gateway timeout",
    "requesttimeout",
    "connection reset",
    "connection aborted",
    "server disconnected",
    "timed out",
    "timeout",
)
_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a transient failure.

    ``attempts`` counts every try, the first included. The delay before retry ``n`` (1-based) is
    uniform in ``[0, min(max_delay, base_delay * 2**(n-1))]`` ("full jitter").
    """

    attempts: int = 5
    base_delay: float = 0.1
    max_delay: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise UsageError("RetryPolicy.attempts must be >= 1")
        if self.base_delay < 0 or self.max_delay < 0:
            raise UsageError("RetryPolicy delays must be >= 0")

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """The default policy, overridable by ``SHARDLAKE_RETRY_ATTEMPTS``,
        ``SHARDLAKE_RETRY_BASE_DELAY`` and ``SHARDLAKE_RETRY_MAX_DELAY`` (seconds)."""
        defaults = cls()
        try:
            return cls(
                attempts=int(os.environ.get("SHARDLAKE_RETRY_ATTEMPTS", defaults.attempts)),
                base_delay=float(os.environ.get("SHARDLAKE_RETRY_BASE_DELAY", defaults.base_delay)),
                max_delay=float(os.environ.get("SHARDLAKE_RETRY_MAX_DELAY", defaults.max_delay)),
            )
        except ValueError as exc:
            raise UsageError(f"invalid SHARDLAKE_RETRY_* setting: {exc}") from None

    def delay(self, retry_number: int) -> float:
        cap = min(self.max_delay, self.base_delay * (2 ** (retry_number - 1)))
        return random.uniform(0.0, cap)


NO_RETRY = RetryPolicy(attempts=1)


def _status_of(exc: BaseException) -> int | None:
    for attr in ("status", "status_code", "code"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        meta = response.get("ResponseMetadata", {})
        status = meta.get("HTTPStatusCode") if isinstance(meta, dict) else None
        if isinstance(status, int):
            return status
    return None


def is_transient(exc: BaseException) -> bool:
    """True for failures worth retrying: 5xx/429, throttling, resets, timeouts, ``ESTALE``."""
    if isinstance(exc, TransientStoreError):
        return True
    if isinstance(
        exc, (ShardlakeError, KeyNotFoundError, AlreadyExistsError, StorePermissionError)
    ):
        return False
    if isinstance(exc, (ValueError, TypeError, NotADirectoryError)):
        return False
    if isinstance(exc, (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError)):
        return False
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    status = _status_of(exc)
    if status is not None:
        return status in _TRANSIENT_STATUS
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    text = f"{type(exc).__name__} {exc}".lower()
    return any(marker in text for marker in _TRANSIENT_MARKERS)


def call_with_retry(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    describe: Callable[[], str],
    translate: Callable[[BaseException], BaseException],
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``fn``; retry transient failures per ``policy``; raise translated errors.

    ``translate`` maps a raw backend exception to a shardlake error; ``describe`` names the
    operation and URL for the final error message.
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified below
            if not is_transient(exc):
                raise translate(exc) from exc
            if attempt >= policy.attempts:
                raise RetriesExhaustedError(
                    f"{describe()} failed after {attempt} attempt(s) (transient errors); "
                    f"last: {type(exc).__name__}: {redact(str(exc))}"
                ) from exc
            pause = policy.delay(attempt)
            log.info(
                "%s: transient %s (attempt %d of %d), retrying in %.2fs",
                describe(),
                type(exc).__name__,
                attempt,
                policy.attempts,
                pause,
            )
            sleep(pause)
