"""The plan as the workers share it: compact arrays (int32 where every value fits, chunks as one
flat :class:`ChunkList`), and a whole plan as a derived-arrays entry of the node-local catalog
cache, from which each rank maps its own slots.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..read.catalog_cache import DerivedArrays, catalog_cache
from .plan_rank import Groups, plan_epoch3, shard_groups
from .plan_types import Cursor, Layout, ReadPlan, Rows, resolve
from .reader import ChunkList, RowTable
from .slot_units import chunk_ends

if TYPE_CHECKING:
    from .dataset import ShardDataset

__all__ = [
    "compact_plan",
    "plan_arrays",
    "plan_from_arrays",
    "rank_plan",
    "rank_plan3",
    "sampled_mean",
    "table_groups",
]


IntArrayT = np.ndarray[Any, np.dtype[np.int64]]


def _plan_dtypes(
    ints: list[np.ndarray[Any, Any]], emits: list[np.ndarray[Any, Any]]
) -> tuple[Any, Any]:
    """The dtypes of a compact plan's integer arrays, and of its emits' chunk numbers: int32
    where every value fits (else int64). Emits name a chunk of their own slot: under 65,536
    chunks a slot (1M samples of driving frames: ~22,000 a slot) they are uint16."""
    return _dtypes_of([_bounds(a) for a in ints], [_bounds(a) for a in emits])


def _bounds(a: np.ndarray[Any, Any]) -> tuple[int, int] | None:
    return (int(a.min()), int(a.max())) if len(a) else None


def _dtypes_of(
    ints: list[tuple[int, int] | None], emits: list[tuple[int, int] | None]
) -> tuple[Any, Any]:
    """:func:`_plan_dtypes` from the arrays' (min, max) (None: empty)."""
    chunk_bounds = [b for b in emits if b is not None]
    bounds = [b for b in ints if b is not None] + chunk_bounds
    low = min((lo for lo, _ in bounds), default=0)
    top = max((hi for _, hi in bounds), default=0)
    dtype = np.int32 if low >= 0 and top < 2**31 else np.int64
    small = all(lo >= 0 and hi < 2**16 for lo, hi in chunk_bounds)
    return dtype, np.uint16 if small else dtype


def compact_plan(plan: ReadPlan, keep: range | None = None) -> ReadPlan:
    """``plan`` with int32 arrays where every value fits (chunk numbers uint16, see
    :func:`_plan_dtypes`) and chunks as :class:`ChunkList`: it is computed once before the
    workers fork and shared by them (~11 instead of ~32 bytes a sample). Arrays that were one
    object stay one object. ``keep``: the slots to keep (the others become empty; so do the
    plan ids, which only whole-plan reports use)."""
    kept = range(len(plan.slot_rows)) if keep is None else keep
    dtype, emit_dtype = _plan_dtypes(
        [a for field in (plan.slot_rows, plan.slot_ids) for i, a in enumerate(field) if i in kept],
        [a for i, a in enumerate(plan.slot_emit_chunk) if i in kept],
    )
    done: dict[tuple[int, Any], np.ndarray[Any, Any]] = {}
    none: np.ndarray[Any, Any] = np.zeros(0, dtype=dtype)

    def small(i: int, a: np.ndarray[Any, Any], to: Any = dtype) -> np.ndarray[Any, Any]:
        if i not in kept:
            return none
        if (id(a), to) not in done:
            done[id(a), to] = a.astype(to, copy=False)
        return done[id(a), to]

    chunks = [ChunkList(c if i in kept else []) for i, c in enumerate(plan.slot_chunks)]
    ends = [
        chunk_ends(plan.slot_emit_chunk[i], len(c)) if i in kept else none
        for i, c in enumerate(chunks)
    ]
    return replace(
        plan,
        slot_rows=[small(i, a) for i, a in enumerate(plan.slot_rows)],
        slot_emit_chunk=[small(i, a, emit_dtype) for i, a in enumerate(plan.slot_emit_chunk)],
        # Epoch positions of the emits: nothing reads them from a rank's cached plan.
        slot_ids=[small(i, a) if keep is None else none for i, a in enumerate(plan.slot_ids)],
        slot_valid=[a if i in kept else np.zeros(0, bool) for i, a in enumerate(plan.slot_valid)],
        # A sequence of arrays, as the readers use it (ReadPlan's annotation says list).
        slot_chunks=cast(list[list[IntArrayT]], chunks),
        slot_chunk_ends=ends,
    )


PLAN_ENTRY = "loader-plan/1"
PLAN_PARTS = 2  # in the key: entries with each slot's chunk ends (older ones are not mapped)


def plan_arrays(plan: ReadPlan) -> DerivedArrays:
    """A whole plan (all slots, no plan ids) as a derived-arrays entry of the catalog cache."""
    whole = compact_plan(plan)
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    for i in range(len(whole.slot_rows)):
        chunks = cast(ChunkList, whole.slot_chunks[i])
        arrays[f"rows{i}"] = whole.slot_rows[i]
        arrays[f"emit{i}"] = whole.slot_emit_chunk[i]
        arrays[f"valid{i}"] = whole.slot_valid[i]
        arrays[f"flat{i}"] = chunks.flat
        arrays[f"bounds{i}"] = chunks.bounds
        arrays[f"ends{i}"] = cast(list[IntArrayT], whole.slot_chunk_ends)[i]
    doc = {
        "steps": whole.steps,
        "samples": whole.samples,
        "replays": whole.replays,
        "slots": len(whole.slot_rows),
        # Each slot's (min, max) of rows and emits: a rank picks its dtypes from these instead
        # of scanning (which paged the whole of its slots' arrays into it at every start).
        "slot_bounds": [
            [_bounds(arrays[f"rows{i}"]), _bounds(arrays[f"emit{i}"])]
            for i in range(len(whole.slot_rows))
        ],
    }
    return doc, arrays


