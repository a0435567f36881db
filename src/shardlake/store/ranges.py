"""Ranged reads that complete: each attempt re-reads only the ranges still missing, and a range
cut short in transit is read again.
"""

from __future__ import annotations

from ..errors import TransientStoreError, UsageError
from ..progress.bar import plural
from .backends import Backend

__all__ = [
    "RangeBatch",
    "check_range",
]


class RangeBatch:
    """Ranges read until every one is complete; each attempt re-reads only the missing ones.

    A body cut short in transit behind a matching Content-Length looks complete to the HTTP
    layer, so a range shorter than the object allows (one not ending at the object's end)
    raises a transient error and is read again.
    """

    def __init__(
        self,
        paths: list[str],
        starts: list[int],
        ends: list[int],
        *,
        multi: bool = False,
        views: bool = False,
    ) -> None:
        # ``multi``: a ``read_ranges`` call, which a backend with a faster multi-read client
        # (obstore on S3, GCS, Azure) answers even for one range; ``read_range`` keeps the plain client.
        # ``views``: the caller takes the client's own buffers (see Store.read_ranges).
        self.paths, self.starts, self.ends, self.multi = paths, starts, ends, multi
        self.views = views
        self.done: dict[int, bytes | memoryview] = {}

    def __call__(self, backend: Backend) -> list[bytes | memoryview]:
        todo = [i for i in range(len(self.paths)) if i not in self.done]
        paths = [self.paths[i] for i in todo]
        starts = [self.starts[i] for i in todo]
        ends = [self.ends[i] for i in todo]
        found: list[bytes | memoryview]
        if len(todo) == 1 and not (self.multi and backend.batches_single_ranges()):
            found = [backend.read_range(paths[0], starts[0], ends[0])]
        else:
            found = backend.read_ranges(paths, starts, ends, views=self.views)
        sizes: dict[str, int] = {}
        short: str | None = None
        for i, path, start, end, data in zip(todo, paths, starts, ends, found, strict=True):
            if len(data) < end - start:
                if path not in sizes:
                    sizes[path] = backend.stat(path)[0]
                expected = max(0, min(end, sizes[path]) - start)
                if len(data) != expected:
                    short = f"short read of {path} [{start}, {end}): {len(data)} of {plural(expected, 'byte')}"
                    continue
            self.done[i] = data
        if short is not None:
            raise TransientStoreError(short)
        return [self.done[i] for i in range(len(self.paths))]


def check_range(key: str, start: int, end: int) -> None:
    if not isinstance(start, int) or not isinstance(end, int) or start < 0 or end < start:
        raise UsageError(
            f"invalid byte range [{start}, {end}) for key {key!r}: need 0 <= start <= end"
        )
