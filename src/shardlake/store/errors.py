"""Translation of backend exceptions (OSError, botocore, gcsfs HTTP errors, azure-core errors) to
shardlake errors.

Messages name the operation and the (redacted) URL; raw exception text is redacted too, and
storage options are never part of a message.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from ..errors import (
    AlreadyExistsError,
    BucketNotFoundError,
    CredentialsMissingError,
    CredentialsRejectedError,
    EndpointError,
    KeyNotFoundError,
    ShardlakeError,
    StoreError,
    StorePermissionError,
)
from .backends.base import EndpointMismatch, is_already_exists
from .backends.registry import backend_class
from .classify import (
    CREDENTIAL_REJECTED_CODES,
    azure_error_code,
    causes,
    chain,
    s3_error_code,
    status_of,
)
from .redact import redact

__all__ = ["translate_error"]

_NO_CREDENTIALS = (
    "unable to locate credentials",
    "nocredentialserror",
    "partial credentials",
    "could not find default credentials",
    "defaultcredentialserror",
    # adlfs without connection string, account name or credential
    "must provide either a connection_string or account_name",
    # azure-identity: no source of a token (environment, managed identity, az login...)
    "credentialunavailableerror",
    "defaultazurecredential failed to retrieve a token",
)
_BAD_CREDENTIALS = ("invalidaccesskeyid", "signaturedoesnotmatch", "expiredtoken", "invalidtoken")
# Azure storage error codes: the key, SAS or token itself was refused (not merely lacking
# permission); Azurite answers a bad shared key with AuthorizationFailure "Server failed to
# authenticate the request".
_AZURE_REJECTED_CODES = frozenset({"AuthenticationFailed", "InvalidAuthenticationInfo"})


def _is_missing_bucket(exc: BaseException, text: str) -> bool:
    lowered = text.lower()
    return (
        "nosuchbucket" in lowered
        or "bucket does not exist" in lowered
        or ("bucket" in lowered and "not found" in lowered)
        or azure_error_code(exc) == "ContainerNotFound"
    )


def _chain_text(exc: BaseException) -> str:
    return " ".join(f"{type(c).__name__} {c}" for c in causes(exc)).lower()


def _azure_rejected(exc: BaseException, lowered: str) -> bool:
    code = azure_error_code(exc)
    if code in _AZURE_REJECTED_CODES:
        return True
    if type(exc).__name__ == "ClientAuthenticationError" and code is None:
        return True  # raised by a token credential: a refused secret or certificate
    return code == "AuthorizationFailure" and "failed to authenticate" in lowered


def _tls_problem(exc: BaseException) -> str | None:
    """What to fix when a TLS handshake failed: https:// to a plain HTTP server, or a
    certificate the client does not trust."""
    for cause in chain(exc):
        if not isinstance(cause, ssl.SSLError):
            continue
        reason = str(getattr(cause, "reason", "") or cause).upper()
        if "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER_FAILURE" in reason:
            return (
                "the endpoint does not speak TLS - if it is a plain HTTP server, write its "
                "endpoint URL with http://, not https://"
            )
        if isinstance(cause, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY" in reason:
            return (
                "the endpoint's TLS certificate is not trusted - give its CA bundle "
                "(AWS_CA_BUNDLE / client_kwargs verify=...) or fix the endpoint URL's host"
            )
    return None


def _local_file_above(url: str) -> str | None:
    """The nearest existing ancestor of a local ``url`` when it is a file, else None."""
    path = url.removeprefix("file://")
    if "://" in path:
        return None
    for parent in Path(path).parents:
        if parent.exists():
            return str(parent) if parent.is_file() else None
    return None


def translate_error(
    exc: BaseException,
    op: str,
    url: str,
    bucket: str | None = None,
    protocol: str | None = None,
) -> BaseException:
    """Map ``exc`` raised by ``op`` on ``url`` to the matching shardlake error."""
    if isinstance(exc, ShardlakeError):
        return exc
    where = f"{op} {redact(url)}"
    text = f"{type(exc).__name__} {exc}"
    lowered = text.lower()
    status = status_of(exc)
    code = s3_error_code(exc)
    backend = backend_class(protocol or "")
    if any(marker in lowered for marker in _NO_CREDENTIALS):
        return CredentialsMissingError(f"{where}: credentials missing - {backend.credential_hint}")
    if (
        code in CREDENTIAL_REJECTED_CODES
        or status == 401
        or any(marker in lowered for marker in _BAD_CREDENTIALS)
        or _azure_rejected(exc, _chain_text(exc))
    ):
        return CredentialsRejectedError(
            f"{where}: credentials rejected - the store does not accept this key id or secret"
        )
    if isinstance(exc, EndpointMismatch):
        return EndpointError(f"{where}: {exc}")
    tls = _tls_problem(exc)
    if tls is not None:
        return EndpointError(f"{where}: {tls}")
    if is_already_exists(exc):
        return AlreadyExistsError(f"{where}: already exists")
    if bucket is not None and (code == "NoSuchBucket" or _is_missing_bucket(exc, text)):
        noun = backend.bucket_noun or "bucket"
        scheme = url.split("://", 1)[0]
        return BucketNotFoundError(
            f"{where}: {noun} {bucket!r} does not exist - create it (shardlake.check_store("
            "url, create_bucket=True), or the cloud's console or CLI) or fix the store URL",
            hint=f"to create it: shardlake check-store {scheme}://{bucket} --create-bucket",
        )
    if isinstance(exc, FileNotFoundError) or status == 404 or "nosuchkey" in lowered:
        return KeyNotFoundError(f"{where}: no such key")
    if isinstance(exc, PermissionError) or status in (401, 403):
        return StorePermissionError(
            f"{where}: access denied to {redact(url)} - the credentials lack permission"
        )
    if isinstance(exc, NotADirectoryError):
        blocker = _local_file_above(url) if protocol is None or backend.local_paths else None
        if blocker is not None:  # e.g. a root or export destination given as an existing file
            return StoreError(f"{where}: {blocker} is a file, not a folder")
        return StoreError(f"{where}: a parent of this key is an object, not a directory")
    if isinstance(exc, (ValueError, TypeError)):
        return exc
    return StoreError(f"{where}: {type(exc).__name__}: {redact(str(exc))}")
