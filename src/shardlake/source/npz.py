"""A fast, strict reader for ``.npz`` files held in memory (the one ``load_npz``).

Why not ``np.load``: it inflates through :mod:`zipfile` + zlib (about half the speed of
libdeflate), copies every member once more into the array, and parses each ``.npy`` header
with :func:`ast.literal_eval`, which is not thread-safe on CPython 3.11 (gh-106905). This
reader parses the zip central directory itself, inflates each member with the fastest codec
installed (libdeflate via ``deflate``, else ISA-L via ``isal``, else zlib), checks every
member's CRC-32, parses the ``.npy`` header with a tiny literal parser, and builds each array
with :func:`numpy.frombuffer` over the inflated buffer (no extra copy; arrays are writable).

It returns the same arrays as ``np.load`` (dtype, byte order, shape, Fortran order, bytes) for
every file ``np.save``/``np.savez``/``np.savez_compressed`` write, including zip64 files, and
refuses with one :class:`~shardlake.errors.SourceError` line naming the file and member:
object arrays, members that are not ``.npy``, duplicate names, encryption, unknown
compression, truncation, CRC mismatches and corrupt headers or streams.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import SourceError
from ..progress.bar import plural

__all__ = ["load_npz"]

Arrays = dict[str, np.ndarray[Any, Any]]
Inflate = Callable[[memoryview, int], bytes | bytearray]

_EOCD = struct.Struct("<4s4H2LH")  # end of central directory (22 bytes + comment)
_ZIP64_LOCATOR = struct.Struct("<4sLQL")  # 20 bytes, right before the EOCD
_ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")  # 56 bytes (+ extensible data)
_CENTRAL = struct.Struct("<4s6H3L5H2L")  # 46 bytes + name + extra + comment
_LOCAL = struct.Struct("<4s5H3L2H")  # 30 bytes + name + extra
_SIG_EOCD, _SIG_LOC64, _SIG_EOCD64 = b"PK\x05\x06", b"PK\x06\x07", b"PK\x06\x06"
_SIG_CENTRAL, _SIG_LOCAL = b"PK\x01\x02", b"PK\x03\x04"
_STORED, _DEFLATED = 0, 8
_FLAG_ENCRYPTED = 0x1
_ZIP64_EXTRA = 0x0001
_U32_MAX, _U16_MAX = 0xFFFFFFFF, 0xFFFF
_NPY_MAGIC = b"\x93NUMPY"


def _pick_codec() -> tuple[str, Inflate, Callable[[Any], int]]:
    """The fastest raw-deflate inflater installed, with its CRC-32 (all bit-identical)."""
    try:
        import deflate

        return "libdeflate", deflate.deflate_decompress, deflate.crc32
    except ImportError:
        pass
    try:
        from isal import isal_zlib

        def _isal(data: memoryview, size: int) -> bytes:
            return isal_zlib.decompress(data, -15, max(size, 1))

        return "isal", _isal, isal_zlib.crc32
    except ImportError:
        pass

    def _zlib(data: memoryview, size: int) -> bytes:
        return zlib.decompress(data, -15, max(size, 1))

    return "zlib", _zlib, zlib.crc32


INFLATE_CODEC, _inflate, _crc32 = _pick_codec()


class _Member:
    """One central-directory entry: what to inflate and how to check it."""

    __slots__ = ("name", "method", "flags", "crc", "csize", "usize", "offset")

    def __init__(self, name: str, method: int, flags: int, crc: int, sizes: tuple[int, ...]):
        self.name, self.method, self.flags, self.crc = name, method, flags, crc
        self.csize, self.usize, self.offset = sizes


def load_npz(data: bytes | bytearray | memoryview, where: str) -> Arrays:
    """Arrays of an in-memory npz, in file order, names without ``.npy``.

    Parameters
    ----------
    data
        The whole ``.npz`` file.
    where
        What to name in error messages (usually the file's path or URL).

    Returns
    -------
    dict[str, numpy.ndarray]
        Exactly what ``np.load(..., allow_pickle=False)`` would give, member by member.

    Raises
    ------
    SourceError
        One line naming ``where`` (and the member) when the file cannot be read strictly.
    """
    view = memoryview(data).cast("B")
    members = _central_directory(view, where)
    arrays: Arrays = {}
    for member in members:
        label = f"{where}: member {member.name!r}"
        if not member.name.endswith(".npy"):
            raise SourceError(f"{label} is not an .npy array; npz files hold arrays only")
        name = member.name[: -len(".npy")]
        if name in arrays:
            raise SourceError(f"{label} appears twice")
        arrays[name] = _parse_npy(_member_bytes(view, member, label), label)
    return arrays


def _central_directory(view: memoryview, where: str) -> list[_Member]:
    """The central directory's entries (zip64 aware), or a SourceError naming ``where``."""
    cd_offset, cd_size, count = _find_directory(view, where)
    if cd_offset + cd_size > len(view):
        raise SourceError(
            f"{where}: corrupt or truncated npz (central directory past the end of the file)"
        )
    members: list[_Member] = []
    pos = cd_offset
    for _ in range(count):
        if pos + _CENTRAL.size > len(view):
            raise SourceError(
                f"{where}: corrupt or truncated npz (central directory entry {len(members)})"
            )
        fields = _CENTRAL.unpack_from(view, pos)
        if fields[0] != _SIG_CENTRAL:
            raise SourceError(f"{where}: corrupt npz (bad central directory entry signature)")
        flags, method, crc, csize, usize = fields[3], fields[4], fields[7], fields[8], fields[9]
        name_len, extra_len, comment_len, offset = fields[10], fields[11], fields[12], fields[16]
        start = pos + _CENTRAL.size
        raw_name = bytes(view[start : start + name_len])
        name = raw_name.decode("utf-8" if flags & 0x800 else "cp437")
        extra = view[start + name_len : start + name_len + extra_len]
        sizes = _zip64_sizes(extra, (csize, usize, offset), f"{where}: member {name!r}")
        members.append(_Member(name, method, flags, crc, sizes))
        pos = start + name_len + extra_len + comment_len
    return members


def _find_directory(view: memoryview, where: str) -> tuple[int, int, int]:
    """``(offset, size, entries)`` of the central directory, from the (zip64) end record."""
    if bytes(view[:4]) not in (_SIG_LOCAL, _SIG_EOCD):
        raise SourceError(f"{where}: not an npz file (no zip header; truncated or corrupt?)")
    # The end record is the last 22 bytes unless a comment (< 64 KiB) follows it.
    tail_start = max(0, len(view) - _EOCD.size - _U16_MAX)
    at = bytes(view[tail_start:]).rfind(_SIG_EOCD)
    if at < 0 or tail_start + at + _EOCD.size > len(view):
        raise SourceError(f"{where}: corrupt or truncated npz (no end of central directory)")
    at += tail_start
    _, disk, _, _, count, cd_size, cd_offset, _ = _EOCD.unpack_from(view, at)
    if disk != 0:
        raise SourceError(f"{where}: multi-disk zip archives are not npz files")
    loc = at - _ZIP64_LOCATOR.size
    if loc >= 0 and bytes(view[loc : loc + 4]) == _SIG_LOC64:
        _, _, eocd64, _ = _ZIP64_LOCATOR.unpack_from(view, loc)
        if eocd64 + _ZIP64_EOCD.size > len(view) or bytes(view[eocd64 : eocd64 + 4]) != (
            _SIG_EOCD64
        ):
            raise SourceError(f"{where}: corrupt npz (bad zip64 end of central directory)")
        fields = _ZIP64_EOCD.unpack_from(view, eocd64)
        count, cd_size, cd_offset = fields[7], fields[8], fields[9]
    return cd_offset, cd_size, count


def _zip64_sizes(extra: memoryview, sizes: tuple[int, int, int], label: str) -> tuple[int, ...]:
    """Replace the 0xFFFFFFFF ``(csize, usize, offset)`` fields from the zip64 extra field."""
    csize, usize, offset = sizes
    need = [usize == _U32_MAX, csize == _U32_MAX, offset == _U32_MAX]  # zip64 field order
    if not any(need):
        return sizes
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<2H", extra, pos)
        if tag == _ZIP64_EXTRA:
            values = list(struct.unpack_from(f"<{length // 8}Q", extra, pos + 4))
            got = [values.pop(0) if flag and values else None for flag in need]
            if any(flag and value is None for flag, value in zip(need, got, strict=True)):
                break
            usize = got[0] if got[0] is not None else usize
            csize = got[1] if got[1] is not None else csize
            offset = got[2] if got[2] is not None else offset
            return csize, usize, offset
        pos += 4 + length
    raise SourceError(f"{label}: corrupt npz (zip64 sizes missing)")


def _member_bytes(view: memoryview, member: _Member, label: str) -> bytes | bytearray | memoryview:
    """The member's uncompressed bytes, CRC-checked."""
    if member.flags & _FLAG_ENCRYPTED:
        raise SourceError(f"{label} is encrypted; npz members must not be")
    if member.method not in (_STORED, _DEFLATED):
        raise SourceError(f"{label} uses zip compression method {member.method} (not deflate)")
    pos = member.offset
    if pos + _LOCAL.size > len(view) or bytes(view[pos : pos + 4]) != _SIG_LOCAL:
        raise SourceError(f"{label}: corrupt or truncated npz (bad local header)")
    fields = _LOCAL.unpack_from(view, pos)
    start = pos + _LOCAL.size + fields[9] + fields[10]
    end = start + member.csize
    if end > len(view):
        raise SourceError(
            f"{label}: corrupt or truncated npz (member data past the end of the file)"
        )
    raw = view[start:end]
    if member.method == _STORED:
        if member.csize != member.usize:
            raise SourceError(f"{label}: corrupt npz (stored member sizes differ)")
        # One copy (as np.load makes) so the arrays are writable and do not pin the file.
        out: bytes | bytearray | memoryview = bytearray(raw) if raw.readonly else raw
    else:
        try:
            out = _inflate(raw, member.usize)
        except Exception as exc:  # noqa: BLE001 - each codec has its own error type
            raise SourceError(f"{label}: corrupt npz (deflate stream: {exc})") from exc
        if len(out) != member.usize:
            raise SourceError(
                f"{label}: corrupt npz (inflates to {plural(len(out), 'byte')}, expected {member.usize})"
            )
    if _crc32(out) != member.crc:
        raise SourceError(f"{label}: CRC-32 mismatch (corrupt npz)")
    return out


def _parse_npy(buf: bytes | bytearray | memoryview, label: str) -> np.ndarray[Any, Any]:
    """The array of one ``.npy`` member, viewing ``buf`` without copying."""
    if bytes(buf[:6]) != _NPY_MAGIC or len(buf) < 10:
        raise SourceError(f"{label}: corrupt .npy member (bad magic)")
    major = buf[6]
    if major == 1:
        (hlen,), start = struct.unpack_from("<H", buf, 8), 10
    elif major in (2, 3) and len(buf) >= 12:
        (hlen,), start = struct.unpack_from("<L", buf, 8), 12
    else:
        raise SourceError(f"{label}: corrupt .npy member (unsupported format version {major})")
    if start + hlen > len(buf):
        raise SourceError(f"{label}: corrupt or truncated .npy header")
    text = bytes(buf[start : start + hlen]).decode("utf-8" if major == 3 else "latin1")
    dtype, fortran, shape = _header_fields(text, label)
    count = 1
    for dim in shape:
        count *= dim
    offset = start + hlen
    nbytes = count * dtype.itemsize
    if len(buf) - offset != nbytes:
        raise SourceError(
            f"{label}: array data is {plural(len(buf) - offset, 'byte')}, header says {nbytes} "
            "(truncated or corrupt .npy)"
        )
    if nbytes == 0:
        flat = np.empty(count, dtype=dtype)
    else:
        flat = np.frombuffer(buf, dtype=dtype, count=count, offset=offset)
    if fortran:
        return flat.reshape(shape[::-1]).transpose()
    return flat.reshape(shape)


def _header_fields(text: str, label: str) -> tuple[np.dtype[Any], bool, tuple[int, ...]]:
    """``(dtype, fortran_order, shape)`` from a ``.npy`` header dict literal."""
    try:
        header = _Literal(text).parse()
    except ValueError as exc:
        raise SourceError(f"{label}: corrupt .npy header ({exc})") from exc
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise SourceError(
            f"{label}: corrupt .npy header (keys {sorted(map(str, header))})"
            if isinstance(header, dict)
            else f"{label}: corrupt .npy header"
        )
    shape, fortran = header["shape"], header["fortran_order"]
    if not isinstance(shape, tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise SourceError(f"{label}: corrupt .npy header (shape {shape!r})")
    if not isinstance(fortran, bool):
        raise SourceError(f"{label}: corrupt .npy header (fortran_order {fortran!r})")
    try:
        dtype = np.lib.format.descr_to_dtype(header["descr"])
    except (TypeError, ValueError) as exc:
        raise SourceError(f"{label}: corrupt .npy header (descr {header['descr']!r})") from exc
    if dtype.hasobject:
        raise SourceError(f"{label} holds an object array; object arrays are refused")
    return dtype, fortran, shape


class _Literal:
    """Parser for the Python literals a ``.npy`` header uses: dict, tuple, list, str, int, bool.

    Replaces :func:`ast.literal_eval`, which is not thread-safe on this CPython.
    """

    _WORDS = {"True": True, "False": False, "None": None}

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def parse(self) -> Any:
        value = self._value()
        self._skip()
        if self.pos != len(self.text):
            raise ValueError(f"trailing text at {self.pos}")
        return value

    def _skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            self.pos += 1

    def _value(self) -> Any:
        self._skip()
        if self.pos >= len(self.text):
            raise ValueError("unexpected end")
        ch = self.text[self.pos]
        if ch == "{":
            items = self._sequence("}")
            return dict(self._pairs(items))
        if ch in "([":
            values = self._sequence(")" if ch == "(" else "]")
            return tuple(values) if ch == "(" else list(values)
        if ch in "'\"":
            return self._string(ch)
        return self._atom()

    def _pairs(self, items: list[Any]) -> list[tuple[Any, Any]]:
        if any(not isinstance(item, _Pair) for item in items):
            raise ValueError("dict entry without ':'")
        return [(item.key, item.value) for item in items]

    def _sequence(self, close: str) -> list[Any]:
        self.pos += 1
        values: list[Any] = []
        while True:
            self._skip()
            if self.pos < len(self.text) and self.text[self.pos] == close:
                self.pos += 1
                return values
            value = self._value()
            self._skip()
            if close == "}":
                if self.text[self.pos : self.pos + 1] != ":":
                    raise ValueError(f"expected ':' at {self.pos}")
                self.pos += 1
                value = _Pair(value, self._value())
                self._skip()
            values.append(value)
            nxt = self.text[self.pos : self.pos + 1]
            if nxt == ",":
                self.pos += 1
            elif nxt != close:
                raise ValueError(f"expected ',' or {close!r} at {self.pos}")

    def _string(self, quote: str) -> str:
        end = self.text.find(quote, self.pos + 1)
        if end < 0:
            raise ValueError("unterminated string")
        body = self.text[self.pos + 1 : end]
        if "\\" in body:
            raise ValueError("escapes in header strings are not supported")
        self.pos = end + 1
        return body

    def _atom(self) -> Any:
        start = self.pos
        while self.pos < len(self.text) and (
            self.text[self.pos].isalnum() or self.text[self.pos] in "-+_"
        ):
            self.pos += 1
        word = self.text[start : self.pos]
        if word in self._WORDS:
            return self._WORDS[word]
        if word.lstrip("-+").isdigit():
            return int(word.rstrip("L"))
        raise ValueError(f"unexpected {word or self.text[start : start + 1]!r} at {start}")


class _Pair:
    __slots__ = ("key", "value")

    def __init__(self, key: Any, value: Any) -> None:
        self.key, self.value = key, value
