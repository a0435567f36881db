"""Tools built on the library, apart from its core: demo, synthetic corpora, benchmarks,
training-run comparison."""

__all__: list[str] = []
