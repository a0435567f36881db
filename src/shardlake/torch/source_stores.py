"""Routing a mix's shard reads to the store of each source."""

from __future__ import annotations

from collections.abc import Sequence

from ..store import Store

__all__ = ["SourceStores"]


class SourceStores:
    """The stores of a mix behind the two calls a slot reader makes.

    Shard keys of the combined table are ``"<source index>:<key>"``; each read is routed to its
    source's store (ranges keep their order).
    """

    def __init__(self, stores: Sequence[Store]) -> None:
        self.stores = list(stores)

    @property
    def url(self) -> str:
        return " + ".join(s.url for s in self.stores)

    def store_of(self, key: str) -> tuple[Store, str]:
        """The store a prefixed key is in, and its key there."""
        return self._split(key)

    def _split(self, key: str) -> tuple[Store, str]:
        index, _, inner = key.partition(":")
        return self.stores[int(index)], inner

    def key_url(self, key: str) -> str:
        store, inner = self._split(key)
        return store.key_url(inner)

    def read_ranges(
        self, ranges: Sequence[tuple[str, int, int]], *, views: bool = False
    ) -> list[bytes | memoryview]:
        by_store: dict[int, list[int]] = {}
        for i, (key, _s, _e) in enumerate(ranges):
            by_store.setdefault(int(key.partition(":")[0]), []).append(i)
        out: list[bytes | memoryview] = [b""] * len(ranges)
        for index, members in by_store.items():
            parts = [(ranges[i][0].partition(":")[2], ranges[i][1], ranges[i][2]) for i in members]
            got = self.stores[index].read_ranges(parts, views=views)
            for i, data in zip(members, got, strict=True):
                out[i] = data
        return out
