"""obstore (Rust ``object_store``) as the read client on S3, GCS and Azure: the default where
it is installed.

``storage_options={"read_client": "fsspec"}`` keeps every read on the protocol's fsspec client
(s3fs, gcsfs, adlfs; their names are accepted too); ``"obstore"`` asks for it explicitly (it is
the default on ``s3://``, ``gs://`` and ``az://`` whenever the ``obstore`` package is installed
and the storage options say how to reach and sign for the store: see :func:`obstore_config`).

Measured against loopback servers (``benchmarks/obstore_eval.py``, docs/performance.md),
obstore fetches faster than the fsspec clients with a fraction of the client CPU per GB. Only
*reads* go through it; writes, conditional creates, listings and multipart clean-up stay on the
fsspec client, so every write-side guarantee of the store is unchanged. A read obstore cannot
answer plainly (a range past the object's end, an error after its one try) falls back to the
fsspec path, which gives the store's documented semantics and error translation.

obstore's tokio runtime does not survive ``fork`` (a forked child that inherits a started runtime
hangs; obstore documents no fork support). So obstore is used only in processes that did not
inherit a started runtime: a child forked after its parent used obstore reads through fsspec.
Only ranged multi-reads (``read_ranges``: the loader's payload reads) use obstore, so a training
process that opens datasets and then forks DataLoader workers leaves the runtime to the workers.
"""

from __future__ import annotations

import asyncio
import os
import threading
import warnings
from datetime import timedelta
from typing import Any

from ..endpoint import Endpoint, configured_endpoint
from ..url import redact
from .options import READ_CLIENT_OPTION

__all__ = [
    "FSSPEC",
    "FSSPEC_CLIENTS",
    "OBSTORE",
    "ObstoreReads",
    "ReadClientWarning",
    "obstore_config",
    "obstore_config_or_reason",
    "obstore_config_for",
    "obstore_installed",
    "warn_fallback",
]

OBSTORE = "obstore"
FSSPEC = "fsspec"
# The fsspec client of each protocol obstore can read, by its own name too ("s3fs" was the only
# alternative before GCS and Azure reads went through obstore).
FSSPEC_CLIENTS = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
}
_runtime_pid: int | None = None  # the process that started obstore's runtime (fork-inherited)


class ReadClientWarning(UserWarning):
    """Reads that obstore would serve go through the slower fsspec client instead (the message
    says why); issued once per process."""


_warned_pid: int | None = None
# Failed reads in a row (the fsspec client serving each) after which a client that worked
# before is reported as not working.
_FALLBACKS_TO_WARN = 3


def warn_fallback(protocol: str, reason: str) -> None:
    """Say (once per process) that reads of ``protocol`` fall back to the fsspec client."""
    global _warned_pid
    if _warned_pid == os.getpid():
        return
    _warned_pid = os.getpid()
    client = FSSPEC_CLIENTS.get(protocol, FSSPEC)
    warnings.warn(
        f"shardlake: reads of {protocol}:// go through {client}, not obstore: {redact(reason)} "
        f"(storage option {READ_CLIENT_OPTION}='{FSSPEC}' chooses {client} without this warning)",
        ReadClientWarning,
        stacklevel=3,
    )


def obstore_installed() -> bool:
    """Whether the ``obstore`` package can be imported (found, not imported: ~30 ms)."""
    import importlib.util

    try:
        return importlib.util.find_spec("obstore") is not None
    except (ImportError, ValueError):
        return False


