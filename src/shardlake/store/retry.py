"""The one retry policy of every storage request: a deadline, per-attempt timeouts, full jitter.

Retries live here and nowhere else: the backends turn their libraries' own retries off (botocore,
s3fs, gcsfs) and hand them :attr:`RetryPolicy.attempt_timeout` as their request timeout, so one
operation costs at most :attr:`RetryPolicy.deadline` seconds however the network misbehaves.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..errors import EndpointError, RetriesExhaustedError, UsageError
from ..progress.bar import plural
from .classify import Verdict, chain, classify
from .redact import redact

T = TypeVar("T")

log = logging.getLogger("shardlake.store")

DEFAULT_DEADLINE = 120.0
DEFAULT_ATTEMPT_TIMEOUT = 30.0
# Extra reads of a checksum mismatch before a verdict (3 reads in all).
DEFAULT_INTEGRITY_REREADS = 2

_ENV = {
    "attempts": "SHARDLAKE_RETRY_ATTEMPTS",
    "base_delay": "SHARDLAKE_RETRY_BASE_DELAY",
    "max_delay": "SHARDLAKE_RETRY_MAX_DELAY",
    "deadline": "SHARDLAKE_RETRY_DEADLINE",
    "attempt_timeout": "SHARDLAKE_RETRY_ATTEMPT_TIMEOUT",
    "integrity_rereads": "SHARDLAKE_RETRY_INTEGRITY_REREADS",
}


@dataclass(frozen=True)
class RetryPolicy:
    """How long and how often one storage operation may be retried.

    Parameters
    ----------
    attempts
        Most tries, the first included (``None``: as many as the deadline allows).
    base_delay, max_delay
        The pause before retry ``n`` (1-based) is uniform in
        ``[0, min(max_delay, base_delay * 2**(n-1))]`` ("full jitter").
    deadline
        Seconds one operation may take, all attempts and pauses together; no retry starts
        after it and no pause runs past it.
    attempt_timeout
        Seconds one request may wait to connect or for the next bytes of its reply (handed to
        botocore / gcsfs as their timeouts).
    integrity_rereads
        Extra reads of bytes that arrived but fail their checksum or digest (a flipped byte in
        transit), before a verdict: every payload, metadata and probe read-back uses it.
    """

    attempts: int | None = None
    base_delay: float = 0.1
    max_delay: float = 5.0
    deadline: float = DEFAULT_DEADLINE
    attempt_timeout: float = DEFAULT_ATTEMPT_TIMEOUT
    integrity_rereads: int = DEFAULT_INTEGRITY_REREADS

    def __post_init__(self) -> None:
        if self.integrity_rereads < 0:
            raise UsageError("RetryPolicy.integrity_rereads must be >= 0")
        if self.attempts is not None and self.attempts < 1:
            raise UsageError("RetryPolicy.attempts must be >= 1")
        if self.base_delay < 0 or self.max_delay < 0:
            raise UsageError("RetryPolicy delays must be >= 0")
        if self.deadline <= 0 or self.attempt_timeout <= 0:
            raise UsageError("RetryPolicy.deadline and attempt_timeout must be > 0 seconds")

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """The default policy, overridable by ``SHARDLAKE_RETRY_DEADLINE``,
        ``SHARDLAKE_RETRY_ATTEMPT_TIMEOUT``, ``SHARDLAKE_RETRY_ATTEMPTS``,
        ``SHARDLAKE_RETRY_BASE_DELAY``, ``SHARDLAKE_RETRY_MAX_DELAY`` and
        ``SHARDLAKE_RETRY_INTEGRITY_REREADS``."""
        found = {field: os.environ[name] for field, name in _ENV.items() if os.environ.get(name)}
        try:
            values: dict[str, Any] = {
                field: int(text) if field in ("attempts", "integrity_rereads") else float(text)
                for field, text in found.items()
            }
        except ValueError as exc:
            raise UsageError(f"invalid SHARDLAKE_RETRY_* setting: {exc}") from None
        return cls(**values)

    @property
    def request_timeout(self) -> float:
        """The timeout handed to the backend's library: ``attempt_timeout``, but never longer
        than the deadline, so one stalled attempt cannot outlast the whole operation's budget."""
        return min(self.attempt_timeout, self.deadline)

    def delay(self, retry_number: int) -> float:
        cap = min(self.max_delay, self.base_delay * (2 ** (retry_number - 1)))
        return random.uniform(0.0, cap)


NO_RETRY = RetryPolicy(attempts=1)


# A wrong endpoint URL fails fast: while an endpoint has not answered this job, a host DNS does
# not know fails at once, and refusals (nothing listens) or failing name lookups that last
# FIRST_CONTACT_S seconds end the operation: retrying for the whole deadline cannot help.
# Once the endpoint answered - in this process, or in the process that pickled the store over
# (a DataLoader or pack worker) - the same failures are an outage (a server restarting) and keep
# the full retry policy.
FIRST_CONTACT_S = 5.0
_contact_lock = threading.Lock()
_answered: set[str] = set()
_first_failure: dict[str, float] = {}


def mark_answered(endpoint: str) -> None:
    """A request to ``endpoint`` (:func:`endpoint.endpoint_id`) got an answer: from now on its
    refusals are mid-run outages, retried in full (in this process and its workers)."""
    if endpoint not in _answered:
        with _contact_lock:
            _answered.add(endpoint)


