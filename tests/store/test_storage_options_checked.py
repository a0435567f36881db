"""Storage options are checked against what the protocol's filesystem accepts (#29 item 6):
an unknown one is a usage error naming it and the nearest valid one, never an internal error."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shardlake.errors import UsageError
from shardlake.store import open_store
from shardlake.store.backends.options import accepted_options, check_storage_options


@pytest.mark.parametrize(
    ("url", "option", "nearest"),
    [
        ("s3://bucket/x", "endpoint", "endpoint_url"),
        ("s3://bucket/x", "secret_key", "secret"),
        ("s3://bucket/x", "retry_dedline", "retry_deadline"),
        ("gs://bucket/x", "tokn", "token"),
        ("az://container/x", "acount_name", "account_name"),
        ("file:///tmp/x", "auto_mkdr", "auto_mkdir"),
        ("memory://x", "global_stor", "global_store"),
    ],
)
def test_an_unknown_option_names_itself_and_the_nearest_valid_one(url, option, nearest):
    with pytest.raises(UsageError) as info:
        open_store(url, {option: "SECRET-VALUE"}).exists("k")  # refused before any request
    message = str(info.value)
    assert f"unknown storage option {option!r} for {url.split(':')[0]}://" in message
    assert message.endswith(f"did you mean {nearest}?")
    assert "SECRET-VALUE" not in message


def test_an_option_with_nothing_near_lists_the_valid_ones():
    with pytest.raises(UsageError, match=r"unknown storage option 'zzz' .*; valid: .*auto_mkdir"):
        check_storage_options("file", {"zzz": 1})


def test_every_option_the_filesystems_document_is_accepted():
    import fsspec

    for protocol, options in {
        "s3": {"endpoint_url", "key", "secret", "client_kwargs", "config_kwargs", "profile"},
        "gs": {"token", "project", "endpoint_url", "block_size", "requests_timeout"},
        "az": {"connection_string", "account_name", "account_key", "exclude_cli_credential"},
        "file": {"auto_mkdir", "skip_instance_cache", "use_listings_cache"},
        "memory": {"skip_instance_cache"},
        "http": {"headers", "client_kwargs", "auth"},
    }.items():
        accepted = accepted_options(fsspec.get_filesystem_class(protocol))
        assert accepted is not None and options <= accepted, (protocol, options - accepted)
        check_storage_options(protocol, dict.fromkeys(options))


def test_the_cli_reports_a_mistyped_option_as_a_usage_error():
    argv = [sys.executable, "-m", "shardlake.cli.main", "versions", "s3://bucket/x"]
    argv += ["--storage-option", "endpoint=http://127.0.0.1:9"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2
    assert "internal error" not in proc.stderr and "TypeError" not in proc.stderr
    assert "unknown storage option 'endpoint' for s3://" in proc.stderr
    assert "did you mean endpoint_url?" in proc.stderr


def test_the_keyword_dictionaries_s3fs_hands_to_botocore_are_checked_too():
    with pytest.raises(UsageError, match=r"'client_kwargs.endpoint' .* did you mean client_kwargs"):
        open_store("s3://bucket/x", {"client_kwargs": {"endpoint": "http://h:1"}}).exists("k")
    with pytest.raises(UsageError, match=r"did you mean config_kwargs.connect_timeout\?"):
        check_storage_options("s3", {"config_kwargs": {"connect_timout": 3}})
    check_storage_options(
        "s3",
        {
            "client_kwargs": {"endpoint_url": "http://h:1", "region_name": "r", "verify": False},
            "config_kwargs": {"retries": {"mode": "standard"}, "connector_args": {}},
        },
    )
