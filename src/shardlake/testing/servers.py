"""The loopback S3 / GCS servers, re-exported for tests (they live in
:mod:`shardlake.tools.loopback`, which the demo uses without the test extra)."""

from ..tools.loopback import (
    DEFAULT_BUCKET,
    DUMMY_KEY,
    DUMMY_SECRET,
    GCS_PROJECT,
    GCS_TEST_BLOCK_SIZE,
    REGION,
    S3_TEST_BLOCK_SIZE,
    GCSServer,
    MissingServerError,
    S3Server,
    StoreServer,
    StoreServers,
    fake_gcs_server,
    gcs_storage_options,
    moto_s3_server,
    s3_storage_options,
    start_store_server,
)

__all__ = [
    "DEFAULT_BUCKET",
    "DUMMY_KEY",
    "DUMMY_SECRET",
    "GCS_PROJECT",
    "GCS_TEST_BLOCK_SIZE",
    "REGION",
    "S3_TEST_BLOCK_SIZE",
    "GCSServer",
    "MissingServerError",
    "S3Server",
    "StoreServer",
    "StoreServers",
    "fake_gcs_server",
    "gcs_storage_options",
    "moto_s3_server",
    "s3_storage_options",
    "start_store_server",
]
