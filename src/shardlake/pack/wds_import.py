"""``import-wds``: a WebDataset tar set -> one shardlake version, through the writer.

A WebDataset sample is the tar members sharing a key: the member path up to the first dot of
its file name (``dir/000123.ego.npy`` -> key ``dir/000123``, field ``ego.npy``; a leading
``./``, as ``tar cf x.tar -C dir .`` writes, is dropped). Members of one key are one sample
wherever they sit in the tar (a plain ``tar`` of a directory does not keep them adjacent), in
the order their keys first appear. Each field becomes part of the sample by its last
extension:

- ``.npy``: one array, named by the field without ``.npy`` (``ego.npy`` -> ``ego``; a bare
  ``npy`` field keeps the name ``npy``);
- ``.npz``: its arrays, under their own names;
- ``.json``: the sample's sidecar (one per sample);
- anything else whose bytes are numeric text (``.cls``, ``.txt``, ``.id``: ``"3"``,
  ``"0.5 1 2"``): an int64 array if every number is an integer, else float64; one number gives a
  0-d array, several a 1-d array, named by the field;
- anything else (images, audio, captions, pickles): its bytes, bit-exact, as a 1-d ``uint8``
  array named by the field (``jpg``, ``left.png``, ``txt``); ``skip_undecoded=True`` leaves
  them out instead.

Every tar is checked as a whole before any of its samples is written: a header whose checksum
is wrong, a member cut short and a tar that ends without its end-of-archive marker are refused
with the tar's name and the byte offset (``tarfile``'s stream reader would take the first two
for the end of the archive); so is a tar with no members. Nothing is published then. The tars
are read as streams (gzip too), one at a time, from a local directory or any store shardlake
opens; a tar's member bytes wait in a spooled temporary file (memory, then the spill
directory) until its samples are grouped.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from ..errors import SHOW_MAX, SourceError, UsageError
from ..progress.bar import Progress
from ..source.npz import load_npz
from ..source.sidecar import parse_sidecar
from ..store import Store
from .packer import PackReport
from .writer import Writer
from .written import WriteOptions

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self: Python 3.11+

__all__ = ["PARTITION_BY", "TAR_SUFFIXES", "import_wds", "tar_urls"]

PARTITION_BY = ("shard", "key")
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
# webdataset's own split (webdataset.tariterators.base_plus_ext): key, then the field.
_KEY_FIELD = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
# A tar's member bytes stay in memory up to this size, then go to a temporary file.
_SPOOL_IN_MEMORY = 64 * 2**20
# What tarfile's header parser raises; not in its __all__ (nor in typeshed).
_EOF_HEADER: type[Exception] = vars(tarfile)["EOFHeaderError"]
_EMPTY_HEADER: type[Exception] = vars(tarfile)["EmptyHeaderError"]
_TRUNCATED_HEADER: type[Exception] = vars(tarfile)["TruncatedHeaderError"]


@dataclass
class _Sample:
    key: str
    arrays: dict[str, np.ndarray[Any, Any]] = field(default_factory=dict)
    meta: dict[str, Any] | None = None
    skipped: int = 0  # members left out (skip_undecoded)


def tar_urls(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
) -> list[str]:
    """The tar files of ``source``: a brace pattern, a list, a directory or one tar URL."""
    if isinstance(source, (str, os.PathLike)):
        text = _absolute(os.fspath(source))
        if "{" in text:
            from braceexpand import braceexpand

            return [_absolute(u) for u in braceexpand(text)]
        return [text]
    urls = [_absolute(os.fspath(s)) for s in source]
    if not urls:
        raise UsageError("import-wds: the source list is empty")
    return urls


def _absolute(source: str) -> str:
    return source if "://" in source else os.path.abspath(os.path.expanduser(source))


def _stem(name: str) -> str:
    """A tar's partition name: its path under the directory given (or its file name), less
    the suffix, so that ``a/x.tar`` and ``b/x.tar`` stay apart."""
    base = name.strip("/")
    for suffix in TAR_SUFFIXES:
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base


def _numeric_text(data: bytes) -> np.ndarray[Any, Any] | None:
    try:
        tokens = data.decode("ascii").split()
    except UnicodeDecodeError:
        return None
    if not tokens:
        return None
    try:
        values: Any = [int(t) for t in tokens]
        array = np.array(values, dtype=np.int64)
    except (ValueError, OverflowError):
        try:
            array = np.array([float(t) for t in tokens], dtype=np.float64)
        except ValueError:
            return None
    return array.reshape(()) if len(tokens) == 1 else array


def _add_field(
    sample: _Sample, name: str, data: bytes, where: str, *, skip_undecoded: bool = False
) -> str | None:
    """Put one member into ``sample``; the reason it cannot be converted, or None."""
    ext = name.rsplit(".", 1)[-1].lower()
    stem = name[: -len(ext) - 1] if "." in name else name
    arrays: dict[str, np.ndarray[Any, Any]]
    if ext == "json":
        if sample.meta is not None:
            return "a second .json member (one sidecar per sample)"
        try:
            sample.meta = parse_sidecar(data, where)
        except SourceError as exc:
            return str(exc).removeprefix(f"{where}: ")
        return None
    if ext == "npy":
        try:
            arrays = {stem or "npy": np.load(io.BytesIO(data), allow_pickle=False)}
        except (ValueError, OSError, EOFError) as exc:
            return f"not a readable .npy ({exc})"
    elif ext == "npz":
        try:
            arrays = load_npz(data, where)
        except SourceError as exc:
            return str(exc).removeprefix(f"{where}: ")
    else:
        array = _numeric_text(data)
        if array is None:
            if skip_undecoded:
                sample.skipped += 1
                return None
            array = np.frombuffer(data, dtype=np.uint8).copy()  # the bytes, bit-exact
        arrays = {name: array}
    for array_name, array in arrays.items():
        if array_name in sample.arrays:
            return f"array {array_name!r} appears twice in sample {sample.key!r}"
        sample.arrays[array_name] = array
    return None


class _TarDamage(Exception):
    """A tar that cannot be read to its end as it should be: where, and why."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.offset, self.reason = offset, reason


