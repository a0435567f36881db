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

from ..endpoint import configured_endpoint
from ..redact import redact
from .options import READ_CLIENT_OPTION
from .registry import backend_class

__all__ = [
    "FSSPEC",
    "OBSTORE",
    "ObstoreReads",
    "ReadClientWarning",
    "obstore_config",
    "obstore_config_or_reason",
    "obstore_installed",
    "warn_fallback",
]

OBSTORE = "obstore"
FSSPEC = "fsspec"
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
    client = backend_class(protocol).fsspec_client or FSSPEC
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
    """:func:`obstore_config`, or why obstore cannot serve (for the fall-back's warning); the
    backend of ``protocol`` says (``Backend.obstore_config``), with the endpoint its fsspec
    client uses."""
    cls = backend_class(protocol)
    if cls.fsspec_client is None:
        return f"obstore does not read {protocol}://"
    return cls.obstore_config(options, configured_endpoint(protocol, options))


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

    def warn(self, reason: str) -> None:
        """Say (once per process) why this read falls back to the fsspec client."""
        warn_fallback(self._protocol, reason)

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
        config = self._config
        endpoint = str(config.get("endpoint") or config.get("base_url") or "")
        timeout = timedelta(seconds=self._attempt_timeout)
        options: dict[str, Any] = {"connect_timeout": timeout, "read_timeout": timeout}
        if endpoint.startswith("http://"):
            options["allow_http"] = True
        # One try: a failed read falls back to fsspec, which the store's policy retries
        # (obstore's own 10 retries over 3 minutes would run past the deadline).
        common: dict[str, Any] = {"client_options": options, "retry_config": {"max_retries": 0}}
        return backend_class(self._protocol).obstore_store(bucket, config, common)

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
