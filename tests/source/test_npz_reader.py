"""format.npz.load_npz: differential against np.load on generated files, one test per refusal."""

from __future__ import annotations

import io
import struct
import threading
import zipfile
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from shardlake.errors import SourceError
from shardlake.source.npz import load_npz
from shardlake.source.source_form import npz_bytes

SCALARS = [
    "?", "i1", "u1", "<i2", ">i2", "<u4", ">i8", "<f2", ">f4", "<f8", ">f8", "<c8", ">c16",
    "S5", "<U3", ">U2", "<M8[ms]", ">m8[s]",
]  # fmt: skip
STRUCTURED = [
    np.dtype([("x", "<f4"), ("y", ">i2", (2,))]),
    np.dtype({"names": ["a", "b"], "formats": ["u1", "<f8"], "offsets": [0, 8], "itemsize": 24}),
]


def _reference(data: bytes) -> dict[str, np.ndarray[Any, Any]]:
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def _assert_identical(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert list(got) == list(want)
    for name, ref in want.items():
        arr = got[name]
        assert arr.dtype == ref.dtype and arr.dtype.str == ref.dtype.str, name
        assert arr.shape == ref.shape, name
        assert arr.flags.f_contiguous == ref.flags.f_contiguous, name
        assert arr.flags.c_contiguous == ref.flags.c_contiguous, name
        assert _content(arr) == _content(ref), name
        assert arr.flags.writeable


def _content(array: np.ndarray[Any, Any]) -> list[bytes]:
    """The array's bytes; per field for structured dtypes (np.load leaves padding undefined)."""
    if array.dtype.names is None:
        return [array.tobytes(order="A")]
    return [b for name in array.dtype.names for b in _content(array[name])]


def _npz(arrays: dict[str, np.ndarray[Any, Any]], compress: bool) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compress else np.savez)(buf, **arrays)
    return buf.getvalue()


def _array_strategy() -> st.SearchStrategy[np.ndarray[Any, Any]]:
    dtypes = st.sampled_from([np.dtype(d) for d in SCALARS] + STRUCTURED)
    shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
    base = dtypes.flatmap(lambda dt: hnp.arrays(dt, shapes))
    return st.tuples(base, st.booleans()).map(lambda a: np.asfortranarray(a[0]) if a[1] else a[0])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arrays=st.lists(_array_strategy(), min_size=0, max_size=4),
    compress=st.booleans(),
)
def test_matches_np_load(arrays: list[np.ndarray[Any, Any]], compress: bool) -> None:
    data = _npz({f"a{i}": a for i, a in enumerate(arrays)}, compress)
    _assert_identical(load_npz(data, "gen.npz"), _reference(data))


def test_realistic_frame_and_npy_versions() -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "image": rng.integers(0, 255, (64, 96, 3), dtype=np.uint8),
        "points": rng.standard_normal((320, 4)).astype(np.float32),
        "big_endian": np.arange(10, dtype=">f8"),
        "fortran": np.asfortranarray(rng.standard_normal((7, 5))),
        "scalar": np.array(3.5),
        "empty": np.zeros((0, 3), dtype=np.int16),
        "void": np.frombuffer(bytes(range(12)), dtype="V4"),
        "zero_itemsize": np.zeros(3, dtype="S0"),
    }
    for compress in (False, True):
        data = _npz(arrays, compress)
        _assert_identical(load_npz(data, "f.npz"), _reference(data))
    # Versions 2.0 and 3.0 headers (np.save picks them for huge or non-latin1 headers).
    for version in ((2, 0), (3, 0)):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf, zf.open("v.npy", "w") as fh:
            np.lib.format.write_array(fh, arrays["points"], version=version)
        _assert_identical(load_npz(buf.getvalue(), "v.npz"), _reference(buf.getvalue()))


def test_zip64_structures(monkeypatch: pytest.MonkeyPatch) -> None:
    # Shrink zipfile's limits so small files get zip64 extras and the zip64 end records.
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 16)
    monkeypatch.setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 2)
    arrays = {f"x{i}": np.arange(50 * i, dtype="<i4") for i in range(4)}
    for compress in (False, True):
        data = _npz(arrays, compress)
        assert b"PK\x06\x06" in data and b"PK\x06\x07" in data
        _assert_identical(load_npz(data, "z.npz"), _reference(data))


def test_thread_safe() -> None:
    data = _npz({f"a{i}": np.arange(i + 1, dtype="<f4") for i in range(18)}, True)
    want, errors = _reference(data), []

    def work() -> None:
        try:
            for _ in range(50):
                _assert_identical(load_npz(data, "t.npz"), want)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# ---- refusals: one SourceError line naming the file (and member) ----


