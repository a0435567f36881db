"""S3 through s3fs (aiobotocore): conditional PUT, multipart streaming, one retry layer."""

from __future__ import annotations

import base64
import concurrent.futures as cf
import functools
import hashlib
import io
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import fsspec

from ..classify import (
    CREDENTIAL_REJECTED_CODES,
    causes,
    http_status,
    is_transient,
    s3_error_code,
)
from ..redact import redact
from ..retry import RetryPolicy, call_with_retry
from .base import BucketBackend, EndpointMismatch, Leftover, nested_options

if TYPE_CHECKING:
    from ..endpoint import Endpoint

__all__ = [
    "S3Backend",
    "refused_create",
]

# A streaming write's part size unless the storage options set ``default_block_size`` (s3fs'
# own default, 50 MiB, holds a whole shard before its first byte leaves); and how many parts
# of one object are sent at once. An object holds at most PARTS_IN_FLIGHT + 1 parts in memory.
PART_SIZE = 16 << 20
PARTS_IN_FLIGHT = 4
# S3 takes at most 10,000 parts: every this many parts the part size grows by one PART_SIZE
# (where the store allows parts of different sizes), so an object may reach ~4 TB.
_PARTS_PER_SIZE = 1000

# 409s a conditional PUT can meet that say "retry", not "it exists" (AWS: a competing
# conditional write is in flight; the retry then meets that write's object, or none).
_RETRY_CONFLICT_CODES = frozenset({"ConditionalRequestConflict", "OperationAborted"})


def refused_create(exc: BaseException) -> bool:
    """Whether a failed ``If-None-Match: *`` PUT means "the key exists", decided by the
    protocol: HTTP 412 (or a 409 other than "conflicting operation, retry") in the botocore
    error s3fs wraps.  s3fs itself maps a 412 to ``FileExistsError`` only when the error body
    carries AWS's ``Condition`` element, which SeaweedFS and other S3-compatible servers omit
    (s3fs then raises ``OSError(EINVAL)``)."""
    if isinstance(exc, FileExistsError):
        return True
    for cause in causes(exc):
        response = getattr(cause, "response", None)
        if not isinstance(response, dict):
            continue
        status = http_status(cause)
        if status == 412:
            return True
        if status == 409:
            return s3_error_code(cause) not in _RETRY_CONFLICT_CODES
        return False
    return False


