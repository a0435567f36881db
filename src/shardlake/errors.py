"""The shardlake error hierarchy.

Every error shardlake raises on purpose derives from :class:`ShardlakeError`. Where a built-in
exception means the same thing, the shardlake error also inherits it, so callers can catch
``FileNotFoundError`` or ``ValueError`` without knowing shardlake.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# How many offending items (files, keys) one message or report names before "... and N more".
SHOW_MAX = 20


class ShardlakeError(Exception):
    """Root of every error shardlake raises on purpose.

    Parameters
    ----------
    *args
        The message (and any further arguments the built-in base takes).
    options
        Names of the settings that would fix the problem, in library terms (keyword arguments
        such as ``"shard_size"`` or ``"force"``); the CLI shows them as flags.
    hint
        The ``shardlake`` command that helps, in CLI words (``"all of them: shardlake versions
        ROOT"``). It is not part of the message, which speaks API terms: the CLI shows it, with
        ``ROOT`` replaced by the root it was given.
    """

    def __init__(self, *args: object, options: Sequence[str] = (), hint: str = "") -> None:
        super().__init__(*args)
        self.options: tuple[str, ...] = tuple(options)
        self.hint = hint

    def __reduce__(self) -> tuple[Any, ...]:
        # Our own reduce: errors cross process and Dask boundaries, and the built-in one (or
        # tblib's, which distributed installs) cannot rebuild a class with two built-in bases.
        return (_restore_error, (type(self), self.args, dict(self.__dict__)))


def _restore_error(
    cls: type[ShardlakeError], args: tuple[object, ...], state: dict[str, Any]
) -> ShardlakeError:
    error = cls(*args)
    error.__dict__.update(state)
    return error


class NotFoundError(ShardlakeError, LookupError):
    """A named thing (version tag, keyset, partition, sample key, stored object) does not exist."""


class ConflictError(ShardlakeError, FileExistsError):
    """Another writer got there first (name taken, commit sequence advanced); re-run to retry."""


class ObjectsGoneError(ConflictError):
    """Objects a run wrote (or reused) were removed before it published, by gc: the message
    names the gc's grace and the run's lease; nothing was published; re-run."""

    def __init__(self, *args: object, missing: Sequence[str] = (), **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.missing: tuple[str, ...] = tuple(missing)


class GcHoldsRootError(ConflictError):
    """A gc held the root longer than the run's retry deadline; nothing was committed."""


# --- usage and input -------------------------------------------------------------------------


class UsageError(ShardlakeError, ValueError):
    """Invalid arguments or a combination of options that cannot work together."""


class UnknownOptionError(UsageError, TypeError):
    """A keyword that is no setting of the call or options object (a typo): the message names
    the nearest valid one. A ``TypeError`` too, as Python's own unknown keyword is."""


class InvalidURLError(UsageError):
    """A store URL that cannot be opened (unknown protocol, relative path, missing bucket)."""


class InvalidKeyError(UsageError):
    """A store key that is empty, absolute, or climbs out of the root with ``..``."""


class SourceError(ShardlakeError, ValueError):
    """A source file (npz or sidecar) that cannot be packed; the message names the file."""


class SourceFilesError(SourceError):
    """Several source files that cannot be packed; ``problems`` has one line per file."""

    def __init__(
        self, *args: object, problems: Sequence[str] = (), options: Sequence[str] = ()
    ) -> None:
        super().__init__(*args, options=options)
        self.problems: list[str] = list(problems)


class SelectionError(ShardlakeError, ValueError):
    """A ``WHERE`` expression or key list that cannot select samples."""


class PlanError(ShardlakeError, ValueError):
    """A loader plan that cannot be built within the given limits."""


class FormatError(ShardlakeError, ValueError):
    """An object in a root that does not follow the on-disk format (corrupt manifest, bad JSON)."""


# --- store -----------------------------------------------------------------------------------


class StoreError(ShardlakeError, OSError):
    """A storage operation failed."""


class KeyNotFoundError(StoreError, NotFoundError, FileNotFoundError):
    """The key does not exist in the store."""


class AlreadyExistsError(StoreError, ConflictError):
    """A create-if-absent write lost: the key already exists."""


class StorePermissionError(StoreError, PermissionError):
    """The store refused access (missing or insufficient credentials)."""


class TransientStoreError(StoreError):
    """A failure that may succeed when retried (5xx, throttling, reset connection, ESTALE)."""


class RetriesExhaustedError(StoreError):
    """A transient failure persisted through every allowed retry."""


class CapabilityError(StoreError):
    """The store does not keep a promise shardlake needs (e.g. it ignores If-None-Match)."""


class ReadOnlyStoreError(CapabilityError):
    """The store can only be read (an ``http://`` or ``https://`` root): a command that would
    write is refused before it does anything."""


class OutcomeUnknownError(StoreError):
    """A write whose reply was lost and whose effect could not be read back before the deadline:
    it may or may not have taken effect."""


class BucketNotFoundError(StoreError, FileNotFoundError):
    """The bucket a store URL names does not exist (never mistaken for an absent key)."""


class EndpointError(StoreError):
    """The endpoint does not speak the store's protocol (e.g. a web server that is not S3)."""


class CredentialsMissingError(StorePermissionError):
    """No credentials were found for the store."""


class CredentialsRejectedError(StorePermissionError):
    """The store rejected the credentials themselves (unknown key id, wrong secret)."""


# --- datasets --------------------------------------------------------------------------------


class VersionNotFoundError(NotFoundError):
    """The version tag is unknown in this root."""


class VersionRedactedError(VersionNotFoundError):
    """The version was redacted by ``forget``; the message names the forget and the successor
    version (``forget_id``, ``successor``: ``tag@hash``)."""

    def __init__(
        self,
        *args: object,
        forget_id: str = "",
        successor: str = "",
        options: Sequence[str] = (),
        hint: str = "",
    ) -> None:
        super().__init__(*args, options=options, hint=hint)
        self.forget_id = forget_id
        self.successor = successor


class IntegrityError(ShardlakeError, OSError):
    """Stored bytes do not match their checksum; the message names store, shard, key and offset."""


class PackWorkerError(ShardlakeError, RuntimeError):
    """One or more partition builds failed or their worker died; nothing was published."""


__all__ = [
    "AlreadyExistsError",
    "BucketNotFoundError",
    "CapabilityError",
    "ConflictError",
    "CredentialsMissingError",
    "CredentialsRejectedError",
    "EndpointError",
    "FormatError",
    "GcHoldsRootError",
    "IntegrityError",
    "InvalidKeyError",
    "InvalidURLError",
    "KeyNotFoundError",
    "NotFoundError",
    "ObjectsGoneError",
    "OutcomeUnknownError",
    "PackWorkerError",
    "PlanError",
    "ReadOnlyStoreError",
    "RetriesExhaustedError",
    "SHOW_MAX",
    "SelectionError",
    "ShardlakeError",
    "SourceError",
    "SourceFilesError",
    "StoreError",
    "StorePermissionError",
    "TransientStoreError",
    "UnknownOptionError",
    "UsageError",
    "VersionNotFoundError",
    "VersionRedactedError",
]
