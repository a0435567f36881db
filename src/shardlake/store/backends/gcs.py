"""GCS through gcsfs: ``ifGenerationMatch=0`` simple uploads, one retry layer."""

from __future__ import annotations

import functools
from typing import Any

import fsspec

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

    def _create(self, path: str, data: bytes) -> None:
        # chunksize above the size keeps pipe_file on the simple (precondition-honouring) upload.
        self._create_or_exists(path, data, refused_create, chunksize=len(data) + 1)


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