class S3Backend(BucketBackend):
    """S3 (s3fs): PUT replaces atomically; create sends ``If-None-Match: *``.

    Streaming writes use a multipart upload (parts of :data:`PART_SIZE`, or the storage
    option ``default_block_size``; :data:`PARTS_IN_FLIGHT` sent at once, while the caller
    writes on), completed at close and aborted on error; objects smaller than one part are a
    single PUT.
    A SIGKILLed writer cannot abort: its upload is found by :meth:`leftovers` (gc aborts it).
    """

    protocols = ("s3", "s3a")
    extra = "s3"
    bucket_noun = "bucket"
    credential_hint = (
        "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or pass key/secret "
        "in storage_options"
    )
    fsspec_client = "s3fs"

    @classmethod
    def environment_endpoint(cls) -> tuple[str, str] | None:
        # As botocore: the S3 variable before the general one, both dropped under
        # AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true.
        if os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true":
            return None
        for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
            if os.environ.get(name):
                return os.environ[name], f"environment variable {name}"
        return None

    @classmethod
    def obstore_config(
        cls, options: dict[str, Any], endpoint: Endpoint | None
    ) -> dict[str, Any] | str:
        return _obstore_config(options, endpoint)

    @classmethod
    def obstore_store(cls, bucket: str, config: dict[str, Any], common: dict[str, Any]) -> Any:
        from obstore.store import S3Store

        return S3Store(bucket, **common, **config)

    def make_bucket(self, bucket: str) -> bool:
        # Not s3fs's mkdir: it sends LocationConstraint us-east-1, which S3 refuses, and none
        # for a region set only in the AWS config, which a regional endpoint refuses.
        fs: Any = self.fs
        fs.invalidate_cache()
        if fs.exists(bucket):
            return False
        region = (getattr(fs, "client_kwargs", None) or {}).get("region_name") or getattr(
            getattr(getattr(fs, "s3", None), "meta", None), "region_name", None
        )
        params: dict[str, Any] = {"Bucket": bucket}
        if region and region != "us-east-1":
            params["CreateBucketConfiguration"] = {"LocationConstraint": region}
        fs.call_s3("create_bucket", **params)
        fs.invalidate_cache()
        return True

    # One GET per whole read: s3fs would first HEAD the object to split it into parts.
    whole_read_options: Mapping[str, Any] = MappingProxyType({"max_concurrency": 1})
    _endpoint_checked = False

    def explain(self, path: str, exc: BaseException | None) -> None:
        # A HEAD reply has no body (a 403 cannot say "credentials rejected"), and a web server
        # that is not S3 answers with pages, not S3 errors: one ListObjectsV2 tells them apart.
        if self._endpoint_checked:
            return
        if exc is not None and (isinstance(exc, FileExistsError) or is_transient(exc)):
            return
        bucket = path.split("/", 1)[0]
        try:
            reply = self.fs.call_s3("list_objects_v2", Bucket=bucket, MaxKeys=1)
        except Exception as probe_exc:
            code = s3_error_code(probe_exc)
            if code == "NoSuchBucket":
                raise FileNotFoundError(f"bucket does not exist: {bucket}") from probe_exc
            if code in CREDENTIAL_REJECTED_CODES:
                raise probe_exc
            if not _from_s3(probe_exc):
                raise EndpointMismatch(self._not_s3()) from probe_exc
            return  # the probe cannot tell more than the original error
        if "Name" not in reply and not _s3_headers(reply):
            raise EndpointMismatch(self._not_s3()) from exc
        self._endpoint_checked = True

    def _not_s3(self) -> str:
        endpoint = getattr(self.fs, "endpoint_url", None) or "the S3 endpoint"
        return f"endpoint {redact(str(endpoint))} does not speak the S3 API"

    @classmethod
    def make_filesystem(
        cls, protocol: str, storage_options: dict[str, Any], policy: RetryPolicy
    ) -> fsspec.AbstractFileSystem:
        # One try per request at both botocore and s3fs: the store's policy does the retrying,
        # so attempts never multiply (5 x 5 x 5 before) and its deadline bounds the operation.
        timeouts = {
            "connect_timeout": policy.request_timeout,
            "read_timeout": policy.request_timeout,
        }
        one_try = {"retries": {"total_max_attempts": 1, "mode": "standard"}}
        options = nested_options(storage_options, "config_kwargs", timeouts, one_try)
        fs: fsspec.AbstractFileSystem = _checksumming_class()(**options)
        fs.retries = 1
        fs.shardlake_part_size = int(storage_options.get("default_block_size") or PART_SIZE)
        return fs

    def _create(self, path: str, data: bytes) -> None:
        self._create_or_exists(path, data, refused_create)

    def _open_for_write(self, path: str) -> Any:
        # The parts of a streaming upload are requests s3fs sends from the file object; they go
        # through the store's policy one by one (a part is idempotent per part number), so one
        # 503 does not fail a shard hours into a pack.
        fs: Any = self.fs
        handle = _parallel_file_class()(
            fs,
            path,
            "wb",
            block_size=getattr(fs, "shardlake_part_size", None) or PART_SIZE,
            acl=fs.s3_additional_kwargs.get("ACL", False),
            s3_additional_kwargs=dict(fs.s3_additional_kwargs),
            requester_pays=fs.requester_pays,
        )
        handle.retry_policy = self.policy
        return handle

    def leftovers(self, prefix_path: str) -> list[Leftover]:
        bucket, _, prefix = prefix_path.partition("/")
        out: list[Leftover] = []
        markers: dict[str, str] = {}
        while True:
            page = self.fs.call_s3(
                "list_multipart_uploads", Bucket=bucket, Prefix=prefix, **markers
            )
            for upload in page.get("Uploads", []) or []:
                started = upload.get("Initiated")
                when = started.timestamp() if hasattr(started, "timestamp") else None
                out.append(Leftover(f"{bucket}/{upload['Key']}", when, upload["UploadId"]))
            if not page.get("IsTruncated"):
                return out
            markers = {
                "KeyMarker": page["NextKeyMarker"],
                "UploadIdMarker": page["NextUploadIdMarker"],
            }

    def discard_leftover(self, leftover: Leftover) -> None:
        bucket, _, key = leftover.path.partition("/")
        self.fs.call_s3(
            "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=leftover.upload_id
        )


_PROFILE_CREDENTIALS = (
    "aws_access_key_id",
    "credential_process",
    "sso_session",
    "sso_start_url",
    "role_arn",
    "source_profile",
    "web_identity_token_file",
)


def _aws_profile(options: dict[str, Any]) -> tuple[dict[str, str], str]:
    """The settings of the AWS profile botocore would use (shared credentials file, then
    config file) and where they were read."""
    import configparser

    name = str(options.get("profile") or os.environ.get("AWS_PROFILE") or "default")
    found: dict[str, str] = {}
    where = ""
    files = (
        ("AWS_CONFIG_FILE", "~/.aws/config", name if name == "default" else f"profile {name}"),
        ("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials", name),
    )
    for variable, default, section in files:
        path = os.path.expanduser(os.environ.get(variable) or default)
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        if parser.has_section(section):
            found.update(parser.items(section))
            where = path
    return found, where


