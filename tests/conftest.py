"""Shared fixtures: run any test on every store backend (see shardlake.testing.pytest_plugin)."""

import os

# Off unless a test turns it on: request counts must not depend on what an earlier test (or
# the user's ~/.cache) left in the node-local catalog cache (tests/test_catalog_cache.py).
os.environ["SHARDLAKE_CATALOG_CACHE"] = "off"

pytest_plugins = ["shardlake.testing.pytest_plugin"]
