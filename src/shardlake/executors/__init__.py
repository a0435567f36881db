"""Running tasks: the executor spec (``process``, ``thread``, ``inline``, ``dask://HOST:PORT`` or
an Executor) and the task runner pack and the lifecycle operations share (:mod:`.tasks`)."""

__all__: list[str] = []
