"""A cold first rank's table set-up, phase by phase (issue #47): wall and CPU seconds of each.

One whole version of a root, as ``ShardDataset`` resolves it on a node's first rank (the
node-local catalog cache emptied first): open the version, read its catalog rows (the loader's
columns), build the loader columns (``SourceColumns.from_table``), hash the selection digest
(``key_digest``). The plan, the derived files and the first batch are not in it (``scale.py
--child`` times the whole start-up). Prints one JSON line: ``{phase: [wall s, CPU s]}``, the
peak RSS and the digest (the same on every code version: states saved with it resume)::

    PYTHONPATH=src .venv/bin/python benchmarks/coldstart.py /tmp/rankplan/work/local/n10000x2000

``--together``: instead, the loader's own path in one span (``select_rows(cached=True)`` then
``selection_key_digest``: the catalog read, the columns built and written to the node-local
cache, the digest, overlapping where the code overlaps them).

Run it with another checkout's ``src`` on ``PYTHONPATH`` to compare code versions.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from typing import Any

import numpy as np


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="a root (its version VERSION is read whole)")
    parser.add_argument("--version", default="v1")
    parser.add_argument("--together", action="store_true", help="the loader's path, one span")
    args = parser.parse_args(argv)
    cache = tempfile.mkdtemp(prefix="coldstart-cache-")
    os.environ["SHARDLAKE_CATALOG_CACHE"] = cache
    try:
        print(json.dumps((together if args.together else measure)(args.url, args.version)))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return 0


def together(url: str, version: str) -> dict[str, Any]:
    import shardlake.torch  # noqa: F401  (imports are not start-up)
    from shardlake.torch import sources

    wall, cpu = time.perf_counter(), time.process_time()
    rows = sources.select_rows(sources.MixMember(url, version), cached=True)
    digest = sources.selection_key_digest(rows)
    return {
        "set_up_s": [round(time.perf_counter() - wall, 2), round(time.process_time() - cpu, 2)],
        "rows": rows.rows,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10,
        "digest": digest,
    }


def measure(url: str, version: str) -> dict[str, Any]:
    import shardlake.torch  # noqa: F401  (imports are not start-up)
    from shardlake.meta.catalog_objects import node_catalog_cache
    from shardlake.query.dataset import Dataset
    from shardlake.store import open_store
    from shardlake.torch import source_rows, sources
    from shardlake.torch.strings import key_digest

    out: dict[str, Any] = {}
    clock = [time.perf_counter(), time.process_time()]

    def mark(name: str) -> None:
        now = [time.perf_counter(), time.process_time()]
        out[name] = [round(now[0] - clock[0], 2), round(now[1] - clock[1], 2)]
        clock[:] = now

    with node_catalog_cache():
        ds = Dataset.open(open_store(url), version, None)
        mark("open_s")
        wanted = list(sources.READER_COLUMNS)
        rows = source_rows.read_rows(ds, ds.select(), None, wanted, (), True)
        mark("catalog_rows_s")
        columns = sources.SourceColumns.from_table(rows)
        mark("columns_s")
        part = columns.partition
        digest = key_digest(rows.column("key"), np.flatnonzero(part[1:] != part[:-1]) + 1)
        mark("digest_s")
    out["rows"] = len(columns)
    out["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
    out["digest"] = digest
    return out


if __name__ == "__main__":
    raise SystemExit(main())
