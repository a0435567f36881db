"""The names shardlake owns under a root (docs/format.md, "Names shardlake owns"): gc deletes
only these; anything else is foreign and left alone (tests/lifecycle/test_gc_scope.py)."""

from __future__ import annotations

from shardlake.format.layout import is_owned_key

# Objects a user may keep under a root, some in shardlake's own folders.
FOREIGN = [
    "notes.txt",
    "results/a.csv",
    "data/README.md",
    "data/0123456789ab/deadbeefdeadbeef/notes.txt",
    "versions/v1/notes.txt",
    "catalog/segments/short.parquet",
]


def test_owned_names_are_the_documented_shapes() -> None:
    owned = [
        "shardlake.json",
        "data/0123456789ab/0123456789abcdef01234567/shard-000000.tar",
        "data/0123456789ab/0123456789abcdef01234567/manifest-r0123456789abcdef0123456.parquet",
        "versions/v1/0123456789abcdef0123456789abcdef.json",
        "catalog/partitions/" + "a" * 64 + ".parquet",
        "catalog/versions/v1/0123456789abcdef.json",
        "commits/000000000001.json",
        "keysets/train.parquet",
        "leases/0123456789abcdef0123456789abcdef.json",
        "_shardlake/probe/abc",
    ]
    assert all(is_owned_key(k) for k in owned)
    assert not any(is_owned_key(k) for k in FOREIGN)
    assert not is_owned_key("data/0123456789ab/rev/shard-0.tar")
