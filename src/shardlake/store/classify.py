"""Which storage failures are worth retrying, and which may have taken effect anyway.

Every failure of one request is one of three kinds:

* ``PERMANENT`` - retrying cannot help (no such key, access denied, bad request, a refused
  precondition);
* ``TRANSIENT`` - the request did not take effect and may succeed when sent again (throttling,
  503, a connection that was never made, a body corrupted in transit, ``ESTALE``);
* ``AMBIGUOUS`` - retrying is fine, but the request may already have taken effect (the reply was
  lost: a reset or timeout after sending, HTTP 500).  A read treats this like ``TRANSIENT``; a
  conditional write must read back what is there before it reports a verdict.

The classification looks at the real exception objects of s3fs / aiobotocore / botocore,
gcsfs / aiohttp / requests, adlfs / azure-core and local I/O, and walks ``__cause__`` where a
library wraps one.
"""

from __future__ import annotations

import enum
import errno
import ssl
from collections.abc import Iterator

from ..errors import ShardlakeError, TransientStoreError


class Verdict(enum.Enum):
    PERMANENT = "permanent"
    TRANSIENT = "transient"
    AMBIGUOUS = "ambiguous"


# S3 error codes meaning the credentials themselves are wrong (not merely lacking permission).
CREDENTIAL_REJECTED_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
    }
)

# HTTP statuses: the server refused without acting vs. it may have acted before failing.
_REFUSED_STATUS = {408, 429, 502, 503}
_MAYBE_ACTED_STATUS = {500, 504}

# Errnos of local/NFS I/O and of s3fs' translation of S3 error codes (EBUSY: 503 SlowDown,
# 409 OperationAborted; EREMOTEIO: 500 InternalError).
_REFUSED_ERRNOS = {errno.ESTALE, errno.ECONNREFUSED, errno.EAGAIN, errno.EBUSY}
_MAYBE_ACTED_ERRNOS = {
    errno.EIO,
    getattr(errno, "EREMOTEIO", errno.EIO),
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.EPIPE,
    errno.ETIMEDOUT,
}

# Exception class names of the HTTP stacks underneath s3fs and gcsfs (matched by name so this
# module imports none of them): never connected, or the body failed its checksum in transit.
_REFUSED_TYPES = {
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ClientConnectorError",
    "ClientConnectorDNSError",
    "FlexibleChecksumError",
    "ChecksumError",  # gcsfs: md5/crc32c of a body
    "ProxyError",  # gcsfs raises HTTP 502 as requests' ProxyError
    # azure-core: the request was never sent (connect failure or connect timeout)
    "ServiceRequestError",
    "ServiceRequestTimeoutError",
}
# Sent, then lost: the server may have acted on it.
_MAYBE_ACTED_TYPES = {
    "ReadTimeoutError",
    "ReadTimeout",
    "ServerDisconnectedError",
    "ServerTimeoutError",
    "ClientPayloadError",
    "ClientOSError",
    "IncompleteRead",
    "IncompleteReadError",
    "ResponseParserError",
    "ChunkedEncodingError",
    "ContentLengthError",
    "TransferEncodingError",
    "RemoteDisconnected",
    "ProtocolError",
    "HTTPClientError",
    "FSTimeoutError",
    # azure-core: sent, then the reply failed or timed out (ServiceResponseTimeoutError is one)
    "ServiceResponseError",
}
# S3 error codes of a request the server refused without acting, whatever their status (409
# OperationAborted / ConditionalRequestConflict: a competing operation is in flight, retry;
# 400 RequestTimeout: the body did not arrive in time; 400 BadDigest and the checksum
# mismatches: the body was damaged in transit and nothing was stored, send it again).
_REFUSED_S3_CODES = {
    "BadDigest",
    "XAmzContentChecksumMismatch",
    "XAmzContentSHA256Mismatch",
    "SlowDown",
    "ServiceUnavailable",
    "OperationAborted",
    "ConditionalRequestConflict",
    "RequestTimeout",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
}
# Azure storage error codes of a body that failed its Content-MD5 (or CRC-64) on arrival:
# nothing was stored, send it again.
_REFUSED_AZURE_CODES = {"Md5Mismatch", "Crc64Mismatch"}
_REFUSED_MARKERS = (
    "slowdown",
    "slow down",
    "reduce your request rate",
    "throttl",
    "toomanyrequests",
    "too many requests",
    "service unavailable",
    "serviceunavailable",
    "requesttimeout",
)
_MAYBE_ACTED_MARKERS = (
    "internalerror",
    "internal error",
    "bad gateway",
    "gateway timeout",
    "connection reset",
    "connection aborted",
    "server disconnected",
    "timed out",
)
_PERMANENT_TYPES = (
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    ValueError,
    TypeError,
    KeyError,
    NotImplementedError,
)


