"""Shared fixtures: run any test on every store backend (see shardlake.testing.pytest_plugin)."""

pytest_plugins = ["shardlake.testing.pytest_plugin"]