def plan_from_arrays(
    layout: Layout, doc: dict[str, Any], arrays: dict[str, np.ndarray[Any, Any]], keep: range
) -> ReadPlan:
    """The rank's plan of :func:`plan_arrays`' entry: its slots, the others' empty; integer
    arrays in the dtype :func:`compact_plan` would give them (views where it is the same)."""
    slots = int(doc["slots"])
    kept = [i for i in range(slots) if i in keep]
    if "slot_bounds" in doc:
        bounds = [
            [tuple(b) if b is not None else None for b in doc["slot_bounds"][i]] for i in kept
        ]
        dtype, emit_dtype = _dtypes_of([b[0] for b in bounds], [b[1] for b in bounds])
    else:
        dtype, emit_dtype = _plan_dtypes(
            [arrays[f"rows{i}"] for i in kept], [arrays[f"emit{i}"] for i in kept]
        )
    none: np.ndarray[Any, Any] = np.zeros(0, dtype=dtype)

    def slot(name: str, i: int, to: Any = dtype) -> np.ndarray[Any, Any]:
        return arrays[f"{name}{i}"].astype(to, copy=False) if i in keep else none

    chunks = [
        ChunkList.from_flat(arrays[f"flat{i}"], arrays[f"bounds{i}"])
        if i in keep
        else ChunkList([])
        for i in range(slots)
    ]
    return ReadPlan(
        layout,
        int(doc["steps"]),
        int(doc["samples"]),
        int(doc["replays"]),
        slot_rows=[slot("rows", i) for i in range(slots)],
        slot_chunks=cast(list[list[IntArrayT]], chunks),
        slot_emit_chunk=[slot("emit", i, emit_dtype) for i in range(slots)],
        slot_valid=[arrays[f"valid{i}"] if i in keep else np.zeros(0, bool) for i in range(slots)],
        slot_ids=[none] * slots,
        slot_chunk_ends=[slot("ends", i, arrays[f"ends{i}"].dtype) for i in range(slots)],
    )


def rank_plan(
    whole: Callable[[], ReadPlan], key: Mapping[str, Any], layout: Layout, mine: range
) -> ReadPlan:
    """The slots ``mine`` of the plan ``whole()`` computes. With the node-local catalog cache
    on, the whole plan is a derived file keyed by ``key`` (everything it depends on): the
    node's first rank computes and writes it, the others (and later runs) map their slots."""
    cache = catalog_cache()
    if cache is None:
        return compact_plan(whole(), keep=mine)
    what = json.dumps({"entry": PLAN_ENTRY, "parts": PLAN_PARTS, **key}, sort_keys=True)
    made = cache.fetch_arrays(what, lambda: plan_arrays(whole()))
    return plan_from_arrays(layout, *made, keep=mine)


GROUPS_ENTRY = "loader-groups/1"


def table_groups(
    table: RowTable, mapping: np.ndarray[Any, Any] | None, version: str | None
) -> Groups:
    """The shard groups (plan shape 3) of an epoch's rows: ``mapping`` (epoch position ->
    table row) or the table itself. ``version`` (a whole version's table: its hash) keeps
    them in the node-local catalog cache, so the node's other ranks map the shards' first
    positions (a few KB) instead of reading every row's shard and offset."""
    if mapping is not None:
        return shard_groups(Rows(table.shard[mapping], table.offset[mapping]))
    cache = catalog_cache() if version is not None else None

    def make() -> DerivedArrays:
        got = shard_groups(Rows(table.shard, table.offset))
        order = np.zeros(0, np.int64) if got.order is None else got.order
        small = np.int32 if got.n < 2**31 else np.int64
        doc = {"n": got.n, "ordered": got.order is None}
        return doc, {"starts": got.starts.astype(small), "order": order.astype(small)}

    what = json.dumps({"entry": GROUPS_ENTRY, "version": version, "rows": len(table)})
    doc, arrays = make() if cache is None else cache.fetch_arrays(what, make)
    order = None if doc["ordered"] else arrays["order"]
    return Groups(int(doc["n"]), arrays["starts"].astype(np.int64), order)


def rank_plan3(ds: ShardDataset, layout: Layout, cursor: Cursor, mine: range) -> ReadPlan:
    """The slots ``mine`` of ``ds``'s plan (shape 3), planned on their own
    (:mod:`.plan_rank`): a whole version's shard groups come from the node-local cache
    (:func:`table_groups`)."""
    mapping = ds.epoch_map(cursor.epoch)
    whole = mapping is None and ds.source_records[0]["selection"] == {"all": True}
    groups = table_groups(ds.table, mapping, ds.version_hash if whole else None)
    n_all = len(ds.table) if mapping is None else len(mapping)
    # Without the read order and positions: a ReadPlan keeps neither.
    leg = plan_epoch3(
        groups, ds.params, cursor.epoch, layout, cursor.legs, n_all=n_all, slots=mine, reads=False
    )
    return resolve(leg, mapping)


def sampled_mean(values: np.ndarray[Any, Any], blocks: int = 64, width: int = 1024) -> float:
    """The mean of ``values`` over ``blocks`` evenly spaced runs of ``width``: a mapped
    column's few pages instead of all of them (plan shape 3's run length)."""
    n = len(values)
    if n <= blocks * width:
        return float(values.mean()) if n else 1.0
    starts = np.linspace(0, n - width, blocks).astype(np.int64).tolist()
    return float(np.mean([values[s : s + width].mean() for s in starts]))
