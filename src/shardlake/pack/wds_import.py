"""``import-wds``: a WebDataset tar set -> one shardlake version, through the writer.

A WebDataset sample is the run of consecutive tar members sharing a key: the member path up to
the first dot of its file name (``dir/000123.ego.npy`` -> key ``dir/000123``, field
``ego.npy``). Each field becomes part of the sample by its last extension:

- ``.npy``: one array, named by the field without ``.npy`` (``ego.npy`` -> ``ego``; a bare
  ``npy`` field keeps the name ``npy``);
- ``.npz``: its arrays, under their own names;
- ``.json``: the sample's sidecar (one per sample);
- anything else whose bytes are numeric text (``.cls``, ``.txt``, ``.id``: ``"3"``,
  ``"0.5 1 2"``): an int64 array if every number is an integer, else float64; one number gives a
  0-d array, several a 1-d array, named by the field.

Members that are none of these (images, audio, pickles, text that is not numbers) are not
skipped: every one is named in the error, and nothing is published. The tars are read as
streams (``tarfile`` ``r|*``, gzip too), one sample at a time, from a local directory or any
store shardlake opens.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import SHOW_MAX, SourceError, UsageError
from ..source.npz import load_npz
from ..source.sidecar import parse_sidecar
from ..store import Store
from .packer import PackReport
from .writer import WriteOptions, Writer

__all__ = ["PARTITION_BY", "TAR_SUFFIXES", "import_wds", "tar_urls"]

PARTITION_BY = ("shard", "key")
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
# webdataset's own split (webdataset.tariterators.base_plus_ext): key, then the field.
_KEY_FIELD = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


@dataclass
class _Sample:
    key: str
    arrays: dict[str, np.ndarray[Any, Any]] = field(default_factory=dict)
    meta: dict[str, Any] | None = None


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


def _add_field(sample: _Sample, name: str, data: bytes, where: str) -> str | None:
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
            return f"'.{ext}' is not .npy, .npz, .json or numeric text"
        arrays = {name: array}
    for array_name, array in arrays.items():
        if array_name in sample.arrays:
            return f"array {array_name!r} appears twice in sample {sample.key!r}"
        sample.arrays[array_name] = array
    return None


def _samples(tar_name: str, store: Store, key: str, problems: list[str]) -> Iterator[_Sample]:
    """The samples of one tar (``tar_name`` names it in messages), in member order;
    unconvertible members go to ``problems``."""
    current: _Sample | None = None
    try:
        with (
            store.fs.open(store.path(key), "rb") as fh,
            tarfile.open(fileobj=fh, mode="r|*") as tar,
        ):
            for member in tar:
                if not member.isfile():
                    continue
                where = f"{tar_name}::{member.name}"
                match = _KEY_FIELD.match(member.name)
                if match is None:
                    problems.append(f"{where}: no extension after the key")
                    continue
                wkey, fname = match.group(1), match.group(2)
                if current is not None and current.key != wkey:
                    yield current
                    current = None
                if current is None:
                    current = _Sample(wkey)
                extracted = tar.extractfile(member)
                data = extracted.read() if extracted is not None else b""
                reason = _add_field(current, fname, data, where)
                if reason is not None:
                    problems.append(f"{where}: {reason}")
    except (tarfile.TarError, EOFError) as exc:
        problems.append(f"{tar_name}: not a readable tar file ({exc})")
        return  # the other tars are still read, so one run names every bad one
    except FileNotFoundError:
        problems.append(f"{tar_name}: no such tar file")
        return
    if current is not None:
        yield current


def import_wds(
    root: Store,
    tars: Sequence[tuple[str, Store, str]],
    tag: str,
    *,
    key_prefix: str = "",
    partition_by: str = "shard",
    base: str | None = None,
    options: WriteOptions | None = None,
) -> PackReport:
    """Import the WebDataset tars (``(url, store, key)`` each, opened by the caller: see
    :func:`tar_urls`) into ``root`` as version ``tag``.

    ``partition_by="shard"`` (default): one partition per tar, ``key_prefix + <tar name>``,
    keys ``<partition>/<webdataset key>``. ``partition_by="key"``: keys are ``key_prefix +
    <webdataset key>`` and a key's parent path is its partition (the keys need one).
    """
    if partition_by not in PARTITION_BY:
        raise UsageError(
            f"partition_by must be one of {', '.join(PARTITION_BY)}, not {partition_by!r}",
            options=("partition_by",),
        )
    problems: list[str] = []
    with Writer(root, tag, base=base, options=options) as writer:
        for url, store, key in tars:
            # shard: the tar is the partition, whatever directories its keys hold
            part = key_prefix + _stem(key) if partition_by == "shard" else None
            prefix = part + "/" if part is not None else key_prefix
            written = 0
            for sample in _samples(url, store, key, problems):
                if problems:
                    continue  # keep reading to name every unconvertible member
                try:
                    writer.write(prefix + sample.key, sample.arrays, sample.meta, partition=part)
                except SourceError as exc:
                    raise SourceError(f"{url}: {exc}") from exc
                written += 1
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