def obstore_config(protocol: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """The obstore store keywords for fsspec-style ``options`` of ``protocol``, or None when
    obstore cannot reach or sign for the store the way the fsspec client would (a credentials
    object, an interactive login, requester-pays): those stores keep their fsspec client."""
    found = obstore_config_or_reason(protocol, options)
    return found if isinstance(found, dict) else None


def obstore_config_or_reason(protocol: str, options: dict[str, Any]) -> dict[str, Any] | str:
    """:func:`obstore_config`, or why obstore cannot serve (for the fall-back's warning)."""
    return obstore_config_for(protocol, options, configured_endpoint(protocol, options))


def obstore_config_for(
    protocol: str, options: dict[str, Any], endpoint: Endpoint | None
) -> dict[str, Any] | str:
    """:func:`obstore_config_or_reason` with the store's ``endpoint`` (``StoreConfig``), the
    one the fsspec client talks to."""
    if protocol in ("s3", "s3a"):
        return _s3_config(options, endpoint)
    if protocol in ("gs", "gcs"):
        return _gcs_config(options, endpoint)
    if protocol in ("az", "abfs", "abfss"):
        return _azure_config(options)
    return f"obstore does not read {protocol}://"


# Settings of an AWS profile that give credentials (obstore reads none of these files).
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


def _s3_config(options: dict[str, Any], endpoint: Endpoint | None) -> dict[str, Any] | str:
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


def _gcs_config(options: dict[str, Any], endpoint: Endpoint | None) -> dict[str, Any] | str:
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


def _connection_string(text: str) -> dict[str, str]:
    """``Key=Value;...`` pairs of an Azure storage connection string."""
    pairs = (part.split("=", 1) for part in text.split(";") if "=" in part)
    return {key.strip(): value.strip() for key, value in pairs}


def _azure_config(options: dict[str, Any]) -> dict[str, Any] | str:
    """obstore ``AzureStore`` keywords from adlfs options: a connection string (given or in
    ``AZURE_STORAGE_CONNECTION_STRING``), an account with a key or SAS token, a service
    principal, or anonymous access. Other credentials (a credential object, the default
    credential chain) stay with adlfs."""
    if options.get("credential") is not None:
        return "a credential object is given"
    text = options.get("connection_string")
    if not text and not options.get("account_name"):
        text = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    parts = _connection_string(text) if text else {}
    name = parts.get("AccountName") or options.get("account_name")
    config: dict[str, Any] = {}
    if parts.get("UseDevelopmentStorage", "").lower() == "true":
        config["use_emulator"] = True
    if name:
        config["account_name"] = name
    key = parts.get("AccountKey") or options.get("account_key")
    sas = parts.get("SharedAccessSignature") or options.get("sas_token")
    principal = [options.get(k) for k in ("client_id", "client_secret", "tenant_id")]
    if key:
        config["account_key"] = key
    elif sas:
        config["sas_key"] = str(sas).lstrip("?")
    elif all(principal):
        config.update(zip(("client_id", "client_secret", "tenant_id"), principal, strict=True))
    elif options.get("anon"):
        config["skip_signature"] = True
    elif not config.get("use_emulator"):
        return "no key, SAS token or service principal (adlfs uses the default credential chain)"
    endpoint = parts.get("BlobEndpoint")
    if not endpoint and options.get("account_host"):
        endpoint = f"https://{options['account_host']}"
    if not endpoint and name and parts.get("EndpointSuffix"):
        scheme = parts.get("DefaultEndpointsProtocol", "https")
        endpoint = f"{scheme}://{name}.blob.{parts['EndpointSuffix']}"
    if endpoint:
        config["endpoint"] = endpoint.rstrip("/")
    if not name and not config.get("use_emulator"):
        return "no storage account named"
    return config


class ObstoreReads:
    """Ranged and whole-object GETs for ``bucket/key`` paths through obstore (one client per
    bucket or container, made lazily: the backend is rebuilt in every process)."""

    def __init__(
        self, protocol: str, config: dict[str, Any], attempt_timeout: float = 30.0
    ) -> None:
        self._protocol = protocol
        self._config = config
        self._attempt_timeout = attempt_timeout
        self._stores: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._served = 0  # reads obstore served in this process
        self._fallbacks = 0  # reads in a row it failed and the fsspec client served

    @property
    def protocol(self) -> str:
        return self._protocol

    def served(self) -> None:
        """A read went through obstore."""
        self._served += 1
        self._fallbacks = 0

    def fell_back(self, exc: BaseException) -> None:
        """obstore failed a read the fsspec client then served: warn (once per process) when
        obstore has not served a read yet in this process or fails again and again (a
        one-off failure of a working client is retried on the fsspec path, no more)."""
        self._fallbacks += 1
        if self._served == 0 or self._fallbacks >= _FALLBACKS_TO_WARN:
            first_line = (str(exc).splitlines() or [""])[0]
            warn_fallback(self._protocol, f"obstore failed: {type(exc).__name__}: {first_line}")

    @staticmethod
    def usable() -> bool:
        """False in a process forked after its parent started obstore's runtime."""
        return _runtime_pid is None or _runtime_pid == os.getpid()

    def _store(self, bucket: str) -> Any:
        global _runtime_pid
        with self._lock:
            _runtime_pid = os.getpid()
            found = self._stores.get(bucket)
            if found is None:
                found = self._make_store(bucket)
                self._stores[bucket] = found
            return found

    def _make_store(self, bucket: str) -> Any:
        from obstore.store import AzureStore, GCSStore, S3Store

        config = self._config
        endpoint = str(config.get("endpoint") or config.get("base_url") or "")
        timeout = timedelta(seconds=self._attempt_timeout)
        options: dict[str, Any] = {"connect_timeout": timeout, "read_timeout": timeout}
        if endpoint.startswith("http://"):
            options["allow_http"] = True
        # One try: a failed read falls back to fsspec, which the store's policy retries
        # (obstore's own 10 retries over 3 minutes would run past the deadline).
        common: dict[str, Any] = {"client_options": options, "retry_config": {"max_retries": 0}}
        if self._protocol in ("gs", "gcs"):
            return GCSStore(bucket, **common, **config)
        if self._protocol in ("az", "abfs", "abfss"):
            return AzureStore(bucket, **common, **config)
        return S3Store(bucket, **common, **config)

    def read_ranges(
        self, paths: list[str], starts: list[int], ends: list[int], *, views: bool = False
    ) -> list[bytes | memoryview]:
        """One ``get_ranges`` per object, all its ranges concurrently; results in order
        (``views``: memoryviews of obstore's buffers, no copy; else ``bytes``).

        Exactly the ranges asked for are requested (``coalesce=0``): the caller planned them
        under its own read policy (the loader's ``coalesce`` and ``max_skim_fraction``), and
        obstore's default merges ranges up to 1 MiB apart, fetching the bytes between them
        (a 10% keyset read fetched 1.7x its bytes).

        The GETs run on obstore's runtime from this process's one event-loop thread: a caller
        thread only waits for the result. Driving each call from its own thread (obstore's
        blocking API) cost ~40% more client CPU per GB with 12 reads of 8 MiB in flight on
        SeaweedFS (0.78-0.92 vs 0.54-0.61 s/GB), CPU a loader worker's decoding thread needs."""
        import obstore

        by_object: dict[str, list[int]] = {}
        for i, path in enumerate(paths):
            by_object.setdefault(path, []).append(i)

        async def fetch() -> list[Any]:
            calls = []
            for path, idx in by_object.items():
                bucket, _, key = path.partition("/")
                calls.append(
                    obstore.get_ranges_async(
                        self._store(bucket),
                        key,
                        starts=[starts[i] for i in idx],
                        ends=[ends[i] for i in idx],
                        coalesce=0,
                    )
                )
            return list(await asyncio.gather(*calls))

        found = asyncio.run_coroutine_threadsafe(fetch(), _event_loop()).result()
        out: list[bytes | memoryview] = [b""] * len(paths)
        for idx, got in zip(by_object.values(), found, strict=True):
            for i, blob in zip(idx, got, strict=True):
                # A copy costs ~0.15-0.35 s of CPU per GB (benchmarks/s3_concurrency.py).
                out[i] = memoryview(blob) if views else bytes(blob)
        return out


_loop_lock = threading.Lock()
_loop: tuple[int, asyncio.AbstractEventLoop] | None = None  # (owning pid, loop)


def _event_loop() -> asyncio.AbstractEventLoop:
    """This process's event loop for obstore's async calls, run by one daemon thread (made
    again in a forked child, which inherits the loop object but not its thread)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="shardlake-obstore", daemon=True).start()
            _loop = (os.getpid(), loop)
        return _loop[1]
