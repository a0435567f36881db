"""Storage options, parsed once per store: the filesystem's, and shardlake's own.

:meth:`StoreConfig.parse` is the one place storage options are read. shardlake's own options
(``read_client``, ``retry_deadline``, ``retry_attempt_timeout``; the one list is
``backends.options.SHARDLAKE_OPTIONS``) are taken out and checked, the rest is handed to the
fsspec filesystem, and the custom endpoint the protocol's client will use is found (the
options, then the environment: :func:`endpoint.configured_endpoint`). ``open_store`` parses
once per store; a pickled store parses again where it lands, in the environment its client
reads there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import UsageError
from .backends import obstore
from .backends.base import Backend, BucketBackend
from .backends.obstore import FSSPEC, OBSTORE
from .backends.options import (
    READ_CLIENT_OPTION,
    RETRY_ATTEMPT_TIMEOUT_OPTION,
    RETRY_DEADLINE_OPTION,
    SHARDLAKE_OPTIONS,
    check_storage_options,
)
from .backends.registry import backend_class, check_protocol, is_builtin
from .endpoint import Endpoint, check_endpoint, configured_endpoint, endpoint_key
from .retry import RetryPolicy

__all__ = ["StoreConfig", "make_backend"]


@dataclass(frozen=True)
class StoreConfig:
    """A store's storage options, parsed: what its filesystem gets, how its requests are
    retried, which client reads, and the endpoint its client talks to."""

    protocol: str
    # Handed to the fsspec filesystem (never shardlake's own options); not to be mutated.
    fs_options: dict[str, Any] = field(default_factory=dict, hash=False)
    # "obstore", "fsspec" or the protocol's fsspec client by name; None: obstore where it can.
    read_client: str | None = None
    retry_deadline: float | None = None  # seconds; None: the policy's own
    retry_attempt_timeout: float | None = None
    # The custom endpoint (options, then environment); None: the client's default.
    endpoint: Endpoint | None = None

    @classmethod
    def parse(cls, protocol: str, options: Mapping[str, Any] | None) -> StoreConfig:
        """Split and check ``options`` (the storage options given with a ``protocol`` URL)."""
        given = dict(options or {})
        fs_options = {k: v for k, v in given.items() if k not in SHARDLAKE_OPTIONS}
        return cls(
            protocol=protocol,
            fs_options=fs_options,
            read_client=_read_client(protocol, given.get(READ_CLIENT_OPTION)),
            retry_deadline=_seconds(given, RETRY_DEADLINE_OPTION),
            retry_attempt_timeout=_seconds(given, RETRY_ATTEMPT_TIMEOUT_OPTION),
            endpoint=configured_endpoint(protocol, fs_options),
        )

    def retry_policy(self, base: RetryPolicy) -> RetryPolicy:
        """``base`` with this store's ``retry_deadline`` / ``retry_attempt_timeout``."""
        if self.retry_deadline is not None:
            base = replace(base, deadline=self.retry_deadline)
        if self.retry_attempt_timeout is not None:
            base = replace(base, attempt_timeout=self.retry_attempt_timeout)
        return base

    def travelling_options(self) -> dict[str, Any]:
        """The options a copy of the store is opened with (pickled, or a twin): all but the
        retry settings, which travel as the store's :class:`RetryPolicy`."""
        out = dict(self.fs_options)
        if self.read_client is not None:
            out[READ_CLIENT_OPTION] = self.read_client
        return out

    def endpoint_id(self, root: str) -> str:
        """Which server the store's requests go to (:func:`endpoint.endpoint_key`)."""
        return endpoint_key(self.protocol, self.endpoint, root)


def _seconds(options: Mapping[str, Any], name: str) -> float | None:
    if name not in options:
        return None
    try:
        return float(options[name])
    except (TypeError, ValueError):
        raise UsageError(f"storage option {name}={options[name]!r}: expected seconds") from None


def _read_client(protocol: str, given: Any) -> str | None:
    """``read_client`` checked against the clients that can read ``protocol``."""
    if given is None:
        return None
    own = backend_class(protocol).fsspec_client
    choices = [OBSTORE, FSSPEC, *([own] if own else [])]
    if given not in choices:
        raise UsageError(
            f"storage option {READ_CLIENT_OPTION}={given!r} for {protocol}://: use one of "
            f"{', '.join(map(repr, choices))} ('obstore' reads s3://, gs:// and az:// stores)"
        )
    if given == OBSTORE and own is None:
        raise UsageError(
            f"storage option {READ_CLIENT_OPTION}={given!r}: 'obstore' reads s3://, gs:// and "
            "az:// stores only"
        )
    return str(given)


def make_backend(config: StoreConfig, root: str, policy: RetryPolicy) -> Backend:
    """The backend of ``config.protocol`` with a filesystem built from its options."""
    protocol = config.protocol
    check_protocol(protocol)
    check_endpoint(config.endpoint)
    cls = backend_class(protocol)
    storage_options = dict(config.fs_options)
    if is_builtin(cls):  # a registered backend's make_filesystem may take options of its own
        check_storage_options(protocol, storage_options)
    fast_config = _fast_read_config(config, cls)
    try:
        fs = cls.make_filesystem(protocol, storage_options, policy)
    except ImportError as exc:
        hint = (
            f"pip install 'shardlake[{cls.extra}]'" if cls.extra else "install its fsspec package"
        )
        raise UsageError(f"store protocol {protocol!r} needs a missing package: {hint}") from exc
    except TypeError as exc:
        # An unknown storage option; name it without echoing any values.
        raise UsageError(
            f"invalid storage_options for {protocol!r} (keys: {', '.join(sorted(storage_options))}): "
            f"{exc}"
        ) from None
    backend = cls(fs, root, policy)
    if isinstance(backend, BucketBackend):
        if isinstance(fast_config, dict):
            backend.fast_reads = obstore.ObstoreReads(protocol, fast_config, policy.request_timeout)
        elif fast_config is not None:  # said at the first read obstore would have served
            reason = fast_config
            backend.fast_reads_unavailable = lambda: obstore.warn_fallback(protocol, reason)
    return backend


def _fast_read_config(config: StoreConfig, cls: type[Backend]) -> dict[str, Any] | str | None:
    """obstore's store keywords when reads go through obstore; else why not where obstore was
    the default but cannot serve (a fall-back), or None.

    ``read_client`` unset: obstore where it is installed and the backend maps the options
    onto it (S3, GCS, Azure: ``Backend.obstore_config``), else the fsspec client.
    ``"obstore"``: obstore, or a clear error where it cannot serve. ``"fsspec"`` (or the
    protocol's fsspec client by name): the fsspec client."""
    read_client, protocol = config.read_client, config.protocol
    if read_client not in (None, OBSTORE) or cls.fsspec_client is None:
        return None  # StoreConfig.parse refused "obstore" for a backend it cannot read
    option = f"storage option {READ_CLIENT_OPTION}={read_client!r}"
    if not obstore.obstore_installed():
        if read_client == OBSTORE:
            raise UsageError(
                f"{option}: the obstore package is not installed (pip install obstore)"
            )
        return None
    found = cls.obstore_config(dict(config.fs_options), config.endpoint)
    if isinstance(found, dict):
        return found
    if read_client == OBSTORE:
        raise UsageError(
            f"{option}: obstore cannot sign for {protocol}:// with these storage options "
            f"(keys: {', '.join(sorted(config.fs_options))}): {found}; use read_client='fsspec'"
        )
    return found
