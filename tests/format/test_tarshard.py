import io
import subprocess
import tarfile

import pytest

from shardlake.errors import FormatError
from shardlake.format.layout import member_name, unescape_member_key
from shardlake.format.tar import ShardWriter, iter_members

KEYS = ["log_a/log_a_tok1", "log.b/frame.v2", "x" * 120 + "/long", "uni/é ñ", "pct/100%2E"]


def _shard(keys):
    buf = io.BytesIO()
    writer = ShardWriter(buf)
    offsets = [writer.add(k, f"payload-{k}".encode()) for k in keys]
    predicted = writer.size_with("z", 0)
    writer.close()
    return buf.getvalue(), offsets, predicted, writer


def test_offsets_point_at_payloads_and_members_parse():
    data, offsets, _, writer = _shard(KEYS)
    assert writer.bytes_written == len(data)
    members = list(iter_members(data))
    assert [unescape_member_key(m.name.removesuffix(".safetensors.zst")) for m in members] == KEYS
    for key, (index, offset), member in zip(KEYS, offsets, members, strict=True):
        assert member.offset == offset
        assert data[offset : offset + member.size] == f"payload-{key}".encode()
        assert index == members.index(member)


def test_shards_are_byte_deterministic_and_gnu_tar_readable(tmp_path):
    first, *_ = _shard(KEYS)
    second, *_ = _shard(KEYS)
    assert first == second
    path = tmp_path / "s.tar"
    path.write_bytes(first)
    listing = subprocess.run(["tar", "tf", str(path)], capture_output=True, text=True, check=True)
    assert listing.stdout.splitlines() == [member_name(k) for k in KEYS]
    with tarfile.open(path) as archive:
        assert {m.mtime for m in archive} == {0}


def test_size_prediction_matches():
    buf = io.BytesIO()
    writer = ShardWriter(buf)
    writer.add("a", b"x" * 700)
    expect = writer.size_with("b", 1000)
    writer.add("b", b"y" * 1000)
    writer.close()
    assert len(buf.getvalue()) == expect


def test_member_names_split_like_webdataset():
    # webdataset splits key and extension at the first dot of the basename
    name = member_name("log.b/frame.v2")
    base = name.rsplit("/", 1)[-1]
    assert base.split(".", 1)[1] == "safetensors.zst"


def test_garbage_is_a_format_error():
    with pytest.raises(FormatError, match="shard-x"):
        list(iter_members(b"\x01" * 1024, "shard-x"))
