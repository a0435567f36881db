"""Parquet decoding hands Arrow no Python file object (the keyset SIGABRT at exit, issue #10).

``keyset create`` aborted with SIGABRT ("terminate called without an active exception") after
writing its keyset in ~1 of 8 runs. gdb showed an Arrow pool thread dropping the last reference
to a ``ParquetFileFragment`` whose ``PyReadableFile`` wrapped the ``io.BytesIO`` given to
``pq.read_table``: its destructor took the GIL while the interpreter shut down, and CPython's
``pthread_exit`` unwound through a ``noexcept`` C++ frame. Decoding from a ``pa.BufferReader``
keeps Python objects out of Arrow's threads altogether.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardlake

GOLDEN = Path(__file__).parents[1] / "data" / "golden" / "v1" / "root"


def test_decoders_pass_arrow_no_python_file(monkeypatch: pytest.MonkeyPatch) -> None:
    sources: list[Any] = []
    real_file, real_read = pq.ParquetFile, pq.read_table

    def parquet_file(source: Any, *args: Any, **kwargs: Any) -> Any:
        sources.append(source)
        return real_file(source, *args, **kwargs)

    def read_table(source: Any, *args: Any, **kwargs: Any) -> Any:
        sources.append(source)
        return real_read(source, *args, **kwargs)

    monkeypatch.setattr(pq, "ParquetFile", parquet_file)
    monkeypatch.setattr(pq, "read_table", read_table)
    root = shardlake.open(str(GOLDEN))  # read only: nothing is written to the golden root
    assert len(root.keysets.get("turns")) > 0
    manifests = 0
    for version in root.versions():
        ds = root.dataset(version.tag)
        for entry in ds.entries:
            assert ds.manifest(entry.id).num_rows > 0
            manifests += 1
    assert manifests >= len(list(GOLDEN.glob("data/*/*/manifest-*.parquet"))) > 0
    assert sources, "the decoders no longer go through pq.ParquetFile/read_table"
    # pa.NativeFile (BufferReader) is C++; io.BytesIO and other Python files are not.
    assert [type(s).__name__ for s in sources if not isinstance(s, pa.NativeFile)] == []
