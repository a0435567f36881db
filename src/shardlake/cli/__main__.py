"""``python -m shardlake.cli``: the ``shardlake`` command (see :func:`shardlake.cli.run`)."""

from . import run

__all__: list[str] = []

if __name__ == "__main__":
    run()
