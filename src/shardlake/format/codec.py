"""Sample codec: a dict of numpy arrays <-> one zstd-compressed safetensors payload.

Numeric and bool arrays are stored as safetensors tensors. Arrays safetensors cannot hold
(unicode/bytes strings, complex, big-endian) are stored as raw ``U8`` bytes with their numpy
dtype and shape in the metadata, so every array round-trips bit-exactly. The original array
order is kept in the metadata too. See ``docs/format.md``.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import zstandard

from ..errors import IntegrityError, SourceError

__all__ = [
    "CODEC_NAME",
    "DEFAULT_LEVEL",
    "Decoder",
    "Encoder",
    "TensorSpec",
    "arrays_equal_exact",
    "check_array",
    "decode_safetensors",
    "encode_safetensors",
    "frame_has_checksum",
    "payload_checksum",
    "safetensors_layout",
    "to_python_strings",
]

CODEC_NAME = "safetensors+zstd"
DEFAULT_LEVEL = 3
META_ORDER = "shardlake.order"
META_RAW = "shardlake.raw"  # JSON {name: [dtype.str, shape]} for raw-stored arrays

# numpy dtype kind+itemsize -> safetensors dtype name
_SAFETENSORS_DTYPES = {
    ("b", 1): "BOOL",
    ("u", 1): "U8",
    ("i", 1): "I8",
    ("u", 2): "U16",
    ("i", 2): "I16",
    ("u", 4): "U32",
    ("i", 4): "I32",
    ("u", 8): "U64",
    ("i", 8): "I64",
    ("f", 2): "F16",
    ("f", 4): "F32",
    ("f", 8): "F64",
}
# ... and back, little-endian (the safetensors byte order)
_NUMPY_OF = {name: np.dtype(f"<{kind}{size}") for (kind, size), name in _SAFETENSORS_DTYPES.items()}
# Raw-stored kinds: strings, bytes, complex. Object, void, datetime arrays are refused.
_RAW_KINDS = {"U", "S", "c"}


def _is_native_le(dtype: np.dtype[Any]) -> bool:
    return dtype.byteorder in ("<", "|", "=") and (dtype.byteorder != "=" or np.little_endian)


def check_array(name: str, array: np.ndarray[Any, Any], where: str) -> None:
    """Raise :class:`SourceError` naming ``where`` for an array shardlake cannot store."""
    kind = array.dtype.kind
    if kind == "O":
        raise SourceError(f"{where}: array {name!r} has dtype object; object arrays are refused")
    if (kind, array.dtype.itemsize) in _SAFETENSORS_DTYPES or kind in _RAW_KINDS:
        return
    raise SourceError(f"{where}: array {name!r} has unsupported dtype {array.dtype.str}")


def encode_safetensors(arrays: Mapping[str, np.ndarray[Any, Any]], where: str = "sample") -> bytes:
    """Serialise ``arrays`` to safetensors bytes (deterministic: sorted header, fixed layout)."""
    header: dict[str, Any] = {}
    raw: dict[str, list[Any]] = {}
    blobs: list[bytes] = []
    offset = 0
    # Deterministic layout: tensors in name order; the original order lives in metadata.
    for name in sorted(arrays):
        array = np.asarray(arrays[name])
        check_array(name, array, where)
        kind, size = array.dtype.kind, array.dtype.itemsize
        st_dtype = _SAFETENSORS_DTYPES.get((kind, size))
        if st_dtype is not None and _is_native_le(array.dtype):
            blob = np.ascontiguousarray(array).tobytes()
            shape = list(array.shape)
        else:
            blob = np.ascontiguousarray(array).tobytes()
            raw[name] = [array.dtype.str, list(array.shape)]
            st_dtype, shape = "U8", [len(blob)]
        header[name] = {
            "dtype": st_dtype,
            "shape": shape,
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    metadata = {META_ORDER: json.dumps(list(arrays), separators=(",", ":"))}
    if raw:
        metadata[META_RAW] = json.dumps(raw, separators=(",", ":"), sort_keys=True)
    header["__metadata__"] = metadata
    header_bytes = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)  # safetensors aligns the data start to 8
    return struct.pack("<Q", len(header_bytes)) + header_bytes + b"".join(blobs)


TensorSpec = tuple[str, np.dtype[Any], tuple[int, ...], int, int]  # name, dtype, shape, start, end
_LAYOUTS: dict[bytes, tuple[tuple[TensorSpec, ...], int]] = {}  # header -> (specs, data end)
_MAX_LAYOUTS = 256  # distinct headers remembered (samples of one dataset share a few)


def _parse_layout(header_bytes: bytes) -> tuple[TensorSpec, ...]:
    """The tensors of a safetensors header, in the original array order."""
    header = json.loads(header_bytes)
    metadata = header.pop("__metadata__", {}) or {}
    raw = json.loads(metadata.get(META_RAW, "{}"))
    order = json.loads(metadata.get(META_ORDER, "null")) or sorted(header)
    specs: list[TensorSpec] = []
    for name in order:
        spec = header[name]
        start, end = (int(x) for x in spec["data_offsets"])
        if name in raw:
            dtype_str, shape = raw[name]
            dtype = np.dtype(dtype_str)
        else:
            dtype, shape = _NUMPY_OF[spec["dtype"]], spec["shape"]
        if end < start or (end - start) != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"array {name!r}: data_offsets do not match its dtype and shape")
        specs.append((name, dtype, tuple(int(x) for x in shape), start, end))
    return tuple(specs)


def safetensors_layout(
    data: bytes | memoryview, where: str = "sample"
) -> tuple[int, tuple[TensorSpec, ...]]:
    """``(body_offset, specs)`` of safetensors bytes; parsed headers are remembered.

    Samples of one dataset share a handful of distinct headers (same names, dtypes, shapes), so
    the JSON parse is paid once per header, not once per sample.
    """
    view = memoryview(data)
    try:
        (header_len,) = struct.unpack_from("<Q", view, 0)
        header_bytes = bytes(view[8 : 8 + header_len])
        found = _LAYOUTS.get(header_bytes)
        if found is None:
            specs = _parse_layout(header_bytes)
            found = specs, max((end for *_, end in specs), default=0)
            if len(_LAYOUTS) >= _MAX_LAYOUTS:
                _LAYOUTS.clear()
            _LAYOUTS[header_bytes] = found
    except (struct.error, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"{where}: invalid safetensors header ({exc})") from exc
    body = 8 + header_len
    if body + found[1] > len(view):
        raise IntegrityError(f"{where}: safetensors data is shorter than its header says")
    return body, found[0]


def decode_safetensors(data: bytes | memoryview, where: str = "sample") -> dict[str, Any]:
    """Parse safetensors bytes into ``{name: ndarray}`` in the original order (zero-copy views).

    0-d unicode string arrays are returned as arrays; :func:`to_python_strings` converts them.
    """
    body, specs = safetensors_layout(data, where)
    view = memoryview(data)[body:]
    return {
        name: np.frombuffer(view[start:end], dtype=dtype).reshape(shape)
        for name, dtype, shape, start, end in specs
    }


class Encoder:
    """Reusable zstd compressor (level, frame checksum on, content size in the frame header)."""

    def __init__(self, level: int = DEFAULT_LEVEL) -> None:
        self.level = level
        self._cctx = zstandard.ZstdCompressor(
            level=level, write_checksum=True, write_content_size=True
        )

    def encode(
        self, arrays: Mapping[str, np.ndarray[Any, Any]], where: str = "sample"
    ) -> tuple[bytes, bytes]:
        """Return ``(safetensors_bytes, payload)`` where payload is the zstd frame."""
        st = encode_safetensors(arrays, where)
        return st, self.compress(st)

    def compress(self, safetensors_bytes: bytes) -> bytes:
        """One zstd frame of already-encoded safetensors bytes."""
        return self._cctx.compress(safetensors_bytes)


class Decoder:
    """Reusable zstd decompressor that checks the frame checksum."""

    def __init__(self) -> None:
        self._dctx = zstandard.ZstdDecompressor()

    def decompress(self, payload: bytes | memoryview, where: str = "sample") -> bytes:
        # No bytes after the frame: a payload is exactly one frame.
        try:
            return self._dctx.decompress(payload, allow_extra_data=False)
        except zstandard.ZstdError as exc:
            raise IntegrityError(f"{where}: zstd frame is corrupt ({exc})") from exc

    def decode(self, payload: bytes | memoryview, where: str = "sample") -> dict[str, Any]:
        return decode_safetensors(self.decompress(payload, where), where)


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def frame_has_checksum(payload: bytes | memoryview) -> bool:
    """Whether ``payload`` is a zstd frame carrying a content checksum (checked on decompress).

    The frame header descriptor's bit 2 says so. Such a payload needs no separate CRC-32 pass
    before decoding: a damaged frame fails to decompress or fails its checksum, which the
    decoder reports as :class:`IntegrityError` (Encoder always writes the checksum).
    """
    return len(payload) > 4 and payload[:4] == ZSTD_MAGIC and bool(payload[4] & 0x04)


def payload_checksum(payload: bytes | memoryview) -> int:
    """The manifest's per-read checksum: CRC-32 (zlib) of the compressed payload, as uint32."""
    return zlib.crc32(payload) & 0xFFFFFFFF


def to_python_strings(sample: dict[str, Any]) -> dict[str, Any]:
    """Replace 0-d unicode/bytes arrays by Python ``str``/``bytes`` (how samples are yielded)."""
    out = {}
    for name, value in sample.items():
        if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "US":
            out[name] = value.item()
        else:
            out[name] = value
    return out


def arrays_equal_exact(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    """Bit-exact equality: same dtype, shape and bytes (NaN payloads included)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
