"""Synthetic driving-frame corpora shaped like the real ones (see the reference in ``docs``).

``synth_corpus(dest, partitions, samples, seed=...)`` writes ``<log_dir>/<log_dir>_<token>.npz``
frames plus a ``.json`` sidecar beside each. With ``layout="converter"`` the tree is shaped like
the output of Diffusion-Planner's C++ converter instead:
``<location>/<split>/<date>/<time>/<time>_<token>.npz`` + a sidecar per frame (no string ids such
as ``log_file_id``), plus ``<...>/<time>/routes/<time>_<n>.json`` route summaries, which are not
frame sidecars. Two frame formats:

* ``v2`` - 18 float/bool/int arrays incl. ``version`` (uint32); ``neighbors`` sets N (real: 320).
* ``nuplan`` - 12 arrays incl. the 0-d unicode strings ``map_name`` and ``token``.

Padding rows are zero and coordinates are quantised like sensor data, so the frames compress
about as well as real ones (a v2 frame with N=320 is ~1.2 MB raw). Everything is a function of
``seed``: the same call writes byte-identical files (the npz zip entries carry a fixed date).

synth never touches an existing file: it refuses a target that already holds files unless
``add=True``, and even then it refuses, before writing anything, a run whose paths (file names
are a function of ``seed``) collide with existing ones; every file is created exclusively.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConflictError
from ..progress.bar import Progress, plural

__all__ = [
    "SynthResult",
    "npz_bytes",
    "synth_corpus",
    "write_npz",
]

FORMATS = ("v2", "nuplan")
LAYOUTS = ("flat", "converter")
_LOCATIONS = ("odaiba", "shinjuku", "kashiwa")
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
_MAPS = ("us-nv-las-vegas-strip", "us-ma-boston", "sg-one-north", "us-pa-pittsburgh-hazelwood")
_INCOMPLETE = ("lanes", "route_lanes", "neighbors", "static_objects", "ego_future")
_NAMED = 3  # existing files named in a refusal

Arrays = dict[str, np.ndarray[Any, Any]]


@dataclass(frozen=True)
class SynthResult:
    """What :func:`synth_corpus` wrote."""

    root: Path
    partitions: list[str]  # log dirs relative to root, in order
    files: list[Path]  # npz paths
    skipped: int  # frames whose sidecar says is_skipped
    others: list[Path] = field(default_factory=list)  # files that are not frames (routes/*.json)
    skipped_files: list[Path] = field(default_factory=list)  # npz paths of skipped frames

    @property
    def samples(self) -> int:
        return len(self.files)


def _quantised(rng: np.random.Generator, shape: tuple[int, ...], scale: float, step: float) -> Any:
    """Smooth-ish values on a grid (like fixed-precision sensor data): compressible, not trivial."""
    values = np.cumsum(rng.normal(0.0, scale, size=shape), axis=-2 if len(shape) > 1 else -1)
    return (np.round(values / step) * step).astype(np.float32)


def _padded(
    rng: np.random.Generator, shape: tuple[int, ...], fill: int, scale: float, step: float
) -> Any:
    """``shape`` zeros with the first ``fill`` rows holding data (real tensors are zero-padded)."""
    out = np.zeros(shape, dtype=np.float32)
    fill = max(0, min(fill, shape[0]))
    if fill:
        out[:fill] = _quantised(rng, (fill, *shape[1:]), scale, step)
    return out


def _agents(
    rng: np.random.Generator,
    neighbors: int,
    n_live: int,
    *,
    past: int,
    ego_state: int,
    current_state: int,
) -> Arrays:
    """The ego and neighbour tracks and static objects of both layouts (``past`` steps of
    history, 80 of future; ``n_live`` of ``neighbors`` rows filled)."""
    return {
        "ego_agent_past": _quantised(rng, (past, ego_state), 0.3, 1e-3),
        "ego_current_state": _quantised(rng, (current_state,), 0.5, 1e-4),
        "ego_agent_future": _quantised(rng, (80, 3), 0.3, 1e-3),
        "neighbor_agents_past": _padded(rng, (neighbors, past, 11), n_live, 0.2, 1e-2),
        "neighbor_agents_future": _padded(rng, (neighbors, 80, 3), n_live, 0.2, 1e-2),
        "static_objects": _padded(rng, (5, 10), int(rng.integers(0, 6)), 1.0, 1e-2),
    }


def _v2_frame(rng: np.random.Generator, neighbors: int, lanes: int) -> Arrays:
    n_live = int(rng.integers(0, max(1, neighbors // 2) + 1)) if neighbors else 0
    n_lanes = int(rng.integers(lanes // 4, lanes * 2 // 3 + 1))
    routes = min(25, lanes)  # route lanes shrink with --lanes so tiny test frames stay tiny
    n_route = int(rng.integers(routes // 5, routes * 4 // 5 + 1))
    speed = np.zeros((lanes, 1), dtype=np.float32)
    has_speed = np.zeros((lanes, 1), dtype=bool)
    has_speed[:n_lanes, 0] = rng.random(n_lanes) < 0.7
    speed[has_speed] = rng.choice(
        np.array([8.94, 11.18, 13.41, 15.65], dtype=np.float32), has_speed.sum()
    )
    r_speed = np.zeros((routes, 1), dtype=np.float32)
    r_has = np.zeros((routes, 1), dtype=bool)
    r_has[:n_route, 0] = True
    r_speed[r_has] = np.float32(13.41)
    return {
        "version": np.array([2], dtype=np.uint32),
        **_agents(rng, neighbors, n_live, past=31, ego_state=3, current_state=10),
        "lanes": _padded(rng, (lanes, 20, 33), n_lanes, 0.5, 1e-3),
        "lanes_speed_limit": speed,
        "lanes_has_speed_limit": has_speed,
        "route_lanes": _padded(rng, (routes, 20, 33), n_route, 0.5, 1e-2),
        "route_lanes_speed_limit": r_speed,
        "route_lanes_has_speed_limit": r_has,
        "polygons": _padded(rng, (10, 40, 3), int(rng.integers(0, 11)), 0.5, 1e-2),
        "line_strings": _padded(rng, (60, 20, 4), int(rng.integers(0, 61)), 0.5, 1e-2),
        "goal_pose": _quantised(rng, (3,), 10.0, 1e-3),
        "turn_indicators": rng.integers(0, 3, size=31).astype(np.int32),
        "ego_shape": np.array([4.6, 1.9, 1.7], dtype=np.float32),
    }


def _nuplan_frame(rng: np.random.Generator, neighbors: int, lanes: int, token: str) -> Arrays:
    n_live = int(rng.integers(0, max(1, neighbors // 3) + 1)) if neighbors else 0
    n_lanes = int(rng.integers(lanes // 4, lanes * 5 // 6 + 1))
    has_speed = np.zeros((lanes, 1), dtype=bool)
    has_speed[:n_lanes, 0] = rng.random(n_lanes) < 0.6
    speed = np.where(has_speed, np.float32(11.18), np.float32(0)).astype(np.float32)
    return {
        "map_name": np.array(_MAPS[int(rng.integers(len(_MAPS)))]),  # 0-d <U
        "token": np.array(token),
        **_agents(rng, neighbors, n_live, past=21, ego_state=7, current_state=7),
        "lanes": _padded(rng, (lanes, 20, 12), n_lanes, 0.5, 1e-2),
        "lanes_speed_limit": speed,
        "lanes_has_speed_limit": has_speed,
        "route_lanes": _padded(rng, (25, 20, 12), int(rng.integers(5, 20)), 0.5, 1e-2),
    }


def write_npz(
    path: str | os.PathLike[str], arrays: dict[str, Any], *, compress: bool = True
) -> None:
    """Write a numpy-readable ``.npz`` with fixed zip dates, so equal arrays give equal bytes."""
    Path(path).write_bytes(npz_bytes(arrays, compress=compress))


def npz_bytes(arrays: dict[str, Any], *, compress: bool = True) -> bytes:
    """The bytes :func:`write_npz` writes."""
    buf = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(buf, "w", compression=method) as zf:
        for name, value in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE)
            info.compress_type = method
            with zf.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)
    return buf.getvalue()


def _create(path: Path, data: bytes) -> None:
    """Write a new file; never replaces one (``x``: the create fails if the path exists)."""
    try:
        with path.open("xb") as f:
            f.write(data)
    except FileExistsError as exc:  # appeared after the collision check
        raise ConflictError(f"{path} appeared while writing; it was left as it is") from exc


def _files_under(root: Path) -> list[Path]:
    """Every non-directory entry under ``root`` (none if it does not exist)."""
    found: list[Path] = []
    if not root.exists():
        return found
    if not root.is_dir():
        return [root]
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        found.extend(Path(folder, n) for n in sorted(names))
    return found


def _named(root: Path, paths: list[Path]) -> str:
    """``a, b, c and 117 more`` (relative to ``root``)."""
    shown = [p.relative_to(root).as_posix() if p != root else str(p) for p in paths[:_NAMED]]
    more = f" and {len(paths) - _NAMED} more" if len(paths) > _NAMED else ""
    return ", ".join(shown) + more


def _token(seed: int, p: int, i: int) -> str:
    """The frame's name token: the first draw of its generator (see :func:`_write_log`)."""
    return np.random.default_rng([seed, p, i]).bytes(8).hex()


