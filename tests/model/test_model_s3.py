"""The model-based suite (tests/support/model.py) on S3: the same machine against a root on
the session's SeaweedFS server (loader workers reopen it with the storage options).

Fewer sequences than on local disk by default (every request is a loopback HTTP call);
``SHARDLAKE_MODEL_EXAMPLES`` raises it (see tests/model/test_model_local.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis.stateful import run_state_machine_as_test
from support.model import Place, machine_factory, model_settings, model_timeout

from shardlake.testing.servers import StoreServer


@pytest.mark.timeout(model_timeout())
def test_model_seaweedfs(
    tmp_path: Path, seaweedfs_server: StoreServer, model_dask_client: Any
) -> None:
    def new_root() -> tuple[str, dict[str, Any]]:
        return seaweedfs_server.fresh_url("model"), dict(seaweedfs_server.storage_options)

    place = Place(new_root, tmp_path, model_dask_client, gets=3)
    run_state_machine_as_test(machine_factory(place), settings=model_settings(4))
    print(f"model suite, SeaweedFS: {place.summary()}")
