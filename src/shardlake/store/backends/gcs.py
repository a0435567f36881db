"""GCS through gcsfs: ``ifGenerationMatch=0`` simple uploads, one retry layer."""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
from typing import Any

import fsspec

from ...errors import TransientStoreError
from ..classify import causes, http_status
from ..retry import RetryPolicy
from .base import BucketBackend

__all__ = [
    "GCSBackend",
    "refused_create",
]


class GCSBackend(BucketBackend):
    """GCS (gcsfs): simple uploads replace atomically; create sends ``ifGenerationMatch=0``.

    gcsfs ``open("xb")`` and resumable uploads do not carry the precondition everywhere (the
    fake-gcs-server emulator ignores it), so create always uses a single simple upload.
    """

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
