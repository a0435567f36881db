"""Azure Blob Storage through adlfs (``az://`` / ``abfs://`` / ``abfss://``): conditional Put Blob,
block-list streaming, one retry layer."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import fsspec

from ..classify import azure_error_code, chain
from ..retry import RetryPolicy
from .base import BucketBackend

if TYPE_CHECKING:
    from ..endpoint import Endpoint

__all__ = [
    "AzureBackend",
    "refused_create",
]

# Storage error codes of a 409 on a create that do not mean "the blob exists".
_NOT_EXISTS_CONFLICTS = frozenset(
    {
        "ContainerBeingDeleted",
        "ContainerDisabled",
        "BlobArchived",
        "BlobBeingRehydrated",
        "OperationNotAllowedOnIncrementalCopyBlob",
        "PublicAccessNotPermitted",
    }
)
# One GET per whole-object or ranged read: the SDK would otherwise split anything above
# max_single_get_size (32 MiB) into a first GET and further ranged GETs.
_ONE_GET = 2**40


class AzureBackend(BucketBackend):
    """Azure Blob Storage (adlfs): Put Blob replaces atomically; create sends
    ``If-None-Match: *`` (``upload_blob(overwrite=False)``), refused with 409 BlobAlreadyExists.

    Streaming writes stage blocks and commit the block list at close: nothing is visible
    before, and a writer killed midway leaves only uncommitted blocks, which Azure drops on its
    own within a week and which no listing or read ever sees (so :meth:`leftovers` finds none).
    Reads are one GET each (whole object or one range), with no HEAD before them.

    Credentials are adlfs's: ``connection_string`` / ``AZURE_STORAGE_CONNECTION_STRING``,
    ``account_name`` with ``account_key`` or ``sas_token`` (or the ``AZURE_STORAGE_*`` variables),
    a ``credential`` object, a service principal (``client_id``, ``client_secret``,
    ``tenant_id``), and otherwise ``DefaultAzureCredential`` (environment, managed identity,
    ``az login``).  ``anon=True`` reads a public container.
    """

    protocols = ("az", "abfs", "abfss")
    extra = "azure"
    bucket_noun = "container"
    credential_hint = (
        "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with "
        "AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN, or sign in for "
        "DefaultAzureCredential (az login, managed identity, AZURE_CLIENT_ID...), or pass "
        "connection_string / account_name with account_key, sas_token or credential in "
        "storage_options"
    )
    fsspec_client = "adlfs"
    whole_read_options: Mapping[str, Any] = MappingProxyType({"max_concurrency": 1})

    @classmethod
    def obstore_config(
        cls, options: dict[str, Any], endpoint: Endpoint | None
    ) -> dict[str, Any] | str:
        # The endpoint is the account's (connection string, account_host), not endpoint_url.
        return _obstore_config(options)

    @classmethod
    def obstore_store(cls, bucket: str, config: dict[str, Any], common: dict[str, Any]) -> Any:
        from obstore.store import AzureStore

        return AzureStore(bucket, **common, **config)

    @classmethod
    def make_filesystem(
        cls, protocol: str, storage_options: dict[str, Any], policy: RetryPolicy
    ) -> fsspec.AbstractFileSystem:
        options = dict(storage_options)
        options.setdefault("connection_timeout", policy.request_timeout)
        options.setdefault("read_timeout", policy.request_timeout)
        try:
            fs = fsspec.filesystem(protocol, **options)
        except ValueError as exc:
            # adlfs connects in its constructor (which open_store calls): nothing to sign with.
            if "must provide either a connection_string" not in str(exc).lower():
                raise
            from ...errors import CredentialsMissingError

            raise CredentialsMissingError(
                f"open {protocol}://: credentials missing - {cls.credential_hint}"
            ) from None
        _single_try(fs)
        _send_content_md5(fs)
        return fs

    def _commit_writer(self, handle: Any, path: str) -> None:
        written = int(getattr(handle, "loc", -1))
        try:
            handle.close()
        except Exception as exc:
            # Two writers of one key stage blocks under one blob; the first commit drops the
            # other's uncommitted blocks (InvalidBlockList). Streamed objects (shards) sit at
            # content-addressed keys, so a complete blob of our size there holds our bytes.
            if not _lost_commit_race(exc) or self._size_now(path) != written:
                raise

    def _size_now(self, path: str) -> int | None:
        self.fs.invalidate_cache(path)
        try:
            return int(self.fs.info(path)["size"])
        except FileNotFoundError:
            return None

    def _create(self, path: str, data: bytes) -> None:
        try:
            self.fs.pipe_file(path, data, mode="create", max_concurrency=1)
        except Exception as exc:
            if refused_create(exc):
                raise FileExistsError(f"{path}: already exists") from exc
            if isinstance(exc, FileExistsError):  # adlfs' mapping of any ResourceExistsError
                code = azure_error_code(exc)
                raise OSError(f"{path}: create refused ({code}), not by an existing blob") from exc
            raise


def _connection_string(text: str) -> dict[str, str]:
    """``Key=Value;...`` pairs of an Azure storage connection string."""
    pairs = (part.split("=", 1) for part in text.split(";") if "=" in part)
    return {key.strip(): value.strip() for key, value in pairs}


def _obstore_config(options: dict[str, Any]) -> dict[str, Any] | str:
    """obstore ``AzureStore`` keywords from adlfs options: a connection string (given or in
    ``AZURE_STORAGE_CONNECTION_STRING``), an account with a key or SAS token, a service
    principal, or anonymous access. Other credentials (a credential object, the default
    credential chain) stay with adlfs."""
    if options.get("credential") is not None:
        return "a credential object is given"
    text = options.get("connection_string")
    if not text and not options.get("account_name"):
        text = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    parts = _connection_string(text) if text else {}
    name = parts.get("AccountName") or options.get("account_name")
    config: dict[str, Any] = {}
    if parts.get("UseDevelopmentStorage", "").lower() == "true":
        config["use_emulator"] = True
    if name:
        config["account_name"] = name
    key = parts.get("AccountKey") or options.get("account_key")
    sas = parts.get("SharedAccessSignature") or options.get("sas_token")
    principal = [options.get(k) for k in ("client_id", "client_secret", "tenant_id")]
    if key:
        config["account_key"] = key
    elif sas:
        config["sas_key"] = str(sas).lstrip("?")
    elif all(principal):
        config.update(zip(("client_id", "client_secret", "tenant_id"), principal, strict=True))
    elif options.get("anon"):
        config["skip_signature"] = True
    elif not config.get("use_emulator"):
        return "no key, SAS token or service principal (adlfs uses the default credential chain)"
    endpoint = parts.get("BlobEndpoint")
    if not endpoint and options.get("account_host"):
        endpoint = f"https://{options['account_host']}"
    if not endpoint and name and parts.get("EndpointSuffix"):
        scheme = parts.get("DefaultEndpointsProtocol", "https")
        endpoint = f"{scheme}://{name}.blob.{parts['EndpointSuffix']}"
    if endpoint:
        config["endpoint"] = endpoint.rstrip("/")
    if not name and not config.get("use_emulator"):
        return "no storage account named"
    return config


def _single_try(fs: Any) -> None:
    """One try per request (azure-core's storage policy retries 10 times, with backoff, outside
    any deadline; the store's policy retries instead), and one GET per read."""
    client = getattr(fs, "service_client", None)
    config = getattr(client, "_config", None)
    retry = getattr(config, "retry_policy", None)
    if retry is not None:
        # The pipeline holds this very policy object (shared by every blob client made from it).
        for attr in ("total_retries", "connect_retries", "read_retries", "status_retries"):
            if hasattr(retry, attr):
                setattr(retry, attr, 0)
    if config is not None and hasattr(config, "max_single_get_size"):
        config.max_single_get_size = _ONE_GET
        config.max_chunk_get_size = _ONE_GET


# Sends of one Put Block whose body arrived damaged (the store's policy retries whole requests,
# but a streamed write's blocks are requests adlfs makes on its own).
_BLOCK_SENDS = 3


def _send_content_md5(fs: Any) -> None:
    """Every PUT with a body (Put Blob, Put Block, Put Block List) carries the body's
    Content-MD5, which the service checks before it stores anything (400 Md5Mismatch: the
    store retries it as transient; a streamed write's Put Block is sent again here, up to
    ``_BLOCK_SENDS`` times). The SDK sends one only when a call asks (``validate_content``),
    and adlfs' streaming writes never ask."""
    client = getattr(fs, "service_client", None)
    pipeline = getattr(client, "_pipeline", None)
    for policy in getattr(pipeline, "_impl_policies", ()):
        # The blob clients adlfs makes share these policy objects.
        if type(policy).__name__ != "AsyncContentValidationPolicy":
            continue
        if getattr(policy, "_shardlake_md5", False):
            return
        send = policy.send

        async def with_md5(request: Any, send: Any = send) -> Any:
            http = request.http_request
            data = http.data
            if (
                http.method == "PUT"
                and isinstance(data, (bytes, bytearray, memoryview))
                and len(data)
                and "Content-MD5" not in http.headers
            ):
                digest = hashlib.md5(data, usedforsecurity=False).digest()
                http.headers["Content-MD5"] = base64.b64encode(digest).decode("ascii")
            block = http.method == "PUT" and "comp=block&" in f"{http.url}&"
            for _ in range(_BLOCK_SENDS - 1 if block else 0):
                response = await send(request)
                reply = response.http_response
                if reply.status_code != 400 or reply.headers.get("x-ms-error-code") != (
                    "Md5Mismatch"
                ):
                    return response
                with contextlib.suppress(Exception):
                    await reply.load_body()  # let the connection go back to the pool
            return await send(request)

        policy.send = with_md5
        policy._shardlake_md5 = True
        return


def _lost_commit_race(exc: BaseException) -> bool:
    """Whether a block-list commit failed because another writer committed the blob first."""
    return any(
        azure_error_code(cause) == "InvalidBlockList" or "InvalidBlockList" in str(cause)
        for cause in chain(exc, honour_suppress=True)
    )


def refused_create(exc: BaseException) -> bool:
    """Whether a failed ``If-None-Match: *`` Put Blob means "the blob exists": 409 (the
    service's BlobAlreadyExists) or 412 (ConditionNotMet), read from the azure-core error."""
    # adlfs raises FileExistsError inside its `except ResourceExistsError` block, without `from`
    for cause in chain(exc, honour_suppress=True):
        status = getattr(cause, "status_code", None)
        if status == 412:
            return True
        if status == 409:
            return azure_error_code(cause) not in _NOT_EXISTS_CONFLICTS
    return False
