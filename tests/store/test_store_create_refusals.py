"""Create-if-absent is decided by the protocol's status (412, or 409 where the service uses it),
never by a client library's message mapping - with each server's real error shape."""

from __future__ import annotations

import errno
from typing import Any

import pytest

from shardlake.errors import AlreadyExistsError
from shardlake.store import open_store
from shardlake.store.backends.azure import refused_create as azure_refused
from shardlake.store.backends.gcs import refused_create as gcs_refused
from shardlake.store.backends.s3 import refused_create as s3_refused
from shardlake.store.classify import Verdict, classify
from shardlake.testing.servers import StoreServer


def _boto_put_twice(server: StoreServer, key: str) -> Any:
    import boto3
    import botocore.exceptions

    client = boto3.client(
        "s3",
        endpoint_url=server.endpoint_url,
        aws_access_key_id="k",
        aws_secret_access_key="s",
        region_name="us-east-1",
    )
    client.put_object(Bucket=server.bucket, Key=key, Body=b"1", IfNoneMatch="*")
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        client.put_object(Bucket=server.bucket, Key=key, Body=b"2", IfNoneMatch="*")
    return caught.value.response


def test_seaweedfs_412_has_no_condition_element(seaweedfs_server: StoreServer) -> None:
    """The real shape: 412 PreconditionFailed without AWS's Condition element, which s3fs
    turns into OSError(EINVAL) - the create must still read as "already exists"."""
    response = _boto_put_twice(seaweedfs_server, "shape/no-condition")
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert response["Error"]["Code"] == "PreconditionFailed"
    assert "Condition" not in response["Error"]

    import s3fs

    fs = s3fs.S3FileSystem(**seaweedfs_server.storage_options)
    path = f"{seaweedfs_server.bucket}/shape/s3fs"
    fs.pipe_file(path, b"1", mode="create")
    with pytest.raises(OSError) as caught:
        fs.pipe_file(path, b"2", mode="create")
    assert not isinstance(caught.value, FileExistsError)  # s3fs' own mapping misses it
    assert caught.value.errno == errno.EINVAL
    assert s3_refused(caught.value)


def test_moto_412_carries_the_condition(store_servers: Any) -> None:
    response = _boto_put_twice(store_servers.get("s3"), "shape/condition")
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert response["Error"].get("Condition") == "If-None-Match"


@pytest.mark.parametrize("kind", ["seaweedfs", "s3", "gcs", "azure"])
def test_second_create_is_already_exists(store_servers: Any, kind: str) -> None:
    server = store_servers.get(kind)
    store = open_store(server.fresh_url("refuse"), server.storage_options)
    store.create("k", b"first")
    with pytest.raises(AlreadyExistsError):
        store.create("k", b"second")
    assert store.read("k") == b"first"
    store.create("k", b"first")  # the same bytes: a re-sent create of ours, not a loss
    store.ensure_create_enforced()


def _client_error(status: int, code: str, **error: str) -> Exception:
    import botocore.exceptions

    response = {
        "Error": {"Code": code, "Message": "m", **error},
        "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": {}},
    }
    boto = botocore.exceptions.ClientError(response, "PutObject")  # type: ignore[arg-type]
    wrapped = OSError(errno.EINVAL, "m")  # s3fs' translation, raised "from" the ClientError
    wrapped.__cause__ = boto
    return wrapped


def test_s3_status_decides() -> None:
    assert s3_refused(_client_error(412, "PreconditionFailed"))
    assert s3_refused(_client_error(412, "PreconditionFailed", Condition="If-None-Match"))
    assert s3_refused(_client_error(409, "ObjectAlreadyExists"))
    # AWS: a competing conditional write is in flight - retry, it is not a verdict yet.
    for code in ("ConditionalRequestConflict", "OperationAborted"):
        exc = _client_error(409, code)
        assert not s3_refused(exc)
        assert classify(exc) is Verdict.TRANSIENT
    assert not s3_refused(_client_error(403, "AccessDenied"))
    assert not s3_refused(_client_error(500, "InternalError"))
    assert not s3_refused(OSError(errno.EIO, "no reply at all"))


def test_gcs_status_decides() -> None:
    from gcsfs.retry import HttpError

    assert gcs_refused(FileExistsError("x"))  # gcsfs' own mapping of a 412 reply
    assert gcs_refused(HttpError({"code": 412, "message": "conditionNotMet"}))
    wrapped = OSError("upload failed")
    wrapped.__cause__ = HttpError({"code": 412, "message": "conditionNotMet"})
    assert gcs_refused(wrapped)
    assert not gcs_refused(HttpError({"code": 403, "message": "forbidden"}))


def _azure_error(cls_name: str, status: int, code: str) -> Exception:
    import azure.core.exceptions as azure_exc

    exc = getattr(azure_exc, cls_name)(message=f"m\nErrorCode:{code}")
    exc.status_code = status
    exc.error_code = code
    return exc  # type: ignore[no-any-return]


def test_azure_status_decides() -> None:
    exists = _azure_error("ResourceExistsError", 409, "BlobAlreadyExists")
    assert azure_refused(exists)
    assert azure_refused(_azure_error("ResourceModifiedError", 412, "ConditionNotMet"))
    assert azure_refused(_azure_error("HttpResponseError", 409, "BlobAlreadyExists"))
    # adlfs raises FileExistsError(path) while handling the ResourceExistsError
    try:
        try:
            raise exists
        except Exception:
            raise FileExistsError("c/k")  # noqa: B904 - adlfs' shape: no "from"
    except FileExistsError as adlfs_shape:
        assert adlfs_shape.__context__ is exists
        assert azure_refused(adlfs_shape)
    assert not azure_refused(_azure_error("ResourceExistsError", 409, "ContainerBeingDeleted"))
    assert not azure_refused(_azure_error("HttpResponseError", 403, "AuthorizationFailure"))


def test_azurite_conflict_is_resource_exists_409(azurite_server: StoreServer) -> None:
    """The real shape: Azurite (like Azure) refuses overwrite=False with 409 BlobAlreadyExists,
    raised as azure-core's ResourceExistsError."""
    from azure.core.exceptions import ResourceExistsError
    from azure.storage.blob import BlobServiceClient

    client = BlobServiceClient.from_connection_string(
        azurite_server.storage_options["connection_string"]
    )
    with client:
        blob = client.get_blob_client(azurite_server.bucket, "shape/conflict")
        blob.upload_blob(b"1", overwrite=False)
        with pytest.raises(ResourceExistsError) as caught:
            blob.upload_blob(b"2", overwrite=False)
    assert caught.value.status_code == 409
    assert caught.value.error_code == "BlobAlreadyExists"
    assert azure_refused(caught.value)
