"""Read and validate the ``.json`` sidecar beside a sample's npz.

shardlake does not hard-code a sidecar schema: any JSON object is accepted and flattened into
manifest columns (see :func:`shardlake.format.manifest.build_manifest_table`). Only ``is_skipped`` has
a meaning here (skipped frames are left out unless ``--keep-skipped``), so it must be a bool.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..errors import SourceError
from ..format.documents import VersionRecord

__all__ = [
    "is_skipped",
    "parse_sidecar",
    "read_sidecar",
    "skipped_note",
]

SKIPPED_FIELD = "is_skipped"


def _reject_constant(name: str) -> Any:
    # NaN/Infinity are not JSON; Python's json would accept them silently.
    raise ValueError(f"non-standard JSON constant {name}")


def parse_sidecar(data: bytes, where: str) -> dict[str, Any]:
    """Parse sidecar bytes; :class:`SourceError` naming ``where`` if not a JSON object."""
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise SourceError(f"{where}: malformed sidecar JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise SourceError(f"{where}: sidecar must be a JSON object, not {type(doc).__name__}")
    skipped = doc.get(SKIPPED_FIELD)
    if skipped is not None and not isinstance(skipped, bool):
        raise SourceError(f"{where}: {SKIPPED_FIELD!r} must be true or false, not {skipped!r}")
    _check_values(doc, where, "")
    return doc


def _check_values(value: Any, where: str, path: str) -> None:
    if isinstance(value, dict):
        for name, inner in value.items():
            if not name:
                raise SourceError(
                    f"{where}: sidecar has an empty field name at {path or 'top level'}"
                )
            _check_values(inner, where, f"{path}.{name}" if path else name)
    elif isinstance(value, list):
        for inner in value:
            _check_values(inner, where, path + "[]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise SourceError(f"{where}: sidecar field {path!r} is not finite")


def read_sidecar(path: str | Path) -> dict[str, Any]:
    """Read and validate the sidecar at ``path``; errors name the file."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SourceError(f"{path}: cannot read sidecar ({exc.strerror or exc})") from exc
    return parse_sidecar(data, str(path))


def is_skipped(doc: dict[str, Any] | None) -> bool:
    return bool(doc and doc.get(SKIPPED_FIELD) is True)


def skipped_note(record: VersionRecord) -> str:
    """A clause for "matches no key" reports: how many ``is_skipped`` frames the version left
    out at pack time (they are in the source but not samples), or ``""`` when none were."""
    left_out = sum(p.skipped for p in record.partitions)
    if not left_out or record.keep_skipped:
        return ""
    return (
        f"the version left out {left_out} is_skipped frame(s) at pack time; drop skipped frames "
        "from the list or pack again keeping skipped frames"
    )
