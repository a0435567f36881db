"""``shardlake.open(url)`` -> :class:`Root`: the one object a user holds for a dataset root.

A root is a store URL holding versions, keysets, partition revisions and the commit log. Its
methods are thin: they delegate to the pack and lifecycle modules, which do the work, and to
:class:`~shardlake.query.dataset.Dataset` for reading. The CLI calls exactly these methods.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TextIO, TypeVar

from ..errors import UsageError
from ..format.documents import GcLock
from ..format.layout import natural_key
from ..meta.commits import read_state
from ..meta.versions import Version, live_versions, version_of, versions_for
from ..options import build_options
from ..query.dataset import Dataset
from ..store import Store
from .door import HoldsStore, StoreLike, as_store, store_like
from .keysets import Keysets, deprecated

if TYPE_CHECKING:
    from ..lifecycle.export import ExportOptions, ExportReport, NpzExportReport
    from ..lifecycle.forget import ForgetReport
    from ..lifecycle.forget_check import ForgetCheckReport
    from ..lifecycle.forget_plan import ForgetOptions
    from ..lifecycle.gc import GcOptions, GcReport
    from ..lifecycle.prune import PruneReport
    from ..lifecycle.remove import RemoveOptions, RemoveReport
    from ..lifecycle.scrub import ScrubOptions, ScrubReport
    from ..lifecycle.verify import OffsetsOptions, OffsetsReport, VerifyOptions, VerifyReport
    from ..meta.catalog import CatalogInfo
    from ..meta.diff import VersionDiff
    from ..meta.keysets import Keyset
    from ..pack import PackOptions, PackReport
    from ..pack.writer import Writer
    from ..pack.written import WriteOptions
    from ..query.keyset_build import DisjointReport, KeysetReport
    from ..store.check import StoreReport

_O = TypeVar("_O")
P = ParamSpec("P")
R = TypeVar("R")


def _writes(
    method: Callable[Concatenate[Root, P], R],
) -> Callable[Concatenate[Root, P], R]:
    """A method that writes to the root: refused in one line, before it does anything, where
    the root is read-only (``http://``, ``https://``)."""

    @functools.wraps(method)
    def checked(self: Root, /, *args: P.args, **kwargs: P.kwargs) -> R:
        self.store.require_writable(method.__name__.replace("_", " "))
        return method(self, *args, **kwargs)

    return checked


class Root(HoldsStore):
    """A dataset root: its versions, keysets and the operations that change them.

    Get one with :func:`shardlake.open`. Every method reads the root's current state when
    called; writers publish through the commit log, so concurrent writers end with one winner
    and a :class:`~shardlake.errors.ConflictError` for the others.

    Parameters
    ----------
    store
        The opened store of the root.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    @property
    def url(self) -> str:
        """The root URL (credentials redacted)."""
        return self.store.url

    def __repr__(self) -> str:
        return f"Root({self.url!r})"

    # --- versions ------------------------------------------------------------------------------

    def versions(self) -> list[Version]:
        """Every live version, in publish order (their documents read concurrently).

        A location with no root (no marker, no commits) is refused: ``no shardlake root at``."""
        return live_versions(self.store)

    @property
    def latest(self) -> Version:
        """The version ``latest`` names (:class:`VersionNotFoundError` in an empty root)."""
        return self.version("latest")

    def version(self, tag: str = "latest") -> Version:
        """One live version by tag (``latest`` follows the commit log)."""
        return version_of(self.store, tag)

    def dataset(self, version: str | None = None, *, keyset: str | None = None) -> Dataset:
        """Open ``version`` (a tag or ``latest``) for reading; not given: the version ``keyset``
        is bound to, else ``latest``. A keyset bound to another version is refused."""
        return Dataset.open(self.store, version, keyset)

    def diff(self, a: str, b: str, *, samples: bool = False) -> VersionDiff:
        """What changed from version ``a`` to ``b``: partitions added, removed, with new data or
        only new metadata, and samples added, removed or with different payload bytes (their
        keys too with ``samples``). Reads only the catalog objects that differ."""
        from ..meta.diff import diff_tags

        return diff_tags(self.store, a, b, samples=samples)

    # --- keysets ---------------------------------------------------------------------------

    @property
    def keysets(self) -> Keysets:
        """The keyset verbs: ``root.keysets.create/list/get/rebase/delete/check_disjoint``
        (:class:`Keysets`). Calling it, ``root.keysets()``, lists them (deprecated: use
        ``root.keysets.list()``)."""
        return Keysets(self.store)

    def create_keyset(self, name: str, **kwargs: Any) -> Keyset:
        """Deprecated: :meth:`Keysets.create` (``root.keysets.create``)."""
        deprecated("create_keyset", "keysets.create")
        return self.keysets.create(name, **kwargs)

    def keyset(self, name: str) -> Keyset:
        """Deprecated: :meth:`Keysets.get` (``root.keysets.get``)."""
        deprecated("keyset", "keysets.get")
        return self.keysets.get(name)

    def rebase_keyset(self, name: str, version: str, **kwargs: Any) -> KeysetReport:
        """Deprecated: :meth:`Keysets.rebase` (``root.keysets.rebase``)."""
        deprecated("rebase_keyset", "keysets.rebase")
        return self.keysets.rebase(name, version, **kwargs)

    def delete_keyset(self, name: str) -> Keyset:
        """Deprecated: :meth:`Keysets.delete` (``root.keysets.delete``)."""
        deprecated("delete_keyset", "keysets.delete")
        return self.keysets.delete(name)

    def check_disjoint(self, a: str, b: str) -> DisjointReport:
        """Deprecated: :meth:`Keysets.check_disjoint` (``root.keysets.check_disjoint``)."""
        deprecated("check_disjoint", "keysets.check_disjoint")
        return self.keysets.check_disjoint(a, b)

    # --- writers -------------------------------------------------------------------------------

    @_writes
    def pack(
        self,
        source: str | os.PathLike[str],
        /,
        *,
        tag: str,
        base: str | None = None,
        options: PackOptions | None = None,
        progress_stream: TextIO | None = None,
        **overrides: Any,
    ) -> PackReport:
        """Pack the source tree ``source`` and publish it as version ``tag``.

        ``base`` reuses the unchanged partitions of that version. Settings are
        :class:`~shardlake.PackOptions` (``workers``, ``executor``, ``shard_size``,
        ``partition_depth``, ``path_list``, ``partitions``, ...), as an object or as keywords.
        """
        from ..pack import PackOptions, pack

        opts = build_options(PackOptions, options, overrides, "pack")
        return pack(
            self.store, source, tag=tag, base=base, options=opts, progress_stream=progress_stream
        )

    @_writes
    def writer(
        self,
        /,
        tag: str,
        *,
        base: str | None = None,
        options: WriteOptions | None = None,
        **overrides: Any,
    ) -> Writer:
        """A :class:`~shardlake.Writer` publishing version ``tag`` when its ``with`` block exits.

        ``base`` carries that version's partitions forward (a partition written again replaces
        its own; each key goes to the partition the base's partition rule gives, as pack
        would put it). Settings are :class:`~shardlake.WriteOptions` (``shard_size``,
        ``workers``, ``encode_threads``, ``spill_dir``, ...), as an object or as keywords.
        """
        from ..pack.writer import Writer
        from ..pack.written import WriteOptions

        opts = build_options(WriteOptions, options, overrides, "writer")
        return Writer(self.store, tag, base=base, options=opts)

    @_writes
    def write_bag(
        self,
        /,
        bag: Any,
        tag: str,
        *,
        base: str | None = None,
        options: WriteOptions | None = None,
        **overrides: Any,
    ) -> PackReport:
        """Write a ``dask.bag.Bag`` of ``(key, arrays, meta)`` records as version ``tag``.

        The cluster's workers build and write the partitions; this process publishes.
        Settings are :class:`~shardlake.WriteOptions`, as an object or as keywords.
        """
        from ..pack.bag import write_bag
        from ..pack.written import WriteOptions

        opts = build_options(WriteOptions, options, overrides, "write_bag")
        return write_bag(self.store, bag, tag, base=base, options=opts)

    @_writes
    def write_ray(
        self,
        /,
        dataset: Any,
        tag: str,
        base: str | None = None,
        options: WriteOptions | None = None,
        **overrides: Any,
    ) -> PackReport:
        """Write a ``ray.data.Dataset`` of ``{"key", <arrays>..., "meta"}`` rows as version ``tag``.

        Ray workers encode, verify and build the partitions (one task per partition); this
        process publishes once. The bytes are the writer's for the same samples. Settings are
        :class:`~shardlake.WriteOptions`, as an object or as keywords.
        """
        from ..pack.ray_write import write_ray
        from ..pack.written import WriteOptions

        opts = build_options(WriteOptions, options, overrides, "write_ray")
        return write_ray(self.store, dataset, tag, base=base, options=opts)

    @_writes
    def import_wds(
        self,
        source: str | os.PathLike[str] | Sequence[str],
        tag: str,
        *,
        key_prefix: str = "",
        partition_by: str = "shard",
        base: str | None = None,
        options: WriteOptions | None = None,
        source_storage_options: dict[str, Any] | None = None,
        skip_undecoded: bool = False,
        progress: bool | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> PackReport:
        """Import a WebDataset tar set (brace pattern, list or directory) as version ``tag``.

        ``partition_by="shard"`` (default): one partition per tar, ``key_prefix + <tar name>``,
        keys ``<partition>/<webdataset key>``. ``partition_by="key"``: keys are ``key_prefix +
        <webdataset key>`` and a key's parent path is its partition.
        ``source_storage_options`` open the source tars (``storage_options``, its old name,
        is deprecated). Members that are not .npy, .npz, .json or numeric text (images, audio,
        captions) are kept bit-exact as ``uint8`` arrays named by their field;
        ``skip_undecoded=True`` leaves them out. ``progress``: MB read on stderr (None: on a
        terminal only).
        """
        from ..pack.wds_import import TAR_SUFFIXES, import_wds, tar_urls
        from ..store.objects import open_objects

        if storage_options is not None:
            if source_storage_options is not None:
                raise UsageError(
                    "import_wds: give source_storage_options only (storage_options is its "
                    "deprecated name)",
                    options=("source_storage_options",),
                )
            warnings.warn(
                "Root.import_wds(storage_options=) is deprecated: they open the source tars, "
                "use source_storage_options=",
                DeprecationWarning,
                stacklevel=3,  # past _writes
            )
            source_storage_options = storage_options
        tars = open_objects(tar_urls(source), source_storage_options, suffixes=TAR_SUFFIXES)
        return import_wds(
            self.store,
            tars,
            tag,
            key_prefix=key_prefix,
            partition_by=partition_by,
            base=base,
            options=options,
            skip_undecoded=skip_undecoded,
            progress=progress,
        )

    @_writes
    def remove(
        self, tag: str, /, options: RemoveOptions | None = None, **overrides: Any
    ) -> RemoveReport:
        """Publish ``tag``: a version without some partitions or samples (no new shards).

        Settings are :class:`~shardlake.RemoveOptions` (``base``; exactly one of
        ``partitions``, ``keys``, ``where`` and ``key_file``; ``strip_prefix``), as an object
        or as keywords."""
        from ..lifecycle.remove import RemoveOptions, remove

        return remove(self.store, tag, build_options(RemoveOptions, options, overrides, "remove"))

    @_writes
    def forget(self, /, options: ForgetOptions | None = None, **overrides: Any) -> ForgetReport:
        """Erase samples from every retained version and keyset, in one commit, with a receipt.

        Each affected tag gets a redacted successor (same tag, new hash); only the shards that
        held the samples are rewritten; superseded objects are deleted at once. Settings are
        :class:`~shardlake.ForgetOptions` (exactly one of ``keys``, ``key_file`` and
        ``where``; ``reason`` (required); ``dry_run``; ``executor``, ``workers``), as an object
        or as keywords."""
        from ..lifecycle.forget import forget
        from ..lifecycle.forget_plan import ForgetOptions

        return forget(self.store, build_options(ForgetOptions, options, overrides, "forget"))

    def check_forget(self, forget_id: str | None = None) -> ForgetCheckReport:
        """Re-read every object under the root and prove that none holds a key or payload a
        forget erased (that forget's receipt only, with ``forget_id``)."""
        from ..lifecycle.forget_check import check_forget

        return check_forget(self.store, forget_id)

    @_writes
    def prune(self, tags: Sequence[str], *, force: bool = False) -> PruneReport:
        """Prune version ``tags`` (``force`` to prune the one ``latest`` names); their
        bytes go at the next :meth:`gc`."""
        from ..lifecycle.prune import prune

        return prune(self.store, tags, force=force)

    @_writes
    def gc(self, /, options: GcOptions | None = None, **overrides: Any) -> GcReport:
        """Delete objects no live version or keyset references, older than the grace period.

        Settings are :class:`~shardlake.GcOptions` (``grace_s``: seconds or a duration such
        as ``"6h"``; ``dry_run``; ``progress``), as an object or as keywords."""
        from ..lifecycle.gc import GcOptions, collect_garbage

        return collect_garbage(self.store, build_options(GcOptions, options, overrides, "gc"))

    def gc_lock(self) -> GcLock | None:
        """The lease of a gc holding the root, or None."""
        return read_state(self.store).gc_lock

    @_writes
    def break_gc_lock(self) -> GcLock | None:
        """Release the lock of a gc known to be dead; returns the lock it released."""
        from ..lifecycle.gc import break_lock

        return break_lock(self.store).gc_lock

    # --- checks and copies ---------------------------------------------------------------------

    def scrub(
        self, version: str | None = None, *, options: ScrubOptions | None = None, **overrides: Any
    ) -> ScrubReport:
        """Re-read every payload of ``version`` (default ``latest``; ``all_versions=True``:
        every live version) and check it. Settings are :class:`~shardlake.ScrubOptions`
        (``workers``, ``batch_bytes``, ``executor``, ``progress``, ...), as an object or as
        keywords."""
        from ..lifecycle.scrub import ScrubOptions, scrub

        return scrub(self.store, _build(ScrubOptions, options, overrides, "scrub", version))

    def export(
        self,
        dest: StoreLike,
        *,
        dest_storage_options: dict[str, Any] | None = None,
        options: ExportOptions | None = None,
        **overrides: Any,
    ) -> ExportReport | NpzExportReport:
        """Copy a version to ``dest``: a URL (opened with ``dest_storage_options``) or an
        opened :class:`Root`. Settings are :class:`~shardlake.ExportOptions` (``version``,
        ``keysets``, ``format`` ``"root"`` or ``"npz"``, ``allow_foreign``, ``workers``,
        ``executor``, ``progress``), as an object or as keywords. Re-running resumes."""
        from ..lifecycle.export import ExportOptions, export

        target = as_store(
            dest, dest_storage_options, name="export(dest)", option="dest_storage_options"
        )
        opts = build_options(ExportOptions, options, overrides, "export")
        return export(self.store, target, opts)

    def verify(
        self,
        source: StoreLike | None = None,
        *,
        source_storage_options: dict[str, Any] | None = None,
        options: VerifyOptions | None = None,
        **overrides: Any,
    ) -> VerifyReport:
        """Prove a version equals the source tree ``source`` (a local path, a URL opened with
        ``source_storage_options``, or an opened :class:`~shardlake.Store`), bit for bit.

        Settings are :class:`~shardlake.lifecycle.verify.VerifyOptions` (``version``,
        ``allow_missing``, ``path_list``, ``executor``, ...), as an object or as keywords
        (keywords override the object; an unknown one fails at once, naming the nearest).
        A version without a source tree (written from Python, imported) is checked against
        its own checksums by :meth:`scrub`.
        """
        from ..lifecycle.verify import VerifyOptions, verify_version

        if source is None:
            raise UsageError(
                "verify compares a version with its source tree: give source; to check a "
                "version against its own checksums (one written from Python or imported has "
                "no source tree), use scrub(version)",
                options=("source",),
            )
        opts = build_options(VerifyOptions, options, overrides, "verify")
        source_store = as_store(
            source, source_storage_options, name="verify(source)", option="source_storage_options"
        )
        return verify_version(self.store, source_store, opts)

    @_writes
    def attach_catalogs(self, version: str | None = None) -> list[CatalogInfo]:
        """Write the catalog of ``version`` (default: every live version) where it was published
        before format 2 (idempotent: versions with a catalog are reported, not rewritten)."""
        from ..meta.catalog import attach_catalogs

        versions = versions_for(self.store, version, all_versions=version is None)
        return attach_catalogs(self.store, versions)

    @_writes
    def write_index(self) -> dict[str, Any]:
        """Write ``index.json`` from the commit log and the keysets: what a root published
        before the index existed needs before it can be served over HTTP (every publish, keyset
        change and prune rewrites it since). Returns what it names: ``commit``, ``versions``
        (``[tag, hash]`` pairs), ``latest``, ``keysets`` (names)."""
        from ..meta.commits import refresh_index

        index = refresh_index(self.store, strict=True)
        return {
            "commit": index.commit,
            "versions": [list(pair) for pair in index.versions],
            "latest": index.latest,
            "keysets": sorted(index.keysets, key=natural_key),
        }

    def verify_offsets(
        self,
        version: str | None = None,
        *,
        options: OffsetsOptions | None = None,
        **overrides: Any,
    ) -> OffsetsReport:
        """Check manifest offsets against the tar headers and manifests against the version
        (default ``latest``). Settings are :class:`~shardlake.OffsetsOptions` (``workers``,
        ``executor``, ``progress``), as an object or as keywords."""
        from ..lifecycle.verify import OffsetsOptions, verify_offsets

        opts = _build(OffsetsOptions, options, overrides, "verify_offsets", version)
        return verify_offsets(self.store, opts)


def _build(
    cls: type[_O], options: _O | None, overrides: dict[str, Any], where: str, version: str | None
) -> _O:
    """The options object of an operation whose first argument is the version it works on."""
    if version is not None:
        overrides = {**overrides, "version": version}
    return build_options(cls, options, overrides, where)


def open(url: StoreLike, **storage_options: Any) -> Root:  # noqa: A001
    """Open the dataset root at ``url``.

    Parameters
    ----------
    url
        ``/abs/path`` (or a relative local path), ``file://``, ``memory://``,
        ``s3://bucket/prefix``, ``gs://bucket/prefix``, an opened :class:`~shardlake.Store` or
        a :class:`Root` (:func:`as_store`; storage options go with a URL only).
    **storage_options
        fsspec storage options for the filesystem (``key``, ``secret``, ``endpoint_url``,
        ``token``, ...). fsspec's own config files and ``FSSPEC_<PROTOCOL>_<OPTION>``
        environment variables apply too; explicit options win.

    Returns
    -------
    Root
        The root; opening makes no request (a missing bucket or bad credentials surface on
        first use).
    """
    return Root(as_store(url, storage_options, name="shardlake.open(url)"))


__all__ = [
    "Keysets",
    "Root",
    "StoreLike",
    "as_store",
    "check_store",
    "store_like",
    "open",
]


def check_store(
    url: StoreLike, *, create_bucket: bool = False, **storage_options: Any
) -> StoreReport:
    """Run the named checks against the store at ``url`` (:func:`as_store`); never raises for a
    failed check (see :func:`shardlake.store.check.check_store`)."""
    from ..store.check import check_store as run_checks

    store = as_store(url, storage_options, name="check_store(url)")
    return run_checks(store, create_bucket=create_bucket)
