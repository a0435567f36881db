"""The model-based suite on local disk: random sequences of every way to make a version
(pack, pack --base, writer, write_bag, import-wds, remove, keysets, prune, gc, export), every
read path compared with a plain-Python model after each step (tests/support/model.py).

Default: a few sequences (CI: derandomized, so reproducible). The long profile::

    SHARDLAKE_MODEL_EXAMPLES=500 python -m pytest -p no:cacheprovider tests/model/test_model_local.py

(``SHARDLAKE_MODEL_STEPS`` sets the operations per sequence, default 6.) A failure prints the
operations that replay it, with each step's resolved arguments as notes.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis.stateful import run_state_machine_as_test
from support.model import Place, machine_factory, model_settings, model_timeout


@pytest.mark.timeout(model_timeout())
def test_model_local_disk(tmp_path: Path, model_dask_client: Any) -> None:
    def new_root() -> tuple[str, dict[str, Any]]:
        return str(tmp_path / f"root-{uuid.uuid4().hex[:8]}"), {}

    place = Place(new_root, tmp_path, model_dask_client)
    run_state_machine_as_test(machine_factory(place), settings=model_settings(12))
    print(f"model suite, local disk: {place.summary()}")
