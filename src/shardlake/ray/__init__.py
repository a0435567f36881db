"""Ray integration: read a version into a ``ray.data.Dataset``.

``shardlake.ray.read(root, version=..., keyset=..., where=..., columns=...)`` streams a selection
with one read task per shard range: coalesced ranged reads, every payload checked against its
manifest CRC-32 (re-read on a mismatch), as the loader reads. Writes go through
:meth:`shardlake.Root.write_ray`, and pack and the read passes take ``executor="ray"``.
"""

from __future__ import annotations

from .datasource import read

__all__ = ["read"]