def has_answered(endpoint: str | None) -> bool:
    """Whether ``endpoint`` answered this job (None: whether any endpoint did)."""
    return endpoint in _answered if endpoint is not None else bool(_answered)


def _endpoint_in(exc: BaseException) -> str | None:
    """``scheme://host:port`` of the request that failed, from the exceptions' attributes."""
    for current in chain(exc):
        url = getattr(current, "kwargs", {}).get("endpoint_url")
        if isinstance(url, str) and "://" in url:
            scheme, rest = url.split("://", 1)
            return redact(f"{scheme}://{rest.split('/', 1)[0]}")
    for current in chain(exc):
        host, port = getattr(current, "host", None), getattr(current, "port", None)
        if isinstance(host, str) and isinstance(port, int):
            return f"http{'s' if port == 443 else ''}://{host}:{port}"
    return None


def refused_endpoint(exc: BaseException) -> str | None:
    """``http://HOST:PORT`` when ``exc`` is a refused connection (nothing listens), else None."""
    refused = any(
        isinstance(c, ConnectionRefusedError) or getattr(c, "errno", None) == errno.ECONNREFUSED
        for c in chain(exc)
    )
    return _endpoint_in(exc) if refused else None


# getaddrinfo's "no such name" answers (EAI_NODATA: the name exists without addresses).
_NO_SUCH_HOST = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


def unresolved_host(exc: BaseException) -> tuple[str, bool] | None:
    """``(host, definite)`` when ``exc`` is a failed name lookup (``definite``: DNS answered
    that the name does not exist, rather than failing to answer), else None."""
    lookup = next((c for c in chain(exc) if isinstance(c, socket.gaierror)), None)
    if lookup is None:
        return None
    hosts = (getattr(c, "host", None) for c in chain(exc))
    host = next((h for h in hosts if isinstance(h, str)), None)
    if host is None:
        endpoint = _endpoint_in(exc)
        host = urlsplit(endpoint).hostname if endpoint else None
    return (host or "?", lookup.errno in _NO_SUCH_HOST)


def _check_first_contact(
    exc: BaseException, pause: float, clock: Callable[[], float], endpoint: str | None
) -> None:
    """Raise :class:`EndpointError` for a failure that says the endpoint URL is wrong, unless
    ``endpoint`` answered this job before (see :data:`FIRST_CONTACT_S`)."""
    if has_answered(endpoint):
        return
    where = _endpoint_in(exc)
    shown = f" {where}" if where else ""
    lookup = unresolved_host(exc)
    if lookup is not None:
        host, definite = lookup
        message = f"cannot resolve host {host!r} in the endpoint URL{shown} - check the host name"
        if definite:
            raise EndpointError(message) from exc
        key = f"dns:{host}"
    else:
        refused = refused_endpoint(exc)
        if refused is None:
            return
        message = f"nothing listens at {refused} - check the endpoint URL"
        key = refused
    now = clock()
    with _contact_lock:
        first = _first_failure.setdefault(key, now)
    if now - first + pause >= FIRST_CONTACT_S:
        raise EndpointError(message) from exc


class RetryLoop:
    """The attempts of one operation: call :meth:`backoff` after each retryable failure.

    ``endpoint``: the server the requests go to (:func:`endpoint.endpoint_id`); its failures
    fail fast until it has answered (None: until any endpoint has)."""

    def __init__(
        self,
        policy: RetryPolicy,
        describe: Callable[[], str],
        *,
        endpoint: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.endpoint = endpoint
        self.describe = describe
        self.attempts = 0
        self._sleep = sleep
        self._clock = clock
        self._started = clock()

    @property
    def elapsed(self) -> float:
        return self._clock() - self._started

    def backoff(self, exc: BaseException) -> None:
        """Pause before the next attempt, or raise :class:`RetriesExhaustedError` (from ``exc``)
        when the attempts or the deadline are spent."""
        self.attempts += 1
        policy = self.policy
        pause = policy.delay(self.attempts)
        left = policy.deadline - self.elapsed
        _check_first_contact(exc, pause, self._clock, self.endpoint)
        if (policy.attempts is not None and self.attempts >= policy.attempts) or pause >= left:
            raise RetriesExhaustedError(
                f"{self.describe()} failed after {plural(self.attempts, 'attempt')} in "
                f"{self.elapsed:.1f}s (transient errors; deadline {policy.deadline:g}s); "
                f"last: {type(exc).__name__}: {redact(str(exc))}"
            ) from exc
        log.info(
            "%s: transient %s (attempt %d), retrying in %.2fs",
            self.describe(),
            type(exc).__name__,
            self.attempts,
            pause,
        )
        self._sleep(pause)


def call_with_retry(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    describe: Callable[[], str],
    translate: Callable[[BaseException], BaseException],
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``fn``; retry transient and ambiguous failures within ``policy``; raise permanent
    ones translated (``translate`` maps a backend exception to a shardlake error)."""
    loop = RetryLoop(policy, describe, sleep=sleep)
    while True:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified below
            if classify(exc) is Verdict.PERMANENT:
                raise translate(exc) from exc
            loop.backoff(exc)


__all__ = [
    "DEFAULT_ATTEMPT_TIMEOUT",
    "DEFAULT_DEADLINE",
    "DEFAULT_INTEGRITY_REREADS",
    "FIRST_CONTACT_S",
    "NO_RETRY",
    "RetryLoop",
    "RetryPolicy",
    "call_with_retry",
    "has_answered",
    "mark_answered",
    "refused_endpoint",
    "unresolved_host",
]
