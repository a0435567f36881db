"""obstore (Rust ``object_store``) as the client for S3 reads: the default where it is installed.

``storage_options={"read_client": "s3fs"}`` keeps every read on s3fs; ``"obstore"`` asks for it
explicitly (it is the default on ``s3://`` whenever the ``obstore`` package imports). gs:// and
az:// reads stay on their fsspec clients (no obstore layer for them yet).

Measured against one loopback S3 server (``benchmarks/obstore_eval.py``, docs/performance.md),
obstore fetches several times faster than s3fs with a fraction of the client CPU per GB. Only
*reads* go through it; writes, conditional creates, listings and multipart clean-up stay on s3fs,
so every write-side guarantee of the store is unchanged. A read obstore cannot answer plainly
(a range past the object's end, an unexpected error after obstore's own retries) falls back to
the s3fs path, which gives the store's documented semantics and error translation.

obstore's tokio runtime does not survive ``fork`` (a forked child that inherits a started runtime
hangs; obstore documents no fork support). So obstore is used only in processes that did not
inherit a started runtime: a child forked after its parent used obstore reads through s3fs. Only
ranged multi-reads (``read_ranges``: the loader's payload reads) use obstore, so a training
process that opens datasets and then forks DataLoader workers leaves the runtime to the workers.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from typing import Any

READ_CLIENT_OPTION = "read_client"
READ_CLIENTS = ("s3fs", "obstore")
_runtime_pid: int | None = None  # the process that started obstore's runtime (fork-inherited)
_OBSTORE_PROTOCOLS = ("s3", "s3a")


def default_read_client(protocol: str) -> str:
    """``"obstore"`` for S3 where the ``obstore`` package is installed, else ``"s3fs"``.

    Only the package's presence is checked (no import: that would start nothing, but costs
    ~30 ms per process); an obstore that fails at read time falls back to s3fs anyway.
    """
    if protocol not in _OBSTORE_PROTOCOLS:
        return "s3fs"
    import importlib.util

    try:
        found = importlib.util.find_spec("obstore") is not None
    except (ImportError, ValueError):
        found = False
    return "obstore" if found else "s3fs"


def _s3_config(options: dict[str, Any]) -> dict[str, Any]:
    """obstore ``S3Store`` keywords from s3fs-style storage options (unknown ones ignored)."""
    client = options.get("client_kwargs") or {}
    endpoint = options.get("endpoint_url") or client.get("endpoint_url")
    config: dict[str, Any] = {}
    if options.get("key"):
        config["access_key_id"] = options["key"]
    if options.get("secret"):
        config["secret_access_key"] = options["secret"]
    if options.get("token"):
        config["session_token"] = options["token"]
    if endpoint:
        config["endpoint"] = endpoint
    region = client.get("region_name") or options.get("region_name")
    if region:
        config["region"] = region
    if options.get("anon"):
        config["skip_signature"] = True
    return config


class ObstoreReads:
    """Ranged and whole-object GETs for ``bucket/key`` paths through obstore (one client per
    bucket, made lazily: the backend is rebuilt in every process)."""

    def __init__(self, storage_options: dict[str, Any], attempt_timeout: float = 30.0) -> None:
        self._config = _s3_config(storage_options)
        self._attempt_timeout = attempt_timeout
        self._stores: dict[str, Any] = {}
        self._lock = threading.Lock()

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
                from obstore.store import S3Store

                endpoint = str(self._config.get("endpoint", ""))
                timeout = timedelta(seconds=self._attempt_timeout)
                options: dict[str, Any] = {"connect_timeout": timeout, "read_timeout": timeout}
                if endpoint.startswith("http://"):
                    options["allow_http"] = True
                # One try: a failed read falls back to s3fs, which the store's policy retries
                # (obstore's own 10 retries over 3 minutes would run past the deadline).
                found = S3Store(
                    bucket,
                    client_options=options,  # type: ignore[arg-type]
                    retry_config={"max_retries": 0},
                    **self._config,
                )
                self._stores[bucket] = found
            return found

    def read_ranges(
        self, paths: list[str], starts: list[int], ends: list[int], *, views: bool = False
    ) -> list[bytes | memoryview]:
        """One ``get_ranges`` call per object, all its ranges concurrently; results in order
        (``views``: memoryviews of obstore's buffers, no copy; else ``bytes``)."""
        import obstore

        by_object: dict[str, list[int]] = {}
        for i, path in enumerate(paths):
            by_object.setdefault(path, []).append(i)
        out: list[bytes | memoryview] = [b""] * len(paths)
        for path, idx in by_object.items():
            bucket, _, key = path.partition("/")
            got = obstore.get_ranges(
                self._store(bucket),
                key,
                starts=[starts[i] for i in idx],
                ends=[ends[i] for i in idx],
            )
            for i, blob in zip(idx, got, strict=True):
                # A copy costs ~0.15-0.35 s of CPU per GB (benchmarks/s3_concurrency.py).
                out[i] = memoryview(blob) if views else bytes(blob)
        return out
