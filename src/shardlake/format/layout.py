"""Where each object lives in a dataset root (format version 1). See ``docs/format.md``.

::

    shardlake.json                                   root marker (format, dataset_id)
    index.json                                       root index: tags, latest, keysets (GET-only readers)
    data/<pid>/<data_rev>/shard-000000.tar           shards of one partition revision
    data/<pid>/<data_rev>/manifest-<manifest_rev>.parquet
    versions/<tag>/<version_hash>.json               version records (immutable)
    catalog/partitions/<sha256>.parquet              partitions table of a version (format 2)
    catalog/segments/<sha256>.parquet                catalog rows, log-structured (format 2)
    catalog/versions/<tag>/<version_hash>.json       catalog attached to a format-1 version
    commits/<seq:012d>.json                          commit log; the highest seq is "latest"
    keysets/<name>.parquet                           keysets (immutable, create-if-absent)
    receipts/<forget_id>.json                        forget receipts (never deleted by gc)
    leases/<id>.json                                 a running writer's lease (what gc must keep)
"""

from __future__ import annotations

import hashlib
import re

from ..errors import UsageError

__all__ = [
    "COMMITS_DIR",
    "DATA_DIR",
    "FORMAT_VERSION",
    "KEYSETS_DIR",
    "LEASES_DIR",
    "MEMBER_SUFFIX",
    "PROBE_DIR",
    "RECORD_FORMAT_VERSION",
    "ROOT_INDEX",
    "ROOT_MARKER",
    "check_name",
    "commit_key",
    "commit_seq",
    "escape_member_key",
    "is_owned_key",
    "keyset_key",
    "lease_key",
    "manifest_key",
    "member_name",
    "natural_key",
    "partition_id",
    "RECEIPTS_DIR",
    "receipt_key",
    "revision_dir",
    "shard_key",
    "short_hash",
    "unescape_member_key",
    "version_key",
]

# Format of shards and manifests (part of a pack recipe: a change rebuilds every revision).
FORMAT_VERSION = 1
# Format of version records and the root (2: partitions and rows in the per-version catalog).
RECORD_FORMAT_VERSION = 2
ROOT_MARKER = "shardlake.json"
# Rewritten at every commit and keyset change: the one mutable document (docs/format.md, 12).
ROOT_INDEX = "index.json"
DATA_DIR = "data"
VERSIONS_DIR = "versions"
COMMITS_DIR = "commits"
KEYSETS_DIR = "keysets"
LEASES_DIR = "leases"
RECEIPTS_DIR = "receipts"
PROBE_DIR = "_shardlake"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_COMMIT_RE = re.compile(r"^commits/(\d{12})\.json$")
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
# The names shardlake writes (docs/format.md, "Names shardlake owns"). Anything else under a root
# is foreign: gc never deletes it, whatever its age.
_OWNED_RE = re.compile(
    "|".join(
        (
            re.escape(ROOT_MARKER),
            re.escape(ROOT_INDEX),
            rf"{DATA_DIR}/[0-9a-z]{{1,64}}/[0-9a-z]{{1,64}}/shard-\d{{6}}\.tar",
            rf"{DATA_DIR}/[0-9a-z]{{1,64}}/[0-9a-z]{{1,64}}/manifest-[0-9a-z]{{1,64}}\.parquet",
            rf"{VERSIONS_DIR}/{_NAME}/[0-9a-f]{{1,64}}\.json",
            r"catalog/(?:partitions|segments)/[0-9a-f]{64}\.parquet",
            rf"catalog/versions/{_NAME}/[0-9a-f]{{1,64}}\.json",
            rf"{COMMITS_DIR}/\d{{12}}\.json",
            rf"{KEYSETS_DIR}/{_NAME}\.(?:parquet|json)",
            rf"{RECEIPTS_DIR}/[0-9a-f]{{32}}\.json",
            rf"{LEASES_DIR}/[0-9a-f]{{32}}\.json",
            rf"{PROBE_DIR}/.+",
        )
    )
)


def is_owned_key(key: str) -> bool:
    """True if ``key`` has the name shape of an object shardlake writes (see docs/format.md)."""
    return _OWNED_RE.fullmatch(key) is not None


_DIGITS_RE = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key for names as people read them: ``train`` < ``train-list``, ``v2`` < ``v10``."""
    return tuple(
        (1, int(part)) if part.isdigit() else (0, part) for part in _DIGITS_RE.split(name) if part
    )


def check_name(kind: str, name: str) -> str:
    """Validate a tag or keyset name: letters, digits, ``.``, ``_``, ``-``; at most 128."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or name in ("latest",):
        raise UsageError(
            f"invalid {kind} {name!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (and not 'latest')"
        )
    return name


def short_hash(*parts: str | bytes, length: int = 16) -> str:
    """Hex SHA-256 prefix over ``parts`` (each length-prefixed, so concatenations can't collide)."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8") if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:length]


def partition_id(relpath: str) -> str:
    """Stable 12-hex-digit id of a partition from its path relative to the source."""
    return short_hash("partition", relpath, length=12)


def revision_dir(pid: str, data_rev: str) -> str:
    return f"{DATA_DIR}/{pid}/{data_rev}"


def shard_key(pid: str, data_rev: str, index: int) -> str:
    return f"{revision_dir(pid, data_rev)}/shard-{index:06d}.tar"


def manifest_key(pid: str, data_rev: str, manifest_rev: str) -> str:
    return f"{revision_dir(pid, data_rev)}/manifest-{manifest_rev}.parquet"


def version_key(tag: str, version_hash: str) -> str:
    return f"{VERSIONS_DIR}/{tag}/{version_hash}.json"


def commit_key(seq: int) -> str:
    return f"{COMMITS_DIR}/{seq:012d}.json"


def commit_seq(key: str) -> int | None:
    """The sequence number of a commit-log key, or None for anything else."""
    match = _COMMIT_RE.match(key)
    return int(match.group(1)) if match else None


def keyset_key(name: str) -> str:
    return f"{KEYSETS_DIR}/{name}.parquet"


def lease_key(lease_id: str) -> str:
    return f"{LEASES_DIR}/{lease_id}.json"


def receipt_key(forget_id: str) -> str:
    return f"{RECEIPTS_DIR}/{forget_id}.json"


def escape_member_key(key: str) -> str:
    """Reversibly escape a sample key for a tar member name (webdataset splits at the first dot).

    ``%`` becomes ``%25`` and ``.`` becomes ``%2E``; ``/`` stays (webdataset keeps directories).
    """
    return key.replace("%", "%25").replace(".", "%2E")


def unescape_member_key(escaped: str) -> str:
    return escaped.replace("%2E", ".").replace("%25", "%")


MEMBER_SUFFIX = ".safetensors.zst"


def member_name(key: str) -> str:
    return escape_member_key(key) + MEMBER_SUFFIX