class _StrictInfo(tarfile.TarInfo):
    """Headers read strictly: ``tarfile`` ends the archive in silence at a header with a bad
    checksum, a cut header or the end of the data; only a zero block (the end-of-archive
    marker) may end it here."""

    @classmethod
    def fromtarfile(cls, tarfile_: tarfile.TarFile) -> Self:
        offset = tarfile_.fileobj.tell() if tarfile_.fileobj is not None else 0
        try:
            return super().fromtarfile(tarfile_)
        except _EOF_HEADER:
            raise  # a zero block: the end-of-archive marker
        except _EMPTY_HEADER:
            if offset == 0:
                raise _TarDamage(0, "an empty file") from None
            raise _TarDamage(
                offset, "it ends without the end-of-archive marker (cut short?)"
            ) from None
        except _TRUNCATED_HEADER:
            raise _TarDamage(offset, "a member header is cut short") from None
        except tarfile.HeaderError as exc:  # bad checksum, a field that is not a number
            raise _TarDamage(offset, f"a damaged member header ({exc})") from None


class _Counted(io.RawIOBase):
    """A read-only stream that reports the bytes read through it (progress)."""

    def __init__(self, raw: IO[bytes], report: Callable[[int], None]) -> None:
        self._raw, self._report = raw, report

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._raw.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self._report(n)
        return n


@dataclass
class _Field:
    name: str
    where: str
    start: int
    size: int


def _read_tar(fh: IO[bytes], spool: IO[bytes]) -> tuple[dict[str, list[_Field]], list[str], int]:
    """Every file member of the tar ``fh``, its bytes appended to ``spool``; by key in the
    order keys first appear, with the members whose names have no key, and how many there
    were. Raises :class:`_TarDamage`."""
    by_key: dict[str, list[_Field]] = {}
    nameless: list[str] = []
    members = 0
    opened: list[tarfile.TarFile] = []  # for the offset of a decompression failure
    try:
        with tarfile.open(fileobj=fh, mode="r|*", tarinfo=_StrictInfo) as tar:
            opened.append(tar)
            while True:
                try:
                    member = tar.next()
                except tarfile.ReadError as exc:  # skipping a member's data ran out of bytes
                    raise _TarDamage(tar.offset, f"a member is cut short ({exc})") from None
                if member is None:
                    break
                if not member.isfile():
                    continue
                members += 1
                name = member.name
                while name.startswith("./"):
                    name = name[2:]
                extracted = tar.extractfile(member)
                try:
                    data = extracted.read() if extracted is not None else b""
                except tarfile.ReadError:
                    raise _TarDamage(
                        member.offset,
                        f"member {member.name!r} is cut short (fewer than its {member.size} bytes)",
                    ) from None
                match = _KEY_FIELD.match(name)
                if match is None:
                    nameless.append(member.name)
                    continue
                start = spool.tell()
                spool.write(data)
                entry = _Field(match.group(2), member.name, start, len(data))
                by_key.setdefault(match.group(1), []).append(entry)
    except tarfile.CompressionError as exc:
        raise _TarDamage(0, f"cannot decompress it ({exc})") from None
    except (zlib.error, EOFError, tarfile.ReadError) as exc:
        offset = opened[0].offset if opened else 0
        raise _TarDamage(offset, f"cannot read it ({exc})") from None
    return by_key, nameless, members