def _sidecar(
    rng: np.random.Generator, index: int, skipped: bool, neighbors: int, log_dir: str
) -> dict[str, Any]:
    label = int(rng.integers(1, 11)) if skipped else 0
    quat = rng.normal(size=4)
    quat /= np.linalg.norm(quat)
    return {
        "is_skipped": skipped,
        "timestamp": 1_620_000_000_000_000 + index * 100_000,
        "x": round(float(rng.normal(0, 500)), 6),
        "y": round(float(rng.normal(0, 500)), 6),
        "z": round(float(rng.normal(0, 5)), 6),
        "qx": float(quat[0]),
        "qy": float(quat[1]),
        "qz": float(quat[2]),
        "qw": float(quat[3]),
        "skipping_info": {
            "label": label,
            "details": "ok" if not skipped else f"skip reason {label}",
            "incomplete_data_types": (
                sorted(
                    rng.choice(_INCOMPLETE, size=int(rng.integers(1, 3)), replace=False).tolist()
                )
                if skipped
                else []
            ),
        },
        "neighbor_ids": sorted(
            int(v) for v in rng.choice(100_000, size=min(neighbors, 8), replace=False)
        ),
        "log_file_id": log_dir,
        "vehicle_id": f"veh-{int(rng.integers(10, 60))}",
        "map_version_id": "v1.0",
        "date": "2021-05-12",
    }


