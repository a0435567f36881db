"""The on-disk format, pure and without I/O of its own: layout, codec, tar shards, manifests."""

__all__: list[str] = []
