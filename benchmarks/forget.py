"""What ``forget`` costs (issue #46): shards rewritten, bytes written and time, for one sample
and for a fraction of the samples, in a root of several versions.

Writes ``--samples`` small samples (one float32 array each) in ``--partitions`` partitions as
``v1`` with the writer, then ``--versions - 1`` more versions, each replacing one partition on
top of the previous one; then forgets one random sample, then ``--fraction`` of the samples
(random, another set), and prints one JSON line per forget and one summary::

    python benchmarks/forget.py --samples 100000 --versions 5 --fraction 0.01

The rewrite runs on ``--executor`` (thread, process or dask://HOST:PORT), as pack's does.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import shardlake
from shardlake.errors import UsageError


def _size(text: str) -> int:
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def build(root: shardlake.Root, samples: int, partitions: int, versions: int, shard: int) -> float:
    """The root's versions; returns the seconds it took."""
    started = time.monotonic()
    rng = np.random.default_rng(46)
    per = samples // partitions
    options = shardlake.WriteOptions(shard_size=shard)
    with root.writer("v1", options=options) as w:
        for p in range(partitions):
            for i in range(per):
                w.write(f"p{p:03d}/{i:06d}", {"x": rng.normal(size=64).astype(np.float32)}, {})
    for v in range(2, versions + 1):
        p = v - 2  # each later version replaces one partition's samples
        with root.writer(f"v{v}", base=f"v{v - 1}", options=options) as w:
            for i in range(per):
                w.write(f"p{p:03d}/{i:06d}", {"x": rng.normal(size=64).astype(np.float32)}, {})
    return time.monotonic() - started


def run(
    root: shardlake.Root, keys: list[str], label: str, executor: str, workers: int
) -> dict[str, object]:
    started = time.monotonic()
    report = root.forget(keys=keys, reason=f"benchmark {label}", executor=executor, workers=workers)
    seconds = time.monotonic() - started
    shards = {
        s.key: s.size
        for v in root.versions()
        for e in root.dataset(v.tag).entries
        for s in e.shards
    }
    total = sum(shards.values())
    return {
        "forget": label,
        "keys": len(keys),
        "versions_redacted": len(report.versions),
        "shards_rewritten": report.shards_rewritten,
        "bytes_rewritten": report.bytes_to_rewrite,
        "bytes_written": report.bytes_written,
        "objects_deleted": len(report.deleted),
        "seconds": round(seconds, 2),
        "shards_in_root": len(shards),
        "shard_bytes_in_root": total,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=50)
    parser.add_argument("--versions", type=int, default=5)
    parser.add_argument("--fraction", type=float, default=0.01)
    parser.add_argument("--shard-size", default="256KiB")
    parser.add_argument("--executor", default="thread")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--root", default=None, help="where to build (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.versions - 1 > args.partitions:
        raise UsageError("--versions may replace at most --partitions partitions")
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(args.root) if args.root else Path(tmp) / "root"
        root = shardlake.open(where)
        built = build(root, args.samples, args.partitions, args.versions, _size(args.shard_size))
        print(json.dumps({"built_s": round(built, 1), "samples": args.samples}), flush=True)
        keys = sorted(root.dataset().manifests(columns=["key"]).column("key").to_pylist())
        rng = random.Random(46)
        one = [rng.choice(keys)]
        rest = [k for k in keys if k != one[0]]
        many = rng.sample(rest, max(1, int(len(keys) * args.fraction)))
        results = [
            run(root, one, "1 sample", args.executor, args.workers),
            run(root, many, f"{args.fraction:.0%}", args.executor, args.workers),
        ]
        for result in results:
            print(json.dumps(result), flush=True)
        check_started = time.monotonic()
        ok = root.check_forget().ok
        print(json.dumps({"check_ok": ok, "check_s": round(time.monotonic() - check_started, 2)}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
