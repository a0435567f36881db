"""The loopback servers for tests: moto's S3 and fake-gcs-server (from
:mod:`shardlake.tools.loopback`, which the demo uses without the test extra), plus SeaweedFS
(:mod:`shardlake.testing.seaweedfs`, a real S3-compatible store) and Azurite
(:mod:`shardlake.testing.azurite`, Azure Blob).

This module adds the two test servers to the kinds :func:`start_store_server` and
:class:`StoreServers` start, and passes on the server types and starters; the dummy
credentials, block sizes and ``*_storage_options`` builders stay in
:mod:`shardlake.tools.loopback`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from types import MappingProxyType

from ..tools.loopback import (
    DEFAULT_BUCKET,
    GCSServer,
    MissingServerError,
    S3Server,
    StoreServer,
    fake_gcs_server,
    moto_s3_server,
)
from ..tools.loopback import StoreServers as _LoopbackServers
from ..tools.loopback import start_store_server as _start_loopback_server

# Store kinds with a loopback server, and what serves each.
SERVER_KINDS = ("s3", "gcs", "seaweedfs", "azure")


@contextlib.contextmanager
def start_store_server(
    kind: str, bucket: str = DEFAULT_BUCKET, *, set_env: bool = True
) -> Iterator[StoreServer]:
    """The loopback server of store kind ``kind``: ``"s3"`` (moto), ``"gcs"`` / ``"gs"``
    (fake-gcs-server), ``"seaweedfs"`` (SeaweedFS, S3 API) or ``"azure"`` (Azurite)."""
    if kind == "seaweedfs":
        from .seaweedfs import seaweedfs_server

        with seaweedfs_server(bucket, set_env=set_env) as server:
            yield server
    elif kind == "azure":
        from .azurite import azurite_server

        with azurite_server(bucket, set_env=set_env) as azure:
            yield azure
    elif kind in ("s3", "gcs", "gs"):
        with _start_loopback_server(kind, bucket, set_env=set_env) as server:
            yield server
    else:
        raise ValueError(
            f"no loopback server for store kind {kind!r}: use one of {', '.join(SERVER_KINDS)}"
        )


class StoreServers(_LoopbackServers):
    """Start loopback servers lazily on first use and stop them all at :meth:`close`.

    One instance per pytest session or per run::

        with StoreServers() as servers:
            s3 = servers.get("seaweedfs")

    SeaweedFS speaks S3 like moto does, so its ``AWS_*`` settings are never put into
    ``os.environ`` (they would redirect the moto kind); a test on it applies
    :attr:`StoreServer.env` itself (the pytest plugin does, for the test's store kind).
    """

    # kind -> why it did not start (replaced, never mutated: safe as a class default)
    _failed: Mapping[str, str] = MappingProxyType({})

    def get(self, kind: str) -> StoreServer:
        kind = "gcs" if kind == "gs" else kind
        if kind not in ("seaweedfs", "azure"):
            return super().get(kind)
        failed = self._failed
        if kind in failed:
            # Starting takes up to minutes; a server that did not start once is not retried
            # by every later test of the session.
            raise RuntimeError(
                f"the {kind} loopback server failed to start earlier: {failed[kind]}"
            )
        if kind not in self._running:
            set_env = self._set_env and kind != "seaweedfs"
            try:
                self._running[kind] = self._stack.enter_context(
                    start_store_server(kind, set_env=set_env)
                )
            except Exception as exc:
                self._failed = MappingProxyType({**failed, kind: str(exc)[:500]})
                raise
        return self._running[kind]


__all__ = [
    "SERVER_KINDS",
    "GCSServer",
    "MissingServerError",
    "S3Server",
    "StoreServer",
    "StoreServers",
    "fake_gcs_server",
    "moto_s3_server",
    "start_store_server",
]
