"""Write the golden roots under tests/data/golden/ (run once per format; never rerun for v1).

``python tests/data/golden/make_golden.py NAME`` (NAME in ``ROOTS``) packs a small synthetic source (every storable
dtype, 0-d strings, dotted keys, nested sidecars) into ``tests/data/golden/NAME/root`` as two
versions plus a keyset, and writes ``tests/data/golden/NAME/expected.json``: per version, per key,
the sha256 of each array's dtype, shape and bytes (see ``array_digest``). The committed roots are
the format's fixed points: tests/format/test_golden_roots.py reads them with today's code, bit-exactly.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import shardlake

HERE = Path(__file__).resolve().parent
# Each name was written once by the code of its time and is never rewritten:
# v1: format 1 as first specified; v1-manifest-digests: entries carry manifest_sha256/size;
# v1-record-digests: commit records carry record_sha256, keysets shardlake.content_sha256;
# v2-catalog: format 2, partitions and rows in the per-version catalog (docs/format.md).
ROOTS = ("v1", "v1-manifest-digests", "v1-record-digests", "v2-catalog")


def array_digest(value: Any) -> str:
    """sha256 over ``dtype.str``, the shape and the C-order bytes of one array."""
    arr = np.asarray(value)
    h = hashlib.sha256()
    h.update(arr.dtype.str.encode())
    h.update(json.dumps(list(arr.shape)).encode())
    h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def sample_digests(arrays: dict[str, Any]) -> dict[str, str]:
    return {name: array_digest(value) for name, value in arrays.items()}


def frame(i: int) -> dict[str, Any]:
    """One sample holding every dtype the format stores (native and raw)."""
    rng = np.random.default_rng(1000 + i)
    return {
        "image": rng.integers(0, 255, size=(2, 3, 3), dtype=np.uint8),
        "points": rng.normal(size=(4, 3)).astype(np.float32),
        "half": rng.normal(size=(3,)).astype(np.float16),
        "wide": rng.normal(size=(2,)).astype(np.float64),
        "valid": np.array([True, False, i % 2 == 0]),
        "i8": np.array([-1, i % 100], dtype=np.int8),
        "u16": np.array([i, 65535], dtype=np.uint16),
        "i16": np.array([-300, i], dtype=np.int16),
        "u32": np.array(i, dtype=np.uint32),
        "i32": np.arange(3, dtype=np.int32) - i,
        "u64": np.array([2**63 + i], dtype=np.uint64),
        "i64": np.array([[i, -i]], dtype=np.int64),
        "cplx": (rng.normal(size=2) + 1j * rng.normal(size=2)).astype(np.complex64),
        "big": np.arange(3, dtype=">i4") * (i + 1),
        "token": np.array(f"tok-{i:04d}-é"),
        "map_name": np.array("us-ma-boston"),
        "raw_bytes": np.array([b"ab", b"c"], dtype="S2"),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "nan": np.array([np.nan, -0.0, np.inf], dtype=np.float32),
    }


def sidecar(i: int) -> dict[str, Any]:
    return {
        "scenario": ["left_turn", "stop", "follow"][i % 3],
        "speed": 1.5 * i,
        "index": i,
        "is_skipped": i == 4,
        "skipping_info": {"label": "blur" if i % 2 else "ok", "score": i / 10},
        "tags": ["a", "b"][: i % 3],
    }


def write_source(src: Path, count: int, changed: int | None = None) -> dict[str, dict[str, Any]]:
    from shardlake.testing import write_npz

    arrays: dict[str, dict[str, Any]] = {}
    logs = ["2021.05.12.22.00.38_veh-35_01008", "log.b", "log_c"]
    for i in range(count):
        log = logs[i % len(logs)]
        key = f"{log}/{log}_frame.{i:03d}"
        sample = frame(i if changed is None or i != changed else 500 + i)
        path = src / f"{key}.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_npz(path, sample)
        doc = sidecar(i)
        if changed is not None and i == changed + 1:
            doc["speed"] = 99.0  # a sidecar-only change in another partition
        (src / f"{key}.json").write_text(json.dumps(doc))
        arrays[key] = sample
    return arrays


def make_root(out: Path) -> None:
    from shardlake.format.layout import RECORD_FORMAT_VERSION

    root = out / "root"
    if root.exists():
        shutil.rmtree(root)
    expected: dict[str, Any] = {"format_version": RECORD_FORMAT_VERSION, "versions": {}}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        for tag, base, changed in (("v1", None, None), ("v2", "v1", 3)):
            arrays = write_source(src, 9, changed)
            shardlake.open(str(root)).pack(
                src, tag=tag, base=base, shard_size=4096, source_namespace="golden"
            )
            kept = {k: v for k, v in arrays.items() if not k.endswith("frame.004")}
            expected["versions"][tag] = {k: sample_digests(v) for k, v in sorted(kept.items())}
    shardlake.open(str(root)).keysets.create("turns", version="v2", where="scenario = 'left_turn'")
    expected["keysets"] = {"turns": {"version": "v2", "where": "scenario = 'left_turn'"}}
    (out / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else ""
    if which not in ROOTS:
        sys.exit(f"usage: make_golden.py {{{'|'.join(ROOTS)}}}")
    if (HERE / which / "expected.json").exists():
        sys.exit(f"{which} exists: golden roots are never rewritten; add a new name")
    make_root(HERE / which)
