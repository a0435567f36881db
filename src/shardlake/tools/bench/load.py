"""``shardlake bench load``: the training loader against any root URL, as a training box sees it.

Measures, for one rank's share of a selection (``--world-size``/``--rank`` simulate a bigger
job): samples/s and MB/s (decoded tensors and compressed payload), time to first batch (from
opening the version to holding a batch: manifests, plan, worker start, first reads), peak RSS of
the process tree (the DataLoader workers included), bytes fetched from the store and requests
made (every store request is logged, across worker processes), and how well batches mix
partitions (mean/p95 Jensen-Shannon distance of each batch's partition histogram to the
selection's, from the plan). With ``--cache-dir`` the loader keeps fetched payloads in a local
epoch cache; ``epoch_samples_per_s`` shows each epoch's rate (the second one from the cache).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import UsageError
from ...progress.bar import Progress
from .measure import (
    MB,
    MemorySampler,
    decode_cpu_s_per_sample,
    machine_info,
    process_tree_cpu_s,
    rate,
)

__all__ = ["bench_load"]

# Printed with every result: the two rates differ by what they count (start-up or not).
RATE_DEFINITIONS = {
    "samples_per_s": "steady rate: samples after the first batch over the time after it, all "
    "epochs together (start-up excluded)",
    "epoch_samples_per_s": "each epoch's samples over that epoch's whole wall time, its start-up "
    "included (worker start, plan, first reads); lower than samples_per_s on short epochs",
}


def bench_load(
    url: str,
    *,
    version: str | None = None,
    keyset: str | None = None,
    where: str | None = None,
    batch_size: int = 32,
    num_workers: int = 2,
    max_batches: int | None = None,
    epochs: int = 1,
    seed: int = 0,
    world_size: int = 1,
    rank: int = 0,
    max_pad_fraction: float | None = None,
    count_bytes: bool = True,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | None = None,
    cache_bytes: int | None = None,
    progress: bool | None = None,
    engine: str | None = None,
) -> dict[str, Any]:
    """Iterate the loader and measure it; returns the JSON document ``bench load`` prints.

    ``progress``: batches on standard error (None: only on a terminal; stdout holds the JSON).
    ``engine``: the loader's engine (None: its default); ``"both"`` measures the default
    engine and then the other one, and adds ``engines``: both side by side (issue #31).
    """
    if engine == "both":
        from ...torch.options import ENGINES, LoaderOptions

        first = LoaderOptions().resolved_engine
        order = [first, *(e for e in ENGINES if e != first)]
        docs = {
            e: bench_load(
                url,
                version=version,
                keyset=keyset,
                where=where,
                batch_size=batch_size,
                num_workers=num_workers,
                max_batches=max_batches,
                epochs=epochs,
                seed=seed,
                world_size=world_size,
                rank=rank,
                max_pad_fraction=max_pad_fraction,
                count_bytes=count_bytes,
                storage_options=storage_options,
                cache_dir=cache_dir,
                cache_bytes=cache_bytes,
                progress=progress,
                engine=e,
            )  # fmt: skip
            for e in order
        }
        both = docs[first]
        both["engines"] = {e: engine_summary(d) for e, d in docs.items()}
        both["engines"][f"{order[0]} / {order[1]} samples/s"] = round(
            docs[order[0]]["samples_per_s"] / max(docs[order[1]]["samples_per_s"], 1e-9), 3
        )
        return both
    from ...torch import ShardDataset
    from ...torch.plan_types import DEFAULT_MAX_PAD_FRACTION
    from .mixing import mixing_summary

    _check_options(batch_size, num_workers, epochs, max_batches)
    mem = MemorySampler().start()
    log_fd, log_path = tempfile.mkstemp(prefix="shardlake-bench-requests-", suffix=".jsonl")
    os.close(log_fd)
    try:
        store = _open_store(url, storage_options, log_path if count_bytes else None)
        t_open = time.perf_counter()
        ds = ShardDataset(
            store,
            version,
            keyset=keyset,
            where=where,
            batch_size=batch_size,
            seed=seed,
            num_workers=num_workers,
            engine=engine,
            world_size=world_size,
            rank=rank,
            max_pad_fraction=DEFAULT_MAX_PAD_FRACTION
            if max_pad_fraction is None
            else max_pad_fraction,
            cache_dir=cache_dir,
            cache_bytes=cache_bytes,
        )
        t_opened = time.perf_counter()
        mixing = mixing_summary(ds, num_workers=num_workers, rank=rank)
        selection_payload = int(ds.table.size.sum())
        loader = ds.loader()

        def client_cpu() -> float:
            # Main process + DataLoader workers (live or reaped), less the memory sampler's own
            # CPU (it reads every process's smaps).
            return process_tree_cpu_s(live=True) - mem.cpu_s

        cpu0 = client_cpu()
        run = _iterate(loader, epochs, max_batches, (t_open, t_opened), progress, client_cpu)
        loader_cpu = client_cpu() - cpu0
        mem.stop()
        # Payload of the yielded samples, estimated from the selection's mean member size.
        payload = selection_payload / max(1, len(ds.table)) * run.samples
        result: dict[str, Any] = {
            "benchmark": "load",
            "machine": machine_info(),
            "url": url,
            **_selection_fields(ds, selection_payload),
            "world_size": world_size,
            "rank": rank,
            "num_workers": num_workers,
            "engine": ds.engine,
            "batch_size": batch_size,
            **run.to_json(t_open, t_opened, payload),
            "cache_dir": cache_dir,
            "peak_rss_mb": round(mem.peak_rss / MB, 1),
            "peak_pss_mb": round(mem.peak_pss / MB, 1),
            # Whole process tree (interpreter and torch included) over the selected samples.
            "peak_pss_b_per_sample": round(mem.peak_pss / max(1, len(ds.table)), 1),
            "mixing": mixing,
        }
        if count_bytes:
            result.update(_request_fields(log_path, payload))
        result["goals"] = load_goals(
            result, ds, loader_cpu / max(1, run.samples), run.epoch_cpu_ms_per_sample
        )
        return result
    finally:
        mem.stop()
        os.unlink(log_path)


def engine_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """One engine's figures of a ``bench load`` document, for ``engines``."""
    goals = doc.get("goals", {})
    return {
        "samples_per_s": doc["samples_per_s"],
        "epoch_samples_per_s": doc["epoch_samples_per_s"],
        "client_cpu_ms_per_sample": goals.get("client_cpu_ms_per_sample"),
        "loader_vs_decode_limit": goals.get("loader_vs_decode_limit"),
        "time_to_first_batch_s": doc["time_to_first_batch_s"],
        "peak_pss_mb": doc["peak_pss_mb"],
        "peak_pss_b_per_sample": doc["peak_pss_b_per_sample"],
    }


def _check_options(batch_size: int, num_workers: int, epochs: int, max_batches: int | None) -> None:
    if batch_size < 1 or num_workers < 0 or epochs < 1:
        raise UsageError("--batch-size and --epochs must be >= 1, --num-workers >= 0")
    if max_batches is not None and max_batches < 1:
        raise UsageError("--max-batches must be >= 1")


def _selection_fields(ds: Any, selection_payload: int) -> dict[str, Any]:
    return {
        "version": ds.version_tag,
        "version_hash": ds.version_hash,
        "selection": ds.selection_desc,
        "selected_samples": len(ds.table),
        "selected_payload_mb": round(selection_payload / MB, 3),
    }


def _open_store(url: str, storage_options: dict[str, Any] | None, log_path: str | None) -> Any:
    """The root's store; with ``log_path``, every request of every process (DataLoader workers
    too) appends one JSON line there."""
    from ...root import as_store
    from ...store import RequestCounter

    store = as_store(url, storage_options, name="bench load ROOT")
    return store if log_path is None else store.with_layers(RequestCounter(log_path))


@dataclass
class _Iteration:
    """Counters of one loader run; the first batch's share is kept apart (it is start-up)."""

    batches: int = 0
    samples: int = 0
    decoded: int = 0
    first_samples: int = 0
    first_decoded: int = 0
    first_batch_s: float | None = None
    seconds: float = 0.0
    epoch_rates: list[float] = field(default_factory=list)
    epoch_cpu_ms_per_sample: list[float] = field(default_factory=list)

    def to_json(self, t_open: float, t_opened: float, payload: float) -> dict[str, Any]:
        after_first = self.samples - self.first_samples
        return {
            "batches": self.batches,
            "samples": self.samples,
            "seconds": round(self.seconds, 3),
            "open_seconds": round(t_opened - t_open, 3),
            "time_to_first_batch_s": round(self.first_batch_s or 0.0, 3),
            "samples_per_s": rate(after_first, self.seconds),
            "decoded_mb_per_s": rate((self.decoded - self.first_decoded) / MB, self.seconds),
            "payload_mb_per_s": rate(
                payload * after_first / max(1, self.samples) / MB, self.seconds
            ),
            "epoch_samples_per_s": self.epoch_rates,
            "epoch_client_cpu_ms_per_sample": self.epoch_cpu_ms_per_sample,
            "definitions": RATE_DEFINITIONS,
        }


def _iterate(
    loader: Any,
    epochs: int,
    max_batches: int | None,
    opened: tuple[float, float],
    progress: bool | None,
    cpu: Callable[[], float],
) -> _Iteration:
    """Iterate ``epochs`` epochs (at most ``max_batches`` batches), counting as it goes; rates
    exclude the first batch, whose cost is start-up (time to first batch, from opening the
    dataset: ``opened`` is when that began and ended). ``cpu()``: the client's CPU seconds so
    far, read around each epoch for its CPU per sample (worker start-up included)."""
    import torch

    t_open, t_first = opened
    run = _Iteration()
    planned = len(loader) * epochs
    total = planned if max_batches is None else min(planned, max_batches)
    bar = Progress(total, "bench load", unit="batches", enabled=progress)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        if hasattr(loader, "prefetch_next_epoch"):
            # No epoch follows the last one: its prefetch would be reads counted for nothing.
            loader.prefetch_next_epoch = epoch + 1 < epochs
        t_epoch, epoch_samples, cpu_epoch = time.perf_counter(), run.samples, cpu()
        for batch in loader:
            if run.first_batch_s is None:
                t_first = time.perf_counter()
                run.first_batch_s = t_first - t_open
            run.batches += 1
            bar.update()
            run.decoded += sum(v.nbytes for v in batch.values() if isinstance(v, torch.Tensor))
            run.samples += len(next(iter(batch.values())))
            if run.batches == 1:
                run.first_samples, run.first_decoded = run.samples, run.decoded
            if max_batches is not None and run.batches >= max_batches:
                break
        run.epoch_rates.append(rate(run.samples - epoch_samples, time.perf_counter() - t_epoch))
        epoch_n = run.samples - epoch_samples
        run.epoch_cpu_ms_per_sample.append(round((cpu() - cpu_epoch) / max(1, epoch_n) * 1e3, 3))
        if max_batches is not None and run.batches >= max_batches:
            break
    run.seconds = time.perf_counter() - t_first
    bar.close()
    return run


def _request_fields(log_path: str, payload: float) -> dict[str, Any]:
    """Bytes fetched and requests made, from the request log."""
    from ...store.layers import summarize_request_log

    log = summarize_request_log(log_path)
    fetched = int(log["bytes_read"])
    clients: dict[str, int] = log["by_client"]
    return {
        # The client that served the payload reads (obstore, fsspec, local; "mixed": see
        # read_clients, reads per client over every process).
        "read_client": (next(iter(clients)) if len(clients) == 1 else "mixed") if clients else None,
        "read_clients": clients,
        "bytes_fetched": fetched,
        "requests": log["requests"],
        "requests_by_op": log["by_op"],
        # > 1: reads beyond the members (tar headers skimmed, manifests); ~1: exact.
        "fetched_per_payload": round(fetched / payload, 3) if payload else None,
    }


def load_goals(
    result: dict[str, Any],
    ds: Any,
    loader_cpu_s: float,
    epoch_cpu_ms: Sequence[float] = (),
) -> dict[str, Any]:
    """Issue #14's and #21's loader goals, measured here: decode limit, client CPU, request size.

    The decode limit is zstd + safetensors decoding of the selection's payloads (already in
    memory) on every core of this machine; ``decode_share_of_loader_cpu`` is the fraction of the
    loader's CPU per sample (main process and workers) that decoding needs.
    ``client_cpu_ms_per_sample`` is that CPU (rusage of this process and its reaped workers, plus
    psutil's count for workers still running) over the whole run, beside ``samples_per_s``;
    ``epoch_client_cpu_ms_per_sample`` per epoch (worker start-up included). Compare a local and
    an S3 run of the same version (``benchmarks/load.py --s3`` does, in one run: goal S3 / local
    <= 1.3).
    """
    decode_s = decode_cpu_s_per_sample(ds.store, ds.table)
    cores = os.cpu_count() or 1
    limit = cores / decode_s if decode_s > 0 else None
    goals: dict[str, Any] = {
        "decode_limit_samples_per_s": round(limit, 1) if limit else None,
        "store": _store_kind(str(result.get("url", ""))),
        "samples_per_s": result["samples_per_s"],
        "loader_cpu_ms_per_sample": round(loader_cpu_s * 1e3, 3),
        "client_cpu_ms_per_sample": round(loader_cpu_s * 1e3, 3),
        "epoch_samples_per_s": result.get("epoch_samples_per_s", []),
        "epoch_client_cpu_ms_per_sample": list(epoch_cpu_ms),
        "decode_cpu_ms_per_sample": round(decode_s * 1e3, 3),
        "decode_share_of_loader_cpu": round(decode_s / loader_cpu_s, 3) if loader_cpu_s else None,
        "loader_vs_decode_limit": round(result["samples_per_s"] / limit, 3) if limit else None,
        "loader_vs_decode_limit_goal": 0.75,
    }
    reads = sum(n for op, n in result.get("requests_by_op", {}).items() if op.startswith("read"))
    if reads:
        goals["mean_mb_per_request"] = round(result["bytes_fetched"] / reads / MB, 3)
        goals["mean_mb_per_request_goal"] = 4.0
    return goals


def _store_kind(url: str) -> str:
    """``s3``, ``gs``, ... for a remote root URL; ``local`` for a path or file:// URL."""
    scheme = url.split("://", 1)[0] if "://" in url else "file"
    return "local" if scheme == "file" else scheme
