import numpy as np
import pytest

from shardlake.errors import IntegrityError, SourceError
from shardlake.format.codec import (
    Decoder,
    Encoder,
    arrays_equal_exact,
    payload_checksum,
    to_python_strings,
)

ARRAYS = {
    "version": np.array([2], dtype=np.uint32),
    "flag": np.array([[True, False]]),
    "half": np.linspace(0, 1, 7, dtype=np.float16),
    "i64": np.arange(-3, 3, dtype=np.int64),
    "u16": np.arange(5, dtype=np.uint16),
    "f64": np.array([np.nan, -0.0, np.inf]),
    "empty": np.zeros((0, 31, 11), dtype=np.float32),
    "scalar": np.array(3.5, dtype=np.float32),
    "map_name": np.array("us-nv-las-vegas"),
    "token": np.array("abc", dtype="<U10"),
    "raw_bytes": np.array(b"\x00\x01"),
    "big_endian": np.arange(4, dtype=">i4"),
    "complex": np.array([1 + 2j], dtype=np.complex64),
    "fortran": np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
}


def test_every_dtype_round_trips_bit_exact_in_order():
    _, payload = Encoder().encode(ARRAYS)
    out = Decoder().decode(payload)
    assert list(out) == list(ARRAYS)
    for name, array in ARRAYS.items():
        assert arrays_equal_exact(array, out[name]), name


# Little-endian arrays of these kinds go through the safetensors table (big-endian ones: raw).
@pytest.mark.parametrize(
    "dtype", ["?", "u1", "i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f4", "<f8"]
)
def test_each_safetensors_dtype_decodes_to_its_numpy_dtype(dtype: str) -> None:
    array = np.arange(6).astype(dtype).reshape(2, 3)
    out = Decoder().decode(Encoder().encode({"a": array})[1])["a"]
    assert out.dtype == np.dtype(dtype) and out.shape == (2, 3)
    assert out.tolist() == array.tolist()


def test_encoding_is_deterministic():
    assert Encoder().encode(ARRAYS) == Encoder().encode(dict(ARRAYS))


def test_strings_become_python_str():
    out = to_python_strings(Decoder().decode(Encoder().encode(ARRAYS)[1]))
    assert out["map_name"] == "us-nv-las-vegas"
    assert out["token"] == "abc"


@pytest.mark.parametrize(
    "bad",
    [
        np.array([object()], dtype=object),
        np.zeros(2, dtype="V4"),
        np.array(["2020"], dtype="M8[D]"),
    ],
)
def test_unstorable_arrays_are_refused_naming_the_array(bad):
    with pytest.raises(SourceError, match="'x'") as info:
        Encoder().encode({"x": bad}, where="log/a.npz")
    assert "log/a.npz" in str(info.value)


def test_corrupt_frame_and_checksum_are_integrity_errors(tmp_path):
    from shardlake import open_store
    from shardlake.read.payloads import PayloadRef, fetch_payload

    _, payload = Encoder().encode(ARRAYS)
    flipped = bytearray(payload)
    flipped[len(flipped) // 2] ^= 0xFF
    # The read path checks the manifest's CRC-32 (the one check: read/payloads.py).
    store = open_store(str(tmp_path))
    store.write("shard-1", bytes(flipped))
    ref = PayloadRef("shard-1", 0, len(payload), payload_checksum(payload), key="log/a")
    with pytest.raises(IntegrityError, match="shard-1.*checksum mismatch"):
        fetch_payload(store, ref, rereads=0)
    with pytest.raises(IntegrityError):
        Decoder().decode(bytes(flipped))


def test_frames_carry_a_content_checksum_the_decoder_checks() -> None:
    import zstandard

    from shardlake.format.codec import frame_has_checksum

    st, payload = Encoder().encode(ARRAYS)
    assert frame_has_checksum(payload) and frame_has_checksum(memoryview(payload))
    bare = zstandard.ZstdCompressor(write_checksum=False).compress(st)
    assert not frame_has_checksum(bare)
    assert not frame_has_checksum(b"not a zstd frame") and not frame_has_checksum(b"")
    # A payload is exactly one frame: trailing bytes are refused, not ignored.
    with pytest.raises(IntegrityError):
        Decoder().decompress(payload + b"\x00")


def test_samples_sharing_a_header_share_one_parsed_layout() -> None:
    from shardlake.format.codec import encode_safetensors, safetensors_layout

    a = encode_safetensors({"x": np.zeros(3, np.float32), "s": np.array("ab")})
    b = encode_safetensors({"x": np.ones(3, np.float32), "s": np.array("cd")})
    assert safetensors_layout(a)[1] is safetensors_layout(b)[1]
    with pytest.raises(IntegrityError, match="shorter"):
        safetensors_layout(a[:-1], "shard-1")


def test_header_offsets_that_disagree_with_the_shape_are_integrity_errors() -> None:
    import json
    import struct

    from shardlake.format.codec import decode_safetensors

    header = json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    data = struct.pack("<Q", len(header)) + header + bytes(16)
    with pytest.raises(IntegrityError, match="data_offsets"):
        decode_safetensors(data, "shard-9")