def _samples(
    tar_name: str,
    store: Store,
    key: str,
    problems: list[str],
    *,
    skip_undecoded: bool = False,
    spill_dir: str | os.PathLike[str] | None = None,
    read: Callable[[int], None] = lambda n: None,
) -> Iterator[_Sample]:
    """The samples of one tar (``tar_name`` names it in messages), once the whole tar has
    been read and found sound; what is wrong goes to ``problems``."""
    with tempfile.SpooledTemporaryFile(
        max_size=_SPOOL_IN_MEMORY,
        dir=os.fspath(spill_dir) if spill_dir is not None else None,
        prefix="shardlake-wds-",
    ) as spool:
        try:
            with store.fs.open(store.path(key), "rb") as raw:
                fh = io.BufferedReader(_Counted(raw, read), buffer_size=1 << 20)
                by_key, nameless, members = _read_tar(fh, spool)
        except _TarDamage as exc:
            problems.append(
                f"{tar_name}: not a readable tar file: {exc.reason} at byte offset {exc.offset}"
                + (" of the decompressed stream" if key.endswith((".gz", ".tgz")) else "")
            )
            return  # the other tars are still read, so one run names every bad one
        except FileNotFoundError:
            problems.append(f"{tar_name}: no such tar file")
            return
        if members == 0:
            problems.append(f"{tar_name}: an empty tar (no file members)")
            return
        problems.extend(f"{tar_name}::{name}: no extension after the key" for name in nameless)
        for wkey, fields in by_key.items():
            sample = _Sample(wkey)
            for entry in fields:
                spool.seek(entry.start)
                data = spool.read(entry.size)
                where = f"{tar_name}::{entry.where}"
                reason = _add_field(sample, entry.name, data, where, skip_undecoded=skip_undecoded)
                if reason is not None:
                    problems.append(f"{where}: {reason}")
            if not sample.arrays and not problems:
                problems.append(
                    f"{tar_name}: sample {wkey!r} has no array left once its undecoded "
                    "members are skipped"
                    if sample.skipped
                    else f"{tar_name}: sample {wkey!r} has no array (only a sidecar)"
                )
            yield sample


class _MegabyteCounter:
    """Bytes read -> whole MB on the progress bar."""

    def __init__(self, bar: Progress) -> None:
        self._bar, self._bytes, self._shown = bar, 0, 0

    def __call__(self, n: int) -> None:
        self._bytes += n
        mb = self._bytes // 10**6
        if mb > self._shown:
            self._bar.update(mb - self._shown)
            self._shown = mb

    def tar_done(self) -> None:
        mb = -(-self._bytes // 10**6)  # a tar's last partial MB, so the total is reached
        self._bar.update(mb - self._shown, groups=1)
        self._shown = mb


def import_wds(
    root: Store,
    tars: Sequence[tuple[str, Store, str]],
    tag: str,
    *,
    key_prefix: str = "",
    partition_by: str = "shard",
    base: str | None = None,
    options: WriteOptions | None = None,
    skip_undecoded: bool = False,
    progress: bool | None = None,
) -> PackReport:
    """Import the WebDataset tars (``(url, store, key)`` each, opened by the caller: see
    :func:`tar_urls`) into ``root`` as version ``tag``.

    ``partition_by="shard"`` (default): one partition per tar, ``key_prefix + <tar name>``,
    keys ``<partition>/<webdataset key>``. ``partition_by="key"``: keys are ``key_prefix +
    <webdataset key>`` and a key's parent path is its partition (the keys need one).
    ``skip_undecoded``: leave out members that are not .npy, .npz, .json or numeric text
    (kept as ``uint8`` byte arrays by default). ``progress``: MB of tar read on stderr (None:
    on a terminal only).
    """
    if partition_by not in PARTITION_BY:
        raise UsageError(
            f"partition_by must be one of {', '.join(PARTITION_BY)}, not {partition_by!r}",
            options=("partition_by",),
        )
    problems: list[str] = []
    spill_dir = options.spill_dir if options is not None else None
    # The tag, the root and the base are checked before any tar is read (nothing is held
    # until the writer's block is entered).
    writer = Writer(root, tag, base=base, options=options, op="import-wds")
    total = sum(store.size(key) for _, store, key in tars) if progress is not False else 0
    bar = Progress(
        -(-total // 10**6),
        "shardlake import-wds",
        unit="MB",
        groups=len(tars),
        group_unit="tars",
        enabled=progress,
    )
    read = _MegabyteCounter(bar)
    with bar, writer:
        for url, store, key in tars:
            # shard: the tar is the partition, whatever directories its keys hold
            part = key_prefix + _stem(key) if partition_by == "shard" else None
            prefix = part + "/" if part is not None else key_prefix
            written = 0
            samples = _samples(
                url,
                store,
                key,
                problems,
                skip_undecoded=skip_undecoded,
                spill_dir=spill_dir,
                read=read,
            )
            for sample in samples:
                if problems:
                    continue  # keep reading to name every unconvertible member
                try:
                    writer.write(prefix + sample.key, sample.arrays, sample.meta, partition=part)
                except SourceError as exc:
                    raise SourceError(f"{url}: {exc}") from exc
                written += 1
            read.tar_done()
            if part is not None and written and not problems:
                writer.finish_partition(part)  # built while the next tar is read
        if problems:
            more = len(problems) - SHOW_MAX
            raise SourceError(
                f"import-wds: {len(problems)} unreadable tar file(s) or member(s) that cannot be "
                "converted; nothing was published: "
                + "; ".join(problems[:SHOW_MAX])
                + (f"; ... and {more} more" if more > 0 else "")
            )
    return writer.report
