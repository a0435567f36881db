"""GCS through gcsfs: ``ifGenerationMatch=0`` simple uploads, one retry layer."""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import os
from typing import TYPE_CHECKING, Any

import fsspec

from ...errors import TransientStoreError
from ..classify import causes, http_status
from ..retry import RetryPolicy
from .base import BucketBackend

if TYPE_CHECKING:
    from ..endpoint import Endpoint

__all__ = [
    "GCSBackend",
    "refused_create",
]


class GCSBackend(BucketBackend):
    """GCS (gcsfs): simple uploads replace atomically; create sends ``ifGenerationMatch=0``.

    gcsfs ``open("xb")`` and resumable uploads do not carry the precondition everywhere (the
    fake-gcs-server emulator ignores it), so create always uses a single simple upload.
    """

    protocols = ("gs", "gcs")
    extra = "gcs"
    bucket_noun = "bucket"
    credential_hint = (
        "set GOOGLE_APPLICATION_CREDENTIALS (or run gcloud auth application-default login), "
        "or pass token in storage_options"
    )
    fsspec_client = "gcsfs"

    @classmethod
    def environment_endpoint(cls) -> tuple[str, str] | None:
        host = os.environ.get("STORAGE_EMULATOR_HOST", "")
        if not host or host == "default":
            return None
        # gcsfs reads a bare host:port as http://host:port
        return (
            host if "://" in host else f"http://{host}"
        ), "environment variable STORAGE_EMULATOR_HOST"

    @classmethod
    def obstore_config(
        cls, options: dict[str, Any], endpoint: Endpoint | None
    ) -> dict[str, Any] | str:
        return _obstore_config(options, endpoint)

    @classmethod
    def obstore_store(cls, bucket: str, config: dict[str, Any], common: dict[str, Any]) -> Any:
        from obstore.store import GCSStore

        return GCSStore(bucket, **common, **config)

    @classmethod
    def make_filesystem(
        cls, protocol: str, storage_options: dict[str, Any], policy: RetryPolicy
    ) -> fsspec.AbstractFileSystem:
        import aiohttp

        options = dict(storage_options)
        options.setdefault(
            "requests_timeout",
            aiohttp.ClientTimeout(
                sock_connect=policy.request_timeout, sock_read=policy.request_timeout
            ),
        )
        return _single_try_filesystem_class()(**options)

    def write(self, path: str, data: bytes) -> None:
        try:
            reply = self.fs.pipe_file(path, data, chunksize=len(data) + 1)
        except Exception as exc:
            self.explain(path, exc)
            raise
        self._fresh(path)
        self._check_stored(path, data, reply)

    def _create(self, path: str, data: bytes) -> None:
        # chunksize above the size keeps pipe_file on the simple (precondition-honouring) upload.
        reply = self._create_or_exists(path, data, refused_create, chunksize=len(data) + 1)
        self._check_stored(path, data, reply)

    def _open_for_write(self, path: str) -> Any:
        handle = self.fs.open(path, "wb")
        digest = hashlib.md5(usedforsecurity=False)
        write = handle.write

        def hashed_write(data: Any) -> int:
            digest.update(data)
            return int(write(data))

        # The MD5 of every byte written, compared at commit with what GCS stored (gcsfs' own
        # consistency check skips the final chunk of a resumable upload).
        handle.write = hashed_write
        handle.shardlake_md5 = digest
        return handle

    def _commit_writer(self, handle: Any, path: str) -> None:
        handle.close()
        self._fresh(path)
        info = self.fs.info(path)
        sent = base64.b64encode(handle.shardlake_md5.digest()).decode()
        self._check_digest(path, sent, {**info, "generation": getattr(handle, "generation", None)})

    def _check_stored(self, path: str, data: bytes, reply: Any) -> None:
        sent = base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
        self._check_digest(path, sent, reply)

    def _check_digest(self, path: str, sent: str, reply: Any) -> None:
        """Compare the MD5 GCS computed for the object just stored with ``sent``, that of the
        bytes sent, before anything refers to the object.

        A body damaged in transit was stored (gcsfs sends no digest that GCS would check
        first): this upload's generation is deleted - only it, whatever wrote since - and
        :class:`TransientStoreError` is raised (the store sends a write or create again; a
        streamed write fails, and its caller writes the object again)."""
        stored = reply.get("md5Hash") if isinstance(reply, dict) else None
        if not stored or stored == sent:
            return  # equal, or no digest reported (a composite object): nothing to compare
        bucket, _, key = path.partition("/")
        generation = reply.get("generation")
        if generation is not None:
            with contextlib.suppress(Exception):  # a create's retry then finds the key taken
                self.fs.call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=generation)
        self._fresh(path)
        raise TransientStoreError(
            f"{path}: GCS stored other bytes than were sent (MD5 {stored}, sent {sent}): damaged "
            "in transit; sending it again"
        )


def _obstore_config(options: dict[str, Any], endpoint: Endpoint | None) -> dict[str, Any] | str:
    """obstore ``GCSStore`` keywords from gcsfs options: the store's endpoint (``endpoint_url``
    or ``STORAGE_EMULATOR_HOST``, as gcsfs reads them) and ``token="anon"`` or a credentials file
    (given as ``token``, or found where gcsfs's ``google_default`` finds one). With no token and
    no such file, gcsfs tries the metadata server and then anonymous access, which obstore does
    not: that store keeps gcsfs."""
    if options.get("requester_pays") or options.get("user_project"):
        return "a requester-pays bucket is given"
    config: dict[str, Any] = {}
    if endpoint is not None:
        config["base_url"] = endpoint.url.rstrip("/")
    token = options.get("token")
    if token == "anon":
        config["skip_signature"] = True
        return config
    if token in (None, "google_default"):
        token = _default_credentials_file()
    if not isinstance(token, str) or not os.path.isfile(token):
        # a credentials object, an interactive flow, or none to be found
        return "no credentials file or token='anon' (gcsfs asks the metadata server)"
    config["application_credentials"] = token
    return config


def _default_credentials_file() -> str | None:
    """The application default credentials file, where google.auth looks first."""
    named = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if named:
        return named
    home = os.environ.get("CLOUDSDK_CONFIG") or os.path.expanduser("~/.config/gcloud")
    return os.path.join(home, "application_default_credentials.json")


def refused_create(exc: BaseException) -> bool:
    """Whether a failed ``ifGenerationMatch=0`` upload means "the object exists": HTTP 412,
    however the client raised it (gcsfs maps a 412 reply to ``FileExistsError`` itself; this
    reads the status from its ``HttpError`` / aiohttp error too)."""
    if isinstance(exc, FileExistsError):
        return True
    return any(http_status(cause) == 412 for cause in causes(exc))


@functools.cache
def _single_try_filesystem_class() -> type[fsspec.AbstractFileSystem]:
    """gcsfs' filesystem with one try per request (its own loop retries 6 times with up to 32 s
    pauses, outside any deadline; the store's policy retries instead).

    Built on ``gcsfs.core.GCSFileSystem`` directly: gcsfs exports an experimental filesystem by
    default (GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT) that probes bucket types through APIs emulators
    lack and hangs there; shardlake needs only the plain JSON-API client.
    """
    from gcsfs.core import GCSFileSystem
    from gcsfs.retry import retry_request

    single_try = retry_request(retries=1)(GCSFileSystem._request.__wrapped__)
    made: type[fsspec.AbstractFileSystem] = type(
        "SingleTryGCSFileSystem", (GCSFileSystem,), {"_request": single_try}
    )
    return made