def log_dir_name(seed: int, index: int) -> str:
    """A nuPlan-like log directory name (contains dots, like the real ones)."""
    rng = np.random.default_rng([seed, index, 7])
    veh = int(rng.integers(10, 60))
    return f"2021.05.{12 + index % 17:02d}.22.{index % 60:02d}.38_veh-{veh}_{index:05d}_{index + 510:05d}"


def converter_dir(seed: int, index: int) -> str:
    """``<location>/<split>/<date>/<time>`` of the ``index``-th log, like the converter writes:
    every fourth log is in the ``valid`` split."""
    rng = np.random.default_rng([seed, index, 11])
    location = _LOCATIONS[index % len(_LOCATIONS)]
    split = "valid" if index % 4 == 3 else "train"
    date = f"2024-05-{10 + index // 12:02d}"
    time = f"{8 + index % 12:02d}-{int(rng.integers(0, 60)):02d}-{int(rng.integers(0, 60)):02d}"
    return f"{location}/{split}/{date}/{time}"


def _route_summary(rng: np.random.Generator, frames: int, skipped: int) -> dict[str, Any]:
    start = 1_715_300_000_000_000_000 + int(rng.integers(0, 10**12))
    return {
        "num_frames": frames,
        "traveled_distance_m": round(float(rng.uniform(50, 2000)), 3),
        "start_timestamp": start,
        "end_timestamp": start + frames * 100_000_000,
        "skipping_info": {"label": 0, "details": f"{skipped} skipped", "incomplete_data_types": []},
        "timestamp_stats": {"/localization/kinematic_state": {"monotonic_header": True}},
    }


def synth_corpus(
    dest: str | os.PathLike[str],
    partitions: int,
    samples: int | list[int],
    *,
    seed: int = 0,
    format: str = "v2",
    neighbors: int = 320,
    lanes: int | None = None,
    skip_fraction: float = 0.0,
    sidecars: bool = True,
    compress: bool = True,
    progress: bool | None = None,
    layout: str = "flat",
    add: bool = False,
) -> SynthResult:
    """Write a synthetic corpus of ``partitions`` log dirs with ``samples`` frames each.

    ``samples`` may be a list (one count per partition). ``neighbors`` and ``lanes`` (v2: 140,
    nuPlan: 70 by default) shrink frames for tests: v2 with ``neighbors=4, lanes=4`` is ~30 KB
    raw. ``skip_fraction`` of the
    frames get ``is_skipped: true`` sidecars. ``layout`` is ``flat`` (``<log_dir>/`` frames) or
    ``converter`` (nested ``<location>/<split>/<date>/<time>/`` dirs and ``routes/*.json``).
    """
    if format not in FORMATS:
        raise ValueError(f"unknown frame format {format!r}; use one of {', '.join(FORMATS)}")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    lanes = (140 if format == "v2" else 70) if lanes is None else lanes
    if partitions < 0 or neighbors < 0 or lanes < 0 or not 0.0 <= skip_fraction <= 1.0:
        raise ValueError("partitions neighbors and lanes must be >= 0 and skip_fraction in [0, 1]")
    counts = list(samples) if isinstance(samples, list) else [samples] * partitions
    if len(counts) != partitions or any(c < 0 for c in counts):
        raise ValueError("samples must be a count >= 0 or one count per partition")
    root = Path(dest)
    log_dirs = [
        log_dir_name(seed, p) if layout == "flat" else converter_dir(seed, p)
        for p in range(partitions)
    ]
    _check_target(root, seed, log_dirs, counts, sidecars=sidecars, layout=layout, add=add)
    root.mkdir(parents=True, exist_ok=True)
    result = SynthResult(root, [], [], 0)
    with Progress(sum(counts), "synth", unit="frames", groups=partitions, enabled=progress) as bar:
        for p, log_dir in enumerate(log_dirs):
            result.partitions.append(log_dir)
            _write_log(
                result,
                seed,
                p,
                log_dir,
                counts[p],
                format,
                neighbors,
                lanes,
                skip_fraction,
                sidecars,
                compress,
                bar,
                layout,
            )
            if not counts[p]:
                bar.update(0, groups=1)
    return dataclasses.replace(result, skipped=len(result.skipped_files))


