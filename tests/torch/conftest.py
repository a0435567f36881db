"""Corpora shared by the loader tests."""

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def mix_roots(packed_root: Callable[..., tuple[Path, Path]]) -> tuple[str, str, str]:
    """Three roots of 80, 40 and 12 samples in 2, 1 and 2 logs: the sources of the mix tests."""
    a = packed_root([30, 50], name="mix-a", seed=1)[1]
    b = packed_root([40], name="mix-b", seed=2)[1]
    c = packed_root([7, 5], name="mix-c", seed=3)[1]
    return str(a), str(b), str(c)
