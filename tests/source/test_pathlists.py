"""The one path-list parser: text or JSON, relative or absolute; errors name the entry's place."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import shardlake
from shardlake.errors import SelectionError, SourceError
from shardlake.source.pathlists import map_keys, parse_entries, source_npz_paths


def test_text_and_json_lists_give_the_same_entries() -> None:
    text = parse_entries(b"# frames\na/x.npz\n\n  b/y.npz  \n", "l.txt")
    assert [(e.text, e.where) for e in text] == [("a/x.npz", "l.txt:2"), ("b/y.npz", "l.txt:4")]
    listed = parse_entries(json.dumps(["a/x.npz", "b/y.npz"]).encode(), "l.json")
    assert [(e.text, e.where) for e in listed] == [
        ("a/x.npz", "l.json[0]"),
        ("b/y.npz", "l.json[1]"),
    ]


def test_errors_name_the_first_offending_entry_never_the_whole_file(tmp_path: Path) -> None:
    many = [f"/data/corpus/log/f{i:05d}.npz" for i in range(2000)]
    with pytest.raises(SourceError) as info:
        parse_entries(json.dumps([*many[:3], 7, *many[3:]]).encode(), "train.json")
    assert str(info.value).startswith("train.json[3]: entry '7' is not a path string")
    bad_json = ("[\n" + ",\n".join(json.dumps(p) for p in many[:5]) + ",\n]").encode()
    with pytest.raises(SourceError, match=r"^train\.json:7: not a valid JSON list") as info:
        parse_entries(bad_json, "train.json")
    assert len(str(info.value)) < 200
    # A one-line absolute JSON list read as if relative: the message stays short.
    listing = tmp_path / "one-line.txt"
    listing.write_text(" ".join(many))
    with pytest.raises(SourceError, match=r"one-line\.txt:1: .*\.\.\.") as info:
        shardlake.inspect_source(tmp_path, path_list=listing)
    assert len(str(info.value)) < 400


def test_absolute_entries_map_under_the_source_or_the_prefix(tmp_path: Path) -> None:
    src = tmp_path / "corpus"
    entries = parse_entries(json.dumps([f"{src}/a/x.npz", "b/y.npz"]), "l.json")
    assert source_npz_paths(entries, src) == ["a/x.npz", "b/y.npz"]
    moved = parse_entries(json.dumps(["/old/root/a/x.npz", "/elsewhere/b.npz"]), "l.json")
    with pytest.raises(SourceError, match=r"l\.json\[1\]: '/elsewhere/b\.npz' is absolute"):
        source_npz_paths(moved, src, strip_prefix="/old/root/")
    with pytest.raises(SourceError, match=r"l\.json\[0\]: .* not under the source"):
        source_npz_paths(moved, src)
    for bad, message in (("../up.npz", "relative path inside"), ("a/x.json", "not an .npz")):
        with pytest.raises(SourceError, match=message):
            source_npz_paths(parse_entries(bad, "l.txt"), src)
    with pytest.raises(SourceError, match=r"l\.txt:2: duplicate key 'a/x' \(first at l\.txt:1\)"):
        source_npz_paths(parse_entries(f"a/x.npz\n{src}/a/x.npz\n", "l.txt"), src)


def test_keys_map_through_the_shared_parser(
    tmp_path: Path, packed_root: Callable[..., tuple[Path, Path]]
) -> None:
    entries = parse_entries(json.dumps(["/src/a/x.npz", "/other/y.npz", "b/z.npz"]), "k.json")
    mapped = map_keys(entries, json_list=True, source="/src")
    assert mapped.keys == ["a/x", "b/z"] and mapped.unmapped == ["/other/y.npz"]
    assert mapped.local_paths == {"a/x": "/src/a/x.npz"}
    # A keyset's key file goes through the same parser (text list in file order).
    _, root_path = packed_root([2, 2])
    root = shardlake.open(str(root_path))
    keys = sorted(root.dataset().manifests(columns=["key"]).column("key").to_pylist())
    listing = tmp_path / "k.txt"
    listing.write_text(f"{keys[2]}\n{keys[0]}\n")
    # ... and the keyset keeps the file's order (the loader's unshuffled order follows it).
    assert root.keysets.create("t", key_file=str(listing)).keys == [keys[2], keys[0]]
    bad = tmp_path / "k.json"
    bad.write_bytes(b'["a", {"b": 1}]')
    with pytest.raises(SelectionError, match=r"k\.json\[1\]"):
        root.keysets.create("bad", key_file=str(bad))
