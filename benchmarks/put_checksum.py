"""What the upload digest costs in pack throughput: the same pack to SeaweedFS on loopback with
every upload's Content-MD5 (the default) and without it (the digest hook turned off), in
alternating runs, each into a fresh root.

    .venv/bin/python benchmarks/put_checksum.py --partitions 4 --samples 30 --workers 2 --repeat 3

Prints the median seconds, MB/s of shard bytes and the cost in percent, plus hashlib's MD5
rate on this machine.  Thread executor: the hook is turned off in this process only.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import shardlake
from shardlake.store.backends import s3 as s3_backend
from shardlake.testing import synth_corpus
from shardlake.testing.seaweedfs import seaweedfs_server


def _no_digest(method: str, akwarglist: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with_digest = s3_backend._with_content_md5
    with tempfile.TemporaryDirectory() as tmp, seaweedfs_server() as server:
        src = Path(tmp) / "src"
        synth_corpus(src, args.partitions, args.samples, seed=1)
        times: dict[str, list[float]] = {"md5": [], "none": []}
        cpu: dict[str, list[float]] = {"md5": [], "none": []}
        shard_bytes = 0
        for i in range(args.repeat):
            for mode in ("md5", "none") if i % 2 == 0 else ("none", "md5"):
                s3_backend._with_content_md5 = with_digest if mode == "md5" else _no_digest
                root = shardlake.open(
                    server.fresh_url(f"bench-{mode}-{i}"), **server.storage_options
                )
                start, cpu_start = time.perf_counter(), time.process_time()
                root.pack(src, tag="v1", executor="thread", workers=args.workers, progress=False)
                times[mode].append(time.perf_counter() - start)
                cpu[mode].append(time.process_time() - cpu_start)
                shard_bytes = sum(i.size for i in root.store.list_info() if "/shard-" in i.key)
        s3_backend._with_content_md5 = with_digest
    block = b"\x5a" * (64 << 20)
    start = time.perf_counter()
    hashlib.md5(block, usedforsecurity=False).digest()
    md5_rate = len(block) / (time.perf_counter() - start) / 1e6
    mb = shard_bytes / 1e6
    md5_s, none_s = statistics.median(times["md5"]), statistics.median(times["none"])
    print(f"shard bytes per pack: {mb:.1f} MB; runs per mode: {args.repeat}")
    md5_c, none_c = statistics.median(cpu["md5"]), statistics.median(cpu["none"])
    for name, mode, wall, used in (
        ("with Content-MD5", "md5", md5_s, md5_c),
        ("without", "none", none_s, none_c),
    ):
        runs = ", ".join(f"{t:.2f}" for t in times[mode])
        print(f"{name:17} {wall:6.2f} s  {mb / wall:6.1f} MB/s  cpu {used:6.2f} s  runs {runs}")
    print(
        f"cost: {100 * (md5_s - none_s) / none_s:+.1f}% wall, {100 * (md5_c - none_c) / none_c:+.1f}% "
        f"cpu (this process); hashlib md5 {md5_rate:.0f} MB/s"
    )


if __name__ == "__main__":
    main()