def _profile_credentials(
    options: dict[str, Any], profile: dict[str, str], where: str
) -> str | None:
    """Why botocore would sign with credentials obstore cannot read, or None."""
    if options.get("key") or options.get("anon") or options.get("token"):
        return None
    if os.environ.get("AWS_ACCESS_KEY_ID") and not options.get("profile"):
        return None  # botocore takes the environment's key before any profile
    if any(profile.get(setting) for setting in _PROFILE_CREDENTIALS):
        return f"credentials come from an AWS profile ({where}), which obstore cannot read"
    return None


def _obstore_config(options: dict[str, Any], endpoint: Endpoint | None) -> dict[str, Any] | str:
    """obstore ``S3Store`` keywords from s3fs-style storage options and the environment, as
    botocore reads them (unknown options ignored): the endpoint from ``endpoint_url`` /
    ``client_kwargs`` / ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, the region from
    ``client_kwargs`` / ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` / the profile, the key from the
    options or ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` (obstore
    reads those itself, and the instance metadata service). Credentials only a profile holds
    (shared credentials file, SSO, a credential process, an assumed role) keep s3fs."""
    if options.get("session") is not None or options.get("requester_pays"):
        return "a botocore session or requester-pays bucket is given"
    profile, where = _aws_profile(options)
    reason = _profile_credentials(options, profile, where)
    if reason is not None:
        return reason
    client = options.get("client_kwargs") or {}
    config: dict[str, Any] = {}
    if options.get("key"):
        config["access_key_id"] = options["key"]
    if options.get("secret"):
        config["secret_access_key"] = options["secret"]
    if options.get("token"):
        config["session_token"] = options["token"]
    if endpoint is not None:
        config["endpoint"] = endpoint.url
        # obstore lets AWS_ENDPOINT_URL_S3 from the environment win over `endpoint`; botocore
        # (s3fs) lets the given endpoint win. Given as the service-specific key, it wins here too.
        config["aws_endpoint_url_s3"] = endpoint.url
    region = (
        client.get("region_name")
        or options.get("region_name")
        or os.environ.get("AWS_DEFAULT_REGION")
        or os.environ.get("AWS_REGION")
        or profile.get("region")
    )
    if region:
        config["region"] = region
    if options.get("anon"):
        config["skip_signature"] = True
    return config


def _s3_headers(reply: Any) -> bool:
    meta = reply.get("ResponseMetadata") if isinstance(reply, dict) else None
    headers = meta.get("HTTPHeaders") if isinstance(meta, dict) else None
    return isinstance(headers, dict) and any(str(h).startswith("x-amz-") for h in headers)


