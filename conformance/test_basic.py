"""Reads, writes, ranges and listing: the same promises on every backend."""

import pytest

from shardlake.errors import AlreadyExistsError, KeyNotFoundError, StoreError, UsageError
from shardlake.store import Store


def test_write_read_stat_delete(store: Store) -> None:
    store.write("a/b.bin", b"hello")
    assert store.read("a/b.bin") == b"hello"
    assert store.exists("a/b.bin")
    assert not store.exists("a/c.bin")
    assert not store.exists("a")  # a directory-like prefix is not an object
    info = store.stat("a/b.bin")
    assert (info.key, info.size) == ("a/b.bin", 5)
    store.write("a/b.bin", b"bye")  # overwrite
    assert store.read("a/b.bin") == b"bye"
    store.delete("a/b.bin")
    store.delete("a/b.bin")  # a missing key is not an error
    assert not store.exists("a/b.bin")
    with pytest.raises(KeyNotFoundError) as caught:
        store.read("a/b.bin")
    assert isinstance(caught.value, FileNotFoundError)
    assert "a/b.bin" in str(caught.value)
    with pytest.raises(KeyNotFoundError):
        store.stat("a/b.bin")


def test_create_if_absent(store: Store) -> None:
    store.create("doc.json", b"first")
    with pytest.raises(AlreadyExistsError) as caught:
        store.create("doc.json", b"second")
    assert isinstance(caught.value, FileExistsError)
    assert isinstance(caught.value, StoreError)
    assert store.read("doc.json") == b"first"
    # A re-sent create of the very same bytes (lost reply) is not a loss.
    store.create("doc.json", b"first")
    store.create("empty", b"")
    assert store.read("empty") == b""
    with pytest.raises(AlreadyExistsError):
        store.create("empty", b"x")
    store.ensure_create_enforced()


def test_range_edge_cases(store: Store) -> None:
    data = b"0123456789"
    store.write("f", data)
    store.write("empty", b"")
    assert store.read("empty") == b""
    assert store.size("empty") == 0
    assert store.read_range("empty", 0, 10) == b""
    assert store.read_range("empty", 0, 0) == b""
    assert store.read_range("empty", 5, 9) == b""
    for start, end in [(0, 10), (2, 5), (5, 5), (0, 1), (9, 10), (8, 20), (10, 20), (12, 30)]:
        assert store.read_range("f", start, end) == data[start:end], (start, end)
    with pytest.raises(KeyNotFoundError):
        store.read_range("missing", 0, 4)
    with pytest.raises(KeyNotFoundError):
        store.read_range("missing", 3, 3)
    with pytest.raises(UsageError):
        store.read_range("f", 5, 4)
    with pytest.raises(UsageError):
        store.read_range("f", -1, 4)


def test_many_ranges_in_one_call(store: Store) -> None:
    blob = bytes(range(256)) * 40  # 10240 bytes
    store.write("blob", blob)
    store.write("f", b"0123456789")
    store.write("empty", b"")
    ranges = [("blob", s, s + 97) for s in range(0, 10240, 211)]
    ranges += [("f", 3, 3), ("f", 8, 20), ("f", 10, 12), ("empty", 0, 5), ("blob", 10000, 11000)]
    ranges += [("empty", 0, 0), ("f", 0, 10), ("blob", 0, 1)]
    got = store.read_ranges(ranges)
    contents = {"blob": blob, "f": b"0123456789", "empty": b""}
    assert got == [contents[k][s:e] for k, s, e in ranges]
    assert store.read_ranges([]) == []
    with pytest.raises(KeyNotFoundError):
        store.read_ranges([("f", 0, 2), ("missing", 0, 2)])
    with pytest.raises(KeyNotFoundError):
        store.read_ranges([("f", 0, 2), ("missing", 1, 1)])


def test_prefix_listing_is_by_directory(store: Store) -> None:
    keys = ["c/x", "c/y/z", "c/y/zz", "cc/x", "ca", "d/c/x"]
    for key in keys:
        store.write(key, key.encode())
    assert store.list("c") == ["c/x", "c/y/z", "c/y/zz"]
    assert store.list("c/") == ["c/x", "c/y/z", "c/y/zz"]
    assert store.list("c/y") == ["c/y/z", "c/y/zz"]
    assert store.list("cc") == ["cc/x"]
    assert store.list("d") == ["d/c/x"]
    assert store.list("nope") == []
    assert store.list() == sorted(keys)
    assert store.list("") == sorted(keys)
    sizes = {info.key: info.size for info in store.list_info("c")}
    assert sizes == {"c/x": 3, "c/y/z": 5, "c/y/zz": 6}
    store.delete("c/x")
    assert store.list("c") == ["c/y/z", "c/y/zz"]  # no stale listing cache


def test_keys_with_spaces_and_unicode(store: Store) -> None:
    keys = ["with space/file name.bin", "ünïcødé/κλειδί 1.npz", "日本/データ", "plus+sign=eq,comma"]
    for i, key in enumerate(keys):
        store.create(key, f"payload {i}".encode())
    for i, key in enumerate(keys):
        assert store.read(key) == f"payload {i}".encode()
        assert store.read_range(key, 0, 7) == b"payload"
    assert store.list() == sorted(keys)
    assert store.list("ünïcødé") == ["ünïcødé/κλειδί 1.npz"]
    assert store.list("with space") == ["with space/file name.bin"]


def test_copy_between_stores(store: Store, store_factory) -> None:
    store.write("src/obj", b"x" * 1000)
    other = store_factory(label="copy").open()
    store.copy_to(other, "src/obj", "dst/obj")
    assert other.read("dst/obj") == b"x" * 1000
    assert other.list() == ["dst/obj"]


def test_prefix_is_not_an_object(store: Store) -> None:
    store.write("dir/obj", b"1")
    for attempt in (lambda: store.read("dir"), lambda: store.read_range("dir", 0, 1)):
        with pytest.raises(KeyNotFoundError):
            attempt()
    with pytest.raises(KeyNotFoundError):
        store.read("dir/obj/deeper")
    assert store.read_ranges([("dir/obj", 0, 1)]) == [b"1"]
