"""Test support: conformance kit, pytest fixtures, fault injection, loopback servers.

* :mod:`shardlake.testing.conformance` - ``StoreConformance`` test classes any backend
  subclasses to prove shardlake's storage promises (imports pytest: test code only).
* :mod:`shardlake.testing.pytest_plugin` - the store fixtures on every backend; load it with
  ``pytest_plugins = ["shardlake.testing.pytest_plugin"]``.
* :mod:`shardlake.testing.faults` - ``FaultInjector``, a store layer injecting seeded faults
  (``store.with_layers(FaultInjector(FaultPlan(...)))``).
* :mod:`shardlake.testing.proxy` - a fault-injecting HTTP proxy in front of a loopback S3, and
  `CheckThenWriteGateway`, an S3 gateway with a racy (check-then-write) create-if-absent.
* :mod:`shardlake.testing.servers` - moto's S3 server and fake-gcs-server on 127.0.0.1 (from
  :mod:`shardlake.tools.loopback`), with the ``storage_options`` that reach them, plus
  :mod:`shardlake.testing.seaweedfs` (SeaweedFS, a real S3-compatible store) and
  :mod:`shardlake.testing.azurite` (Azurite, Azure Blob); ``StoreServers`` starts any of them.
* ``synth_corpus`` - the synthetic driving-frame corpus ``shardlake synth`` writes, for tests
  that need a source tree; ``write_npz`` / ``npz_bytes`` write deterministic ``.npz`` files.
* ``RequestCounter`` - a store layer counting requests (``store.with_layers(RequestCounter())``;
  with a log path, every process appends to it: ``read_request_log`` / ``summarize_request_log``),
  and ``free_port`` - a 127.0.0.1 port free right now (or, once closed, one nothing listens at).

Nothing in the library imports this package; it needs the ``test`` extra.
"""

from ..store.layers import RequestCounter, read_request_log, summarize_request_log
from ..tools.localhost import free_port
from ..tools.synth import SynthResult, npz_bytes, synth_corpus, write_npz
from .azurite import AzuriteServer, azurite_server
from .seaweedfs import SeaweedFSServer, seaweedfs_server
from .servers import (
    GCSServer,
    S3Server,
    StoreServers,
    fake_gcs_server,
    moto_s3_server,
    start_store_server,
)

__all__ = [
    "AzuriteServer",
    "GCSServer",
    "RequestCounter",
    "S3Server",
    "SeaweedFSServer",
    "StoreServers",
    "SynthResult",
    "azurite_server",
    "fake_gcs_server",
    "free_port",
    "moto_s3_server",
    "npz_bytes",
    "read_request_log",
    "seaweedfs_server",
    "start_store_server",
    "summarize_request_log",
    "synth_corpus",
    "write_npz",
]
