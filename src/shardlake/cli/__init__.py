"""The ``shardlake`` command line; one module per command group."""