def http_status(exc: BaseException) -> int | None:
    """The HTTP status an exception carries (botocore ``response``, gcsfs/aiohttp ``code``)."""
    for attr in ("status", "status_code", "code"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        meta = response.get("ResponseMetadata")
        status = meta.get("HTTPStatusCode") if isinstance(meta, dict) else None
        if isinstance(status, int):
            return status
    return None


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from (s3fs raises OSError from ClientError)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__


def status_of(exc: BaseException) -> int | None:
    """The first HTTP status along ``exc`` and what it was raised from."""
    for cause in causes(exc):
        status = http_status(cause)
        if status is not None:
            return status
    return None


def chain(exc: BaseException, *, honour_suppress: bool = False) -> Iterator[BaseException]:
    """``exc`` and what it was raised from or while handling (``__cause__``, else
    ``__context__``), each once; with ``honour_suppress``, not a context that ``raise ... from
    None`` hid."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        hidden = honour_suppress and current.__suppress_context__
        current = current.__cause__ or (None if hidden else current.__context__)


def classify(exc: BaseException) -> Verdict:
    """Whether ``exc`` is permanent, transient, or transient with a possibly applied request."""
    if isinstance(exc, TransientStoreError):
        return Verdict.TRANSIENT
    if isinstance(exc, ShardlakeError):
        return Verdict.PERMANENT
    chain = list(causes(exc))
    if any(_tls_misconfigured(c) for c in chain):  # before aiohttp's ClientConnectorError
        return Verdict.PERMANENT
    for cause in chain:  # the HTTP stacks' own exception types are the most specific
        verdict = _by_type_name(cause)
        if verdict is not None:
            return verdict
    if s3_error_code(exc) in _REFUSED_S3_CODES or azure_error_code(exc) in _REFUSED_AZURE_CODES:
        return Verdict.TRANSIENT
    for cause in chain:  # then an HTTP status (s3fs raises OSError(EIO) from a 404 page)
        status = http_status(cause)
        if status is not None and status >= 400:
            return _by_status(status)
    for cause in chain:
        verdict = _classify_one(cause)
        if verdict is not None:
            return verdict
    return _by_text(exc)


def _tls_misconfigured(exc: BaseException) -> bool:
    """A TLS handshake that can never succeed: https:// to a plain HTTP server (aiohttp wraps
    it in a connector error that would otherwise be retried until the deadline)."""
    if not isinstance(exc, ssl.SSLError):
        return False
    reason = str(getattr(exc, "reason", "") or exc).upper()
    return "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER_FAILURE" in reason


def _by_type_name(exc: BaseException) -> Verdict | None:
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & _REFUSED_TYPES:
        return Verdict.TRANSIENT
    if names & _MAYBE_ACTED_TYPES:
        return Verdict.AMBIGUOUS
    return None


def _by_status(status: int) -> Verdict:
    if status in _REFUSED_STATUS:
        return Verdict.TRANSIENT
    if status in _MAYBE_ACTED_STATUS:
        return Verdict.AMBIGUOUS
    return Verdict.PERMANENT


def s3_error_code(exc: BaseException) -> str | None:
    """The S3 error code (``NoSuchBucket``, ``InvalidAccessKeyId``...) behind ``exc``, if any."""
    for cause in causes(exc):
        response = getattr(cause, "response", None)
        if isinstance(response, dict) and isinstance(response.get("Error"), dict):
            code = response["Error"].get("Code")
            return str(code) if code is not None else None
    return None


def azure_error_code(exc: BaseException) -> str | None:
    """The Azure storage error code (``BlobNotFound``, ``ContainerNotFound``,
    ``AuthenticationFailed``...) behind ``exc``: azure-core's ``error_code``, also where adlfs
    raised a builtin error while handling it (``__context__``)."""
    for current in chain(exc, honour_suppress=True):
        code = getattr(current, "error_code", None)
        if code is not None:
            return str(getattr(code, "value", code))
    return None


def _classify_one(exc: BaseException) -> Verdict | None:
    if isinstance(exc, ConnectionRefusedError):
        return Verdict.TRANSIENT
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return Verdict.AMBIGUOUS
    if isinstance(exc, _PERMANENT_TYPES):
        return Verdict.PERMANENT
    if isinstance(exc, OSError) and exc.errno is not None:
        if exc.errno in _REFUSED_ERRNOS:
            return Verdict.TRANSIENT
        if exc.errno in _MAYBE_ACTED_ERRNOS:
            return Verdict.AMBIGUOUS
    return None


def _by_text(exc: BaseException) -> Verdict:
    text = f"{type(exc).__name__} {exc}".lower()
    if any(marker in text for marker in _REFUSED_MARKERS):
        return Verdict.TRANSIENT
    if any(marker in text for marker in _MAYBE_ACTED_MARKERS):
        return Verdict.AMBIGUOUS
    return Verdict.PERMANENT


def is_transient(exc: BaseException) -> bool:
    """True for failures worth retrying (transient or ambiguous)."""
    return classify(exc) is not Verdict.PERMANENT


__all__ = [
    "CREDENTIAL_REJECTED_CODES",
    "Verdict",
    "azure_error_code",
    "causes",
    "chain",
    "classify",
    "http_status",
    "is_transient",
    "s3_error_code",
    "status_of",
]
