"""Partition builds on a cluster, published once by the driver (``write_bag``, ``write_ray``).

The cluster's tasks group encoded records by partition and build each revision with pack's
:func:`~shardlake.pack.build.build_revision`, writing shards and manifest straight to the store;
only each partition's small :class:`~shardlake.pack.build.BuildResult` returns to the driver, which
publishes one version under its writer lease, and only once every partition built and verified.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import IntegrityError, ObjectsGoneError, ShardlakeError, SourceError
from ..format.layout import partition_id
from ..meta.leases import Lease, gone_error
from ..store import Store
from .build import BuildResult, EncodedSample, Recipe, RevisionSource, build_revision
from .packer import PackReport
from .samples import EncodedRecord
from .written import WriteOptions, WriteSettings, publish_written

__all__ = ["Refused", "build_group", "build_group_or_refuse", "publish_builds"]


@dataclass(frozen=True)
class Refused:
    """A partition build that refused its input (a duplicate key, a bad record): an error no
    retry can change. The task returns it instead of raising, so the cluster neither retries
    the task nor logs a traceback per attempt; the driver raises it, once."""

    error: ShardlakeError


def build_group_or_refuse(
    group: tuple[str, Iterable[EncodedRecord]], store: Store, recipe: Recipe, what: str
) -> BuildResult | Refused:
    """:func:`build_group`, with its deterministic errors returned as :class:`Refused`: shardlake
    errors that are also ``ValueError`` (usage, source, format). Store errors still raise, and
    the cluster retries those."""
    try:
        return build_group(group, store, recipe, what)
    except ShardlakeError as exc:
        if isinstance(exc, ValueError):
            return Refused(exc)
        raise


def build_group(
    group: tuple[str, Iterable[EncodedRecord]], store: Store, recipe: Recipe, what: str
) -> BuildResult:
    """One partition's revision from its encoded records (``what`` names the input in a
    duplicate-key message)."""
    path, records = group
    included: list[tuple[str, str]] = []
    sidecars: dict[str, dict[str, Any] | None] = {}
    payloads: dict[str, tuple[bytes, int]] = {}
    seen: set[str] = set()
    skipped = 0
    for record in records:
        if record.key in seen:
            raise SourceError(f"sample {record.key!r}: duplicate key in {what}")
        seen.add(record.key)
        if record.payload is None:
            skipped += 1
            continue
        included.append((record.key, record.sha256))
        sidecars[record.key] = record.sidecar
        payloads[record.key] = (record.payload, record.raw_size)

    def encoded(order: list[str]) -> Iterator[EncodedSample]:
        for key in order:
            payload, raw_size = payloads.pop(key)
            yield EncodedSample(key, payload, raw_size)

    source = RevisionSource(partition_id(path), path, included, sidecars, skipped)
    return build_revision(store, recipe, source, encoded, where=f"partition {path}")


def publish_builds(
    store: Store,
    tag: str,
    compute: Callable[[], Iterable[BuildResult | Refused]],
    settings: WriteSettings,
    opts: WriteOptions,
    started: float,
    lease: Lease,
    *,
    empty: str,
) -> PackReport:
    """Run the cluster's builds (``compute``) and publish ``tag`` once every partition built;
    ``empty`` says why an input without records publishes nothing."""
    try:
        done = list(compute())
    except ObjectsGoneError as exc:  # a build's objects were removed under it
        raise gone_error(store, exc.missing, since_seq=settings.state.seq, lease=lease) from exc
    refused = [r.error for r in done if isinstance(r, Refused)]
    if refused:
        raise refused[0]
    results = [r for r in done if not isinstance(r, Refused)]
    if not results:
        raise SourceError(f"{lease.op} {tag!r}: {empty} (an empty write); nothing was published")
    for result in results:
        entry = result.entry
        if len(entry.shards) == 0 and entry.samples:
            raise IntegrityError(f"partition {entry.path!r}: built without shards")
    return publish_written(
        store,
        tag,
        settings,
        results,
        keep_skipped=opts.keep_skipped,
        skipped=sum(r.skipped for r in results),
        started=started,
        lease=lease,
    )