def _refused(data: bytes, *fragments: str) -> None:
    with pytest.raises(SourceError) as info:
        load_npz(data, "bad.npz")
    message = str(info.value)
    assert "\n" not in message and message.startswith("bad.npz")
    for fragment in fragments:
        assert fragment in message


def test_refuses_object_array() -> None:
    buf = io.BytesIO()
    np.savez(buf, o=np.array([1, "a"], dtype=object))
    _refused(buf.getvalue(), "'o.npy'", "object array")


def test_refuses_structured_object_field() -> None:
    buf = io.BytesIO()
    np.savez(buf, s=np.zeros(2, dtype=[("a", "O"), ("b", "<i4")]))
    _refused(buf.getvalue(), "object array")


def test_refuses_not_a_zip() -> None:
    _refused(b"hello world, not a zip", "not an npz")


def test_refuses_truncation() -> None:
    data = _npz({"a": np.arange(1000)}, True)
    for cut in (len(data) // 2, len(data) - 10, 40):
        _refused(data[:cut], "truncated")


def test_refuses_bad_crc() -> None:
    payload = np.arange(100, dtype="<i8")
    data = bytearray(_npz({"a": payload}, False))
    data[data.index(payload.tobytes()) + 80] ^= 0xFF  # flip one byte of the stored array data
    _refused(bytes(data), "'a.npy'", "CRC-32 mismatch")


def test_refuses_corrupt_deflate_stream() -> None:
    data = bytearray(_npz({"a": np.arange(5000, dtype="<i8")}, True))
    start = 30 + len("a.npy") + 20  # inside the member's deflate stream
    data[start : start + 40] = bytes(40)
    _refused(bytes(data), "'a.npy'", "corrupt npz")


def test_refuses_corrupt_header() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("h.npy", b"\x93NUMPY\x01\x00" + struct.pack("<H", 6) + b"{'a': " + b"")
    _refused(buf.getvalue(), "'h.npy'", "corrupt .npy header")


def test_refuses_wrong_data_length() -> None:
    good = io.BytesIO()
    np.lib.format.write_array(good, np.arange(10, dtype="<i4"))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("n.npy", good.getvalue()[:-4])
    _refused(buf.getvalue(), "'n.npy'", "array data is 36 bytes, header says 40")


def test_refuses_non_npy_member() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("notes.txt", b"hi")
    _refused(buf.getvalue(), "'notes.txt'", "not an .npy array")


def test_refuses_duplicate_member() -> None:
    one = io.BytesIO()
    np.lib.format.write_array(one, np.arange(3))
    buf = io.BytesIO()
    with pytest.warns(UserWarning), zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("d.npy", one.getvalue())
        zf.writestr("d.npy", one.getvalue())
    _refused(buf.getvalue(), "'d.npy'", "twice")


def test_refuses_unknown_compression() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_BZIP2) as zf:
        zf.writestr("b.npy", b"\x93NUMPY")
    _refused(buf.getvalue(), "'b.npy'", "compression method 12")


def test_npz_bytes_round_trip_all_dtypes() -> None:
    """The writer ``get``/``export`` use, read back by the reader pack uses: bit-exact."""
    arrays = {
        "b": np.array([True, False]),
        "f16": np.arange(3, dtype=np.float16),
        "i64": np.array([[1, -2]], dtype=np.int64),
        "s": np.array("us-ma-boston"),
        "empty": np.zeros((0, 3), np.float32),
        "nan": np.array([np.nan], np.float32),
    }
    got = load_npz(npz_bytes(arrays), "x")
    assert list(got) == list(arrays)
    for name, want in arrays.items():
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        assert got[name].tobytes() == want.tobytes(), name


def test_canonical_npz_form_is_deterministic_and_hashed() -> None:
    import hashlib

    from shardlake.source.source_form import source_sha256

    arrays = {"b": np.arange(5, dtype=">u2"), "a": np.array(["x", "yz"])}
    data = npz_bytes(arrays, compress=False)
    infos = zipfile.ZipFile(io.BytesIO(data)).infolist()
    assert [i.filename for i in infos] == ["b.npy", "a.npy"]
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert {i.compress_type for i in infos} == {zipfile.ZIP_STORED}
    assert {i.create_system for i in infos} == {3}  # Unix, also on Windows
    assert source_sha256(arrays) == hashlib.sha256(data).hexdigest()
    got = load_npz(data, "x")
    assert list(got) == list(arrays)
    assert all(
        got[n].dtype == arrays[n].dtype and got[n].tobytes() == arrays[n].tobytes() for n in got
    )
