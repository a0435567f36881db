"""Test and demo helpers: loopback S3 / GCS servers and a fault-injecting store wrapper.

* :mod:`shardlake.testing.servers` starts moto's S3 server and fake-gcs-server on 127.0.0.1 and
  hands back the ``storage_options`` (and environment) that make s3fs / gcsfs talk to them.
* :mod:`shardlake.testing.faults` wraps any store so that a seeded fraction of its requests fail
  transiently, and counts requests and bytes fetched.

Nothing here is needed to *use* shardlake; it needs the ``test`` extra (moto, fake-gcs-server).
"""

from .servers import (
    GCSServer,
    S3Server,
    StoreServers,
    fake_gcs_server,
    moto_s3_server,
    start_store_server,
)

__all__ = [
    "GCSServer",
    "S3Server",
    "StoreServers",
    "fake_gcs_server",
    "moto_s3_server",
    "start_store_server",
]
