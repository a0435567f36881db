"""Benchmarks as library code: pack throughput + cost model, loader throughput (``shardlake bench``)."""

__all__: list[str] = []
