"""How payloads are read: the I/O knobs every payload reader takes (the loader's slot readers)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..options import options_class

__all__ = [
    "DEFAULT_REQUEST_BYTES",
    "ReadOptions",
]

MiB = 1 << 20
DEFAULT_REQUEST_BYTES = 8 * MiB


@options_class
@dataclass(frozen=True)
class ReadOptions:
    """I/O knobs of a slot reader.

    ``request_bytes`` is the target size of one ranged GET (AWS recommends 8-16 MB ranges); the
    loader cuts the plan's chunks to about this much payload, so a worker holds about
    ``interleave * request_bytes`` of payload while it reads ``interleave`` chunks at a time.
    Left at ``None``, the target is :data:`DEFAULT_REQUEST_BYTES` (plan shape 2; shape 1, kept
    for states saved before it, held a shuffled chunk to ``DEFAULT_CHUNK_SIZE`` samples) and a
    small epoch gets shorter runs so that every slot has several; set it to get requests of that
    size whatever the epoch. ``max_buffer_bytes`` bounds the read-ahead: payload fetched (or
    being fetched) for runs that have not opened yet.
    ``max_skim_fraction`` bounds the unselected bytes a coalesced request reads over, relative
    to its selected bytes; gaps up to ``skim_gap`` (tar headers between consecutive members) are
    always read over. ``max_inflight`` chunk fetches run at once: by default enough to sustain
    ``target_bytes_per_s`` at ``connection_bytes_per_s`` per connection.
    """

    request_bytes: int | None = None
    max_skim_fraction: float = 0.1
    skim_gap: int = 8 * 1024
    target_bytes_per_s: float = 1e9  # per worker
    connection_bytes_per_s: float = 85e6  # one S3 connection, AWS guidance
    inflight: int | None = None  # override the derived max_inflight
    max_buffer_bytes: int = 256 * MiB  # payload read ahead of the runs being emitted

    @property
    def max_inflight(self) -> int:
        if self.inflight is not None:
            return max(1, self.inflight)
        derived = math.ceil(self.target_bytes_per_s / max(1.0, self.connection_bytes_per_s))
        return max(2, min(32, derived))
