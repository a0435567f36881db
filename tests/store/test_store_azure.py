"""Azure Blob Storage as a named backend (adlfs, against Azurite): requests per read, retry
classification of azure-core / aiohttp errors, and what each failure is called."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest

from shardlake.errors import (
    BucketNotFoundError,
    CredentialsMissingError,
    CredentialsRejectedError,
    StorePermissionError,
)
from shardlake.store import open_store
from shardlake.store.backends import AzureBackend
from shardlake.store.classify import Verdict, classify
from shardlake.testing.azurite import ACCOUNT_KEY, ACCOUNT_NAME
from shardlake.testing.servers import StoreServer


@pytest.fixture
def requests_sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """(method, path) of every HTTP request azure-core sends meanwhile."""
    from azure.core.pipeline.transport import AioHttpTransport

    sent: list[tuple[str, str]] = []
    original = AioHttpTransport.send

    async def send(self: Any, request: Any, **kwargs: Any) -> Any:
        sent.append((request.method, request.url.split("?", 1)[0]))
        return await original(self, request, **kwargs)

    monkeypatch.setattr(AioHttpTransport, "send", send)
    yield sent


@pytest.mark.parametrize("scheme", ["az", "abfs", "abfss"])
def test_azure_urls_are_the_azure_backend(azurite_server: StoreServer, scheme: str) -> None:
    url = azurite_server.fresh_url("scheme").replace("az://", f"{scheme}://", 1)
    store = open_store(url, azurite_server.storage_options)
    assert isinstance(store.backend, AzureBackend)
    store.write("k", b"v")
    assert store.read("k") == b"v"


def test_reads_are_one_get_without_head(
    azurite_server: StoreServer, requests_sent: list[tuple[str, str]]
) -> None:
    # adlfs's request shape (read_ranges would otherwise go through obstore, not counted here).
    options = {**azurite_server.storage_options, "read_client": "adlfs"}
    store = open_store(azurite_server.fresh_url("gets"), options)
    big = bytes(range(256)) * (36 * 2**20 // 256)  # above the SDK's 32 MiB single-GET size
    store.write("big", big)
    store.write("small", b"0123456789")
    requests_sent.clear()
    assert store.read("big") == big
    assert store.read_range("small", 2, 5) == b"234"
    assert store.read_ranges([("small", 0, 1), ("big", 10, 20)]) == [b"0", big[10:20]]
    methods = [method for method, _ in requests_sent]
    assert methods == ["GET"] * 4, requests_sent


def test_create_is_conditional(azurite_server: StoreServer) -> None:
    store = open_store(azurite_server.fresh_url("create"), azurite_server.storage_options)
    store.ensure_create_enforced()


def test_library_retries_are_off(azurite_server: StoreServer) -> None:
    store = open_store(azurite_server.fresh_url("retries"), azurite_server.storage_options)
    retry = store.fs.service_client._config.retry_policy
    assert retry.total_retries == 0


def _azure(cls_name: str, status: int | None = None, code: str | None = None) -> Exception:
    import azure.core.exceptions as azure_exc

    exc = getattr(azure_exc, cls_name)(message="m")
    if status is not None:
        exc.status_code = status
    if code is not None:
        exc.error_code = code
    return exc  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("exc", "verdict"),
    [
        (_azure("ServiceRequestError"), Verdict.TRANSIENT),  # never sent
        (_azure("ServiceRequestTimeoutError"), Verdict.TRANSIENT),
        (_azure("ServiceResponseError"), Verdict.AMBIGUOUS),  # sent, reply lost
        (_azure("ServiceResponseTimeoutError"), Verdict.AMBIGUOUS),
        (_azure("IncompleteReadError"), Verdict.AMBIGUOUS),
        (_azure("HttpResponseError", 503, "ServerBusy"), Verdict.TRANSIENT),
        (_azure("HttpResponseError", 429, None), Verdict.TRANSIENT),
        (_azure("HttpResponseError", 500, "InternalError"), Verdict.AMBIGUOUS),
        (_azure("HttpResponseError", 500, "OperationTimedOut"), Verdict.AMBIGUOUS),
        (_azure("ResourceNotFoundError", 404, "BlobNotFound"), Verdict.PERMANENT),
        (_azure("ResourceExistsError", 409, "BlobAlreadyExists"), Verdict.PERMANENT),
        (_azure("ClientAuthenticationError", 403, "AuthenticationFailed"), Verdict.PERMANENT),
        (_azure("HttpResponseError", 403, "AuthorizationPermissionMismatch"), Verdict.PERMANENT),
    ],
    ids=lambda v: v.value if isinstance(v, Verdict) else type(v).__name__,
)
def test_azure_core_errors_are_classified(exc: Exception, verdict: Verdict) -> None:
    assert classify(exc) is verdict


def test_aiohttp_errors_under_azure_core_are_classified() -> None:
    import aiohttp
    from azure.core.exceptions import ServiceRequestError, ServiceResponseError

    refused = ServiceRequestError("connect failed")
    refused.__cause__ = aiohttp.ClientConnectionError("refused")
    assert classify(refused) is Verdict.TRANSIENT
    lost = ServiceResponseError("reply lost")
    lost.__cause__ = aiohttp.ServerDisconnectedError()
    assert classify(lost) is Verdict.AMBIGUOUS


def test_missing_credentials_say_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "AZURE_STORAGE_CONNECTION_STRING",
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_SAS_TOKEN",
    ):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(CredentialsMissingError) as caught:
        open_store("az://container/prefix", {"skip_instance_cache": True})
    assert "AZURE_STORAGE_CONNECTION_STRING" in str(caught.value)
    assert "DefaultAzureCredential" in str(caught.value)


def test_rejected_key_is_not_access_denied(azurite_server: StoreServer) -> None:
    options = dict(azurite_server.storage_options)
    wrong_key = "A" * 86 + "=="
    options["connection_string"] = options["connection_string"].replace(ACCOUNT_KEY, wrong_key)
    store = open_store(azurite_server.fresh_url("badkey"), options)
    with pytest.raises(CredentialsRejectedError) as caught:
        store.read("k")
    assert wrong_key not in str(caught.value)
    with pytest.raises(CredentialsRejectedError):
        store.create("k", b"v")


def test_read_only_sas_is_access_denied(azurite_server: StoreServer) -> None:
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    sas = generate_container_sas(
        ACCOUNT_NAME,
        azurite_server.bucket,
        account_key=ACCOUNT_KEY,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1),
    )
    options = {
        "connection_string": (
            f"BlobEndpoint={azurite_server.endpoint_url}/{ACCOUNT_NAME};SharedAccessSignature={sas}"
        ),
        "skip_instance_cache": True,
    }
    url = azurite_server.fresh_url("sas")
    open_store(url, azurite_server.storage_options).write("k", b"v")
    store = open_store(url, options)
    assert store.read("k") == b"v"
    with pytest.raises(StorePermissionError) as caught:
        store.write("k2", b"v")
    assert sas not in str(caught.value)


def test_missing_container_is_named(azurite_server: StoreServer) -> None:
    store = open_store("az://no-such-container/prefix", azurite_server.storage_options)
    for action in (lambda: store.read("k"), lambda: store.create("k", b"v"), store.list):
        with pytest.raises(BucketNotFoundError) as caught:
            action()
        assert "container 'no-such-container' does not exist" in str(caught.value)


def test_default_credential_without_a_source_is_missing_credentials() -> None:
    from azure.identity import CredentialUnavailableError

    from shardlake.store.errors import translate_error

    exc = CredentialUnavailableError(
        message="DefaultAzureCredential failed to retrieve a token from the included credentials."
    )
    translated = translate_error(exc, "read", "az://c/p/k", "c", "az")
    assert isinstance(translated, CredentialsMissingError)
    assert "az login" in str(translated)


def test_two_streamed_writers_of_one_key_both_succeed(azurite_server: StoreServer) -> None:
    """Racing packs stream the same content-addressed shard: the first block-list commit drops
    the other writer's staged blocks (InvalidBlockList), which is no failure of that writer."""
    store = open_store(azurite_server.fresh_url("streams"), azurite_server.storage_options)
    body = bytes(range(256)) * (6 * 4096)  # 6 MiB: more than one 4 MiB block is staged
    first, second = store.open_writer("shard.tar"), store.open_writer("shard.tar")
    a, b = first.__enter__(), second.__enter__()
    a.write(body)
    b.write(body)
    first.__exit__(None, None, None)
    second.__exit__(None, None, None)
    assert store.read("shard.tar") == body