def _from_s3(exc: BaseException) -> bool:
    """Whether a failed reply came from S3: an S3 error code or S3's own headers."""
    for cause in causes(exc):
        response = getattr(cause, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code") or "")
            return (bool(code) and not code.isdigit()) or _s3_headers(response)
    return True  # not an HTTP reply at all (no credentials, connection): nothing to say


# The requests that carry an object's bytes: each gets the body's Content-MD5, which S3 (and
# every S3-compatible server shardlake is tested on) checks before it stores anything.
_UPLOADS = frozenset({"put_object", "upload_part"})


def _with_content_md5(method: str, akwarglist: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Add ``ContentMD5`` of the body to an upload that does not name one already.

    botocore's own checksums depend on the client's configuration
    (``AWS_REQUEST_CHECKSUM_CALCULATION=when_required`` turns them off, and many S3-compatible
    deployments set it); without one the server stores a body damaged in transit and answers
    200.  A mismatch is refused (400 ``BadDigest``), which the store retries as transient.
    """
    if method not in _UPLOADS or "ContentMD5" in kwargs:
        return
    if any(isinstance(extra, Mapping) and "ContentMD5" in extra for extra in akwarglist):
        return
    body = kwargs.get("Body")
    if isinstance(body, (bytes, bytearray, memoryview)):
        digest = hashlib.md5(body, usedforsecurity=False).digest()
        kwargs["ContentMD5"] = base64.b64encode(digest).decode("ascii")


@functools.cache
def _checksumming_class() -> type[Any]:
    """s3fs' filesystem whose every upload request carries the body's Content-MD5 (see
    :func:`_with_content_md5`): single PUTs, create-if-absent PUTs and multipart parts, from
    ``pipe_file`` and from streaming writes alike (``S3File`` sends through ``call_s3``)."""
    from fsspec.asyn import sync_wrapper
    from s3fs import S3FileSystem

    async def _call_s3(self: Any, method: str, *akwarglist: Any, **kwargs: Any) -> Any:
        _with_content_md5(method, akwarglist, kwargs)
        return await S3FileSystem._call_s3(self, method, *akwarglist, **kwargs)

    made: type[Any] = type(
        "ChecksummingS3FileSystem",
        (S3FileSystem,),
        {"_call_s3": _call_s3, "call_s3": sync_wrapper(_call_s3)},
    )
    # fsspec caches instances per class: share s3fs' cache, so that
    # S3FileSystem.clear_instance_cache() (tests pointing AWS_* at another server) clears ours.
    made._cache = S3FileSystem._cache
    return made


@functools.cache
def _retrying_file_class() -> type[Any]:
    """s3fs' writable file whose every request (create/upload part/complete/put) is retried by
    the store's policy (s3fs itself tries each once)."""
    from s3fs.core import S3File

    def call_s3(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        return call_with_retry(
            lambda: S3File._call_s3(self, method, *args, **kwargs),
            self.retry_policy,
            describe=lambda: f"{method} {redact(str(self.path))} (streaming write)",
            translate=lambda exc: exc,
        )

    made: type[Any] = type("RetryingS3File", (S3File,), {"_call_s3": call_s3})
    return made


@functools.cache
def _parallel_file_class() -> type[Any]:
    """The retrying writable file whose multipart parts go out :data:`PARTS_IN_FLIGHT` at a
    time from a small thread pool while the caller keeps writing (s3fs sends them one by one,
    blocking the writer). A part that fails (after the store's retries) fails the next write or
    the close; a failed close aborts the upload itself, so nothing is published either way."""
    base = _retrying_file_class()

    def _initiate_upload(self: Any) -> None:
        base._initiate_upload(self)
        self.in_flight = []
        self.next_part = 1
        if getattr(self, "mpu", None):
            self.pool = cf.ThreadPoolExecutor(PARTS_IN_FLIGHT, thread_name_prefix="shardlake-part")

    def _send_part(self: Any, number: int, body: bytes) -> dict[str, Any]:
        bucket, key, _ = self.fs.split_path(self.path)
        request = {"Bucket": bucket, "Key": key, "PartNumber": number, "Body": body}
        # The digest here, on this part's thread, not on s3fs' one event-loop thread.
        _with_content_md5("upload_part", (), request)
        out = self._call_s3("upload_part", UploadId=self.mpu["UploadId"], **request)
        header = {"PartNumber": number, "ETag": out["ETag"]}
        if "ChecksumSHA256" in out:
            header["ChecksumSHA256"] = out["ChecksumSHA256"]
        return header

    def _reap(self: Any, every: bool) -> None:
        """Collect finished parts (all of them when ``every``); re-raise a failed one's error."""
        if not self.in_flight:
            return
        when = cf.ALL_COMPLETED if every else cf.FIRST_COMPLETED
        done, pending = cf.wait(self.in_flight, return_when=when)
        self.in_flight = list(pending)
        for future in done:
            self.parts.append(future.result())

    def _part_size(self: Any) -> int:
        size = int(self.blocksize)
        if self.fs.fixed_upload_size:
            return size
        tier: int = (self.next_part - 1) // _PARTS_PER_SIZE
        return size * (1 + tier)

    def _upload_chunk(self: Any, final: bool = False) -> bool:
        if not getattr(self, "mpu", None):  # an object smaller than one part: a single PUT
            return bool(base._upload_chunk(self, final))
        try:
            self.buffer.seek(0)
            left = len(self.buffer.getbuffer())
            while left >= (1 if final else _part_size(self)):
                body = self.buffer.read(_part_size(self))
                left -= len(body)
                while len(self.in_flight) >= PARTS_IN_FLIGHT:
                    _reap(self, every=False)  # bounded memory: wait for a part to finish
                self.in_flight.append(self.pool.submit(_send_part, self, self.next_part, body))
                self.next_part += 1
            if final:
                _reap(self, every=True)
                self.parts.sort(key=lambda part: part["PartNumber"])
                self.commit()
                self.pool.shutdown()
            else:
                self.offset += self.buffer.tell()
                self.buffer = io.BytesIO(self.buffer.read())
                self.buffer.seek(0, 2)
        except BaseException:
            if final:  # nobody discards after a failed close: abort here
                self.discard()
            raise
        return False

    def discard(self: Any) -> None:
        pool = getattr(self, "pool", None)
        for future in getattr(self, "in_flight", []):
            future.cancel()
        if pool is not None:
            pool.shutdown(wait=True)  # no part may land after the abort
        self.in_flight = []
        base.discard(self)

    made: type[Any] = type(
        "ParallelS3File",
        (base,),
        {"_initiate_upload": _initiate_upload, "_upload_chunk": _upload_chunk, "discard": discard},
    )
    return made