def _check_target(
    root: Path,
    seed: int,
    log_dirs: list[str],
    counts: list[int],
    *,
    sidecars: bool,
    layout: str,
    add: bool,
) -> None:
    """Refuse, before writing anything, a target holding files (unless ``add``) and any path
    of this run that already exists."""
    for folder in (root, *root.parents):  # the nearest existing one must be a folder
        if folder.exists() or folder.is_symlink():
            if not folder.is_dir():
                where = "" if folder == root else f" (a parent of {root})"
                raise ConflictError(f"{folder}{where} exists and is not a folder")
            break
    if not add:
        existing = _files_under(root)
        if existing:
            raise ConflictError(
                f"{root} already holds {plural(len(existing), 'file')} "
                f"({_named(root, existing)}); synth writes only into a new or empty folder "
                "unless told to add to it (it never overwrites a file)",
                options=("add",),
            )
        return
    planned: list[Path] = []
    for p, log_dir in enumerate(log_dirs):
        folder = root / log_dir
        stem = log_dir.rsplit("/", 1)[-1]
        for i in range(counts[p]):
            path = folder / f"{stem}_{_token(seed, p, i)}.npz"
            planned.append(path)
            if sidecars:
                planned.append(path.with_suffix(".json"))
        if layout == "converter":
            planned.append(folder / "routes" / f"{stem}_0.json")
    taken = [path for path in planned if os.path.lexists(path)]
    if taken:
        raise ConflictError(
            f"{len(taken)} of the {plural(len(planned), 'file')} this run would write already "
            f"exist under {root} ({_named(root, taken)}); nothing was written - choose "
            "another seed (synth never overwrites a file)",
            options=("seed",),
        )


def _write_log(
    result: SynthResult,
    seed: int,
    p: int,
    log_dir: str,
    count: int,
    format: str,
    neighbors: int,
    lanes: int,
    skip_fraction: float,
    sidecars: bool,
    compress: bool,
    bar: Progress,
    layout: str,
) -> None:
    """Write the ``count`` frames of one log directory (and, converter layout, its route)."""
    folder = result.root / log_dir
    folder.mkdir(parents=True, exist_ok=True)
    stem = log_dir.rsplit("/", 1)[-1]
    skipped_here = 0
    for i in range(count):
        # One generator per frame: any frame can be regenerated on its own.
        rng = np.random.default_rng([seed, p, i])
        token = rng.bytes(8).hex()
        arrays = (
            _v2_frame(rng, neighbors, lanes)
            if format == "v2"
            else _nuplan_frame(rng, neighbors, lanes, token)
        )
        path = folder / f"{stem}_{token}.npz"
        _create(path, npz_bytes(arrays, compress=compress))
        result.files.append(path)
        if sidecars:
            is_skipped = bool(rng.random() < skip_fraction)
            doc = _sidecar(rng, i, is_skipped, neighbors, stem)
            if layout == "converter":  # the converter writes no string ids
                for name in ("log_file_id", "vehicle_id", "map_version_id", "date"):
                    doc.pop(name)
            indent = 2 if layout == "converter" else None  # the converter pretty-prints
            text = json.dumps(doc, sort_keys=True, indent=indent)
            _create(path.with_suffix(".json"), text.encode())
            if is_skipped:
                result.skipped_files.append(path)
                skipped_here += 1
        bar.update(1, groups=int(i == count - 1))
    if layout == "converter":
        routes = folder / "routes"
        routes.mkdir(exist_ok=True)
        rng = np.random.default_rng([seed, p, 13])
        route = routes / f"{stem}_0.json"
        _create(route, json.dumps(_route_summary(rng, count, skipped_here), indent=2).encode())
        result.others.append(route)
