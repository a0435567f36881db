"""ShardDataset / ShardLoader in one process (DataLoader workers are real processes)."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from support.torch import (
    assert_batch_equal,
    copy_root,
    flip_byte,
    npz_sample,
    reference_batch,
)
from torch.utils.data import DataLoader

import shardlake
from shardlake import open_store
from shardlake.errors import IntegrityError, SelectionError
from shardlake.testing import RequestCounter, summarize_request_log, synth_corpus
from shardlake.testing.faults import FaultInjector, FaultPlan
from shardlake.torch import (
    ReadOptions,
    ShardDataset,
    batch_mixing,
    js_distance,
    plan_mixing,
    train_valid,
)

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.usefixtures("loader_engine"),
]  # a hang is a failure (with every thread's stack)

FAST = ReadOptions()
COUNTS = [3, 40, 25, 12]  # 80 samples, uneven partitions


@pytest.fixture(scope="module")
def corpus(packed_root: Callable[..., tuple[Path, Path]]) -> tuple[Path, Path]:
    return packed_root(COUNTS, name="v2")


@pytest.fixture(scope="module")
def nuplan(packed_root: Callable[..., tuple[Path, Path]]) -> tuple[Path, Path]:
    return packed_root([9, 14], name="nuplan", fmt="nuplan")


def keys_of(batches: list[dict]) -> list[list[str]]:
    return [list(b["__key__"]) for b in batches]


def test_batches_equal_default_collate_over_npz(nuplan: tuple[Path, Path]) -> None:
    source, root = nuplan
    ds = ShardDataset(str(root), batch_size=4, num_workers=2, include_key=True, max_pad_fraction=1)
    batches = list(ds.loader())
    assert len(batches) == len(ds) // 4 == 6  # 23 samples -> 24 with one replay
    for batch in batches:
        assert isinstance(batch["map_name"], list) and isinstance(batch["map_name"][0], str)
        assert_batch_equal(batch, reference_batch(source, batch["__key__"]))
    seen = Counter(k for b in batches for k in b["__key__"])
    assert len(seen) == 23 and sum(seen.values()) == 24
    # The plain DataLoader path yields the very same batches (batching in the main process).
    ds.set_epoch(0)  # the loader's full pass moved the dataset to epoch 1
    plain = list(DataLoader(ds, batch_size=4, num_workers=2))
    assert keys_of(plain) == keys_of(batches)
    for a, b in zip(plain, batches, strict=True):
        assert_batch_equal(a, {k: v for k, v in b.items() if k != "__key__"})


def test_reused_buffers_never_change_batches_the_user_keeps(corpus: tuple[Path, Path]) -> None:
    source, root = corpus
    ds = ShardDataset(str(root), batch_size=4, num_workers=2, include_key=True)
    kept = []  # 20 batches, 10 per worker: more than a worker's buffer pool
    for i, batch in enumerate(ds.loader()):
        if i % 2:
            kept.append(batch)  # held: its buffer must not be reused
        else:
            assert_batch_equal(batch, reference_batch(source, batch["__key__"]))
            del batch  # released: its buffer goes back to the worker
    assert len(kept) == 10
    for batch in kept:
        assert_batch_equal(batch, reference_batch(source, batch["__key__"]))


def test_samples_drop_keys_meta_columns_and_shared_memory(corpus: tuple[Path, Path]) -> None:
    source, root = corpus
    ds = ShardDataset(
        str(root), batch_size=8, num_workers=0, include_key=True, meta_columns=("timestamp",)
    )
    sample = next(iter(ds))
    assert "version" not in sample and sample["lanes"].dtype == torch.float32
    sidecar = json.loads((source / f"{sample['__key__']}.json").read_text())
    assert sample["timestamp"] == sidecar["timestamp"]
    ref = npz_sample(source, sample["__key__"])
    for name, value in ref.items():
        assert torch.equal(sample[name], torch.from_numpy(value))
    batch = next(iter(ds.loader(num_workers=1)))
    assert batch["timestamp"].dtype == torch.int64 and batch["timestamp"].shape == (8,)
    # Decoded straight into shared memory in a worker process; the thread engine decodes into
    # this process's own memory.
    assert batch["lanes"].is_shared() == (ds.engine == "processes")
    kept = ShardDataset(str(root), batch_size=8, num_workers=0, drop_keys=())
    assert next(iter(kept))["version"].dtype == torch.uint32


def test_epochs_cover_selection_and_differ(corpus: tuple[Path, Path]) -> None:
    _, root = corpus
    ds = ShardDataset(str(root), batch_size=8, num_workers=2, include_key=True)
    loader = ds.loader()
    e0 = keys_of(list(loader))
    assert loader.epoch == 1  # a full pass moves to the next epoch
    e1 = keys_of(list(loader))
    for epoch in (e0, e1):
        assert sorted(k for b in epoch for k in b) == sorted(ds.table.keys)
    assert e0 != e1
    loader.set_epoch(0)
    assert keys_of(list(loader)) == e0
    again = ShardDataset(str(root), batch_size=8, num_workers=2, include_key=True).loader()
    assert keys_of(list(again)) == e0


@pytest.mark.parametrize("workers_after", [2, 1])
def test_resume_mid_epoch_with_workers_running(
    corpus: tuple[Path, Path], workers_after: int, tmp_path: Path
) -> None:
    _, root = corpus
    full = keys_of(list(ShardDataset(str(root), batch_size=8, include_key=True).loader()))
    ds = ShardDataset(str(root), batch_size=8, num_workers=2, include_key=True)
    loader = ds.loader()
    before = []
    for batch in loader:  # workers are running (and prefetching) when the state is taken
        before.append(list(batch["__key__"]))
        if len(before) == 3:
            state = json.loads(json.dumps(loader.state_dict()))
            break
    assert before == full[:3]
    log = tmp_path / "requests.jsonl"
    store = open_store(str(root)).with_layers(RequestCounter(str(log)))
    fresh = ShardDataset(store, batch_size=8, num_workers=workers_after, include_key=True)
    resumed = fresh.loader(prefetch_next_epoch=False)  # only this epoch's reads are counted
    resumed.load_state_dict(state)
    log.unlink(missing_ok=True)
    after = keys_of(list(resumed))
    # The consumed prefix is not read again: bytes fetched ~ the remaining batches' members.
    size_of = dict(zip(ds.table.keys, ds.table.size.tolist(), strict=True))
    remaining = sum(size_of[k] for b in after for k in b)
    fetched = sum(
        r["bytes"]
        for r in map(json.loads, log.read_text().splitlines())
        if r["ok"] and r["op"].startswith("read_range")
    )
    assert remaining <= fetched <= 1.1 * remaining
    if workers_after == 2:
        assert after == full[3:]  # exactly the rest, same order
    union = Counter(k for b in before + after for k in b)
    assert set(union) == set(ds.table.keys)
    assert sum(union.values()) - len(ds.table) < 8  # only planned replays repeat
    assert resumed.epoch == 1


def test_flipped_byte_raises_integrity_error_naming_it(
    corpus: tuple[Path, Path], tmp_path: Path
) -> None:
    _, root = corpus
    bad = copy_root(root, tmp_path / "bad")
    ds = ShardDataset(str(bad), batch_size=8, num_workers=0, include_key=True, read_options=FAST)
    row = 5
    shard_key = ds.table.shard_keys[int(ds.table.shard[row])]
    offset = int(ds.table.offset[row])
    flip_byte(bad, shard_key, offset + int(ds.table.size[row]) // 2)
    with pytest.raises(IntegrityError) as info:
        list(ds.loader(num_workers=1))
    message = str(info.value)
    assert shard_key in message and ds.table.keys[row] in message
    assert f"offset {offset}" in message and str(bad) in message


def test_transient_failures_same_samples(corpus: tuple[Path, Path], tmp_path: Path) -> None:
    _, root = corpus
    clean = [
        b for b in ShardDataset(str(root), batch_size=8, include_key=True).loader(num_workers=2)
    ]
    log = tmp_path / "requests.jsonl"
    store = open_store(str(root)).with_layers(
        RequestCounter(str(log)), FaultInjector(FaultPlan(fail_rate=0.1, seed=3))
    )
    ds = ShardDataset(store, batch_size=8, include_key=True, read_options=FAST)
    faulty = list(ds.loader(num_workers=2))
    assert keys_of(faulty) == keys_of(clean)
    for a, b in zip(faulty, clean, strict=True):
        assert_batch_equal(a, {k: v for k, v in b.items() if k != "__key__"})
    summary = summarize_request_log(str(log))
    assert summary["failures"] > 0
    # Reads from the worker processes (and the set-up), or from this process alone.
    assert summary["processes"] >= 2 if ds.engine == "processes" else summary["processes"] == 1


def test_sparse_selection_fetches_only_its_bytes(corpus: tuple[Path, Path], tmp_path: Path) -> None:
    _, root = corpus
    log = tmp_path / "requests.jsonl"
    store = open_store(str(root)).with_layers(RequestCounter(str(log)))
    probe = ShardDataset(str(root), batch_size=4, num_workers=0)
    keys = probe.table.keys[::3]
    ds = ShardDataset(store, batch_size=4, keys=keys, include_key=True, max_pad_fraction=0.5)
    log.unlink(missing_ok=True)  # count the loader's reads only
    seen = Counter(
        k for b in ds.loader(num_workers=2, prefetch_next_epoch=False) for k in b["__key__"]
    )
    assert set(seen) == set(keys)
    want = sum(int(probe.table.size[probe.table.keys.index(k)]) for k in keys)
    records = [json.loads(x) for x in log.read_text().splitlines()]
    fetched = sum(r["bytes"] for r in records if r["ok"] and r["op"].startswith("read_range"))
    replayed = sum(
        int(probe.table.size[probe.table.keys.index(k)]) * (n - 1) for k, n in seen.items()
    )
    assert want <= fetched <= 1.1 * (want + replayed)

    # A skim threshold above the gaps reads each chunk as one span: more bytes, fewer ranges.
    log.unlink()
    skim = ReadOptions(skim_gap=1 << 20)
    ds = ShardDataset(store, batch_size=4, keys=keys, max_pad_fraction=0.5, read_options=skim)
    assert sum(len(b["lanes"]) for b in ds.loader(num_workers=2, prefetch_next_epoch=False)) == sum(
        seen.values()
    )
    records = [json.loads(x) for x in log.read_text().splitlines()]
    skimmed = sum(r["bytes"] for r in records if r["ok"] and r["op"].startswith("read_range"))
    assert skimmed > 1.5 * want


def test_where_keyset_and_errors(corpus: tuple[Path, Path]) -> None:
    _, root = corpus
    everything = ShardDataset(str(root), batch_size=4, num_workers=0)
    pid = everything.partition_names[0]
    ds = ShardDataset(str(root), batch_size=4, num_workers=0, where=f"partition = '{pid}'")
    assert len(ds.table) == COUNTS_BY_PID(everything)[pid]

    chosen = everything.table.keys[1::4]
    shardlake.open(str(root)).keysets.create("held-out", keys=chosen)
    by_name = ShardDataset(str(root), batch_size=4, num_workers=0, keyset="held-out")
    assert sorted(by_name.table.keys) == sorted(chosen)
    assert by_name.run_record()["selection"] == {"keyset": "held-out"}
    train, valid = train_valid(str(root), batch_size=4, valid_keyset="held-out")
    assert set(train.table.keys) == set(everything.table.keys) - set(chosen)
    with pytest.raises(SelectionError):
        ShardDataset(str(root), batch_size=4, where="nosuchcolumn = 1")
    with pytest.raises(SelectionError):
        ShardDataset(str(root), batch_size=4, keys=["no/such/key"])
    with pytest.warns(UserWarning, match="max_pad_fraction"):  # plans, as DistributedSampler
        assert len(ShardDataset(str(root), batch_size=64, world_size=4, rank=0)) == 64


def COUNTS_BY_PID(ds: ShardDataset) -> dict[str, int]:  # noqa: N802
    names = ds.partition_names
    return dict(Counter(names[i] for i in ds.partition_of.tolist()))


def add_speed(sample: dict) -> dict:
    """A user transform (module level: picklable into workers)."""
    sample["speed"] = sample["ego_current_state"][4:6].norm()
    return sample


def test_transform_runs_per_sample_in_workers(corpus: tuple[Path, Path]) -> None:
    _, root = corpus
    ds = ShardDataset(str(root), batch_size=8, num_workers=2, transform=add_speed)
    batches = list(ds.loader())
    assert len(batches) == 10
    for batch in batches:
        assert batch["speed"].shape == (8,)
        assert torch.allclose(batch["speed"], batch["ego_current_state"][:, 4:6].norm(dim=1))


def test_train_valid_and_run_record(corpus: tuple[Path, Path]) -> None:
    _, root = corpus
    probe = ShardDataset(str(root), batch_size=4, num_workers=0)
    valid_keys = probe.table.keys[:10]
    train, valid = train_valid(str(root), batch_size=8, valid_keys=valid_keys, valid_batch_size=5)
    assert set(valid.table.keys) == set(valid_keys)
    assert set(train.table.keys) == set(probe.table.keys) - set(valid_keys)
    assert not valid.params.shuffle
    record = train.loader(num_workers=2).run_record()
    assert record["version_hash"] == probe.version_hash
    assert record["selection_digest"] == train.selection_digest
    assert record["plan"]["batch_size"] == 8 and record["plan"]["num_workers"] == 2
    assert record["shardlake_version"]


def test_mixing_report(corpus: tuple[Path, Path]) -> None:
    _, root = corpus
    assert js_distance([1, 0], [1, 0]) == 0.0
    assert js_distance([1, 0], [0, 1]) == pytest.approx(1.0)
    shuffled = plan_mixing(ShardDataset(str(root), batch_size=8, num_workers=2))
    ordered = plan_mixing(ShardDataset(str(root), batch_size=8, num_workers=2, shuffle=False))
    assert shuffled.mean < ordered.mean
    assert batch_mixing([[0, 1]], [0, 1]).mean == 0.0


def note_gc_freeze(sample: dict) -> dict:
    """Records, in the worker, how many of the parent's objects the collector leaves alone."""
    import gc

    sample["frozen"] = gc.get_freeze_count()
    return sample


def test_workers_are_forked_with_the_parents_objects_frozen(corpus: tuple[Path, Path]) -> None:
    import gc

    _, root = corpus
    ds = ShardDataset(
        str(root), batch_size=8, num_workers=1, transform=note_gc_freeze, engine="processes"
    )
    batch = next(iter(ds.loader(multiprocessing_context="fork")))
    assert int(batch["frozen"].min()) > 0  # no copy-on-write walk of them by the worker's gc
    assert gc.get_freeze_count() == 0  # the parent collects as before


def test_loader_options_object_and_keywords_agree_and_typos_fail_early(tmp_path: Path) -> None:
    from shardlake.errors import UsageError
    from shardlake.torch import LoaderOptions

    src = tmp_path / "src"
    synth_corpus(src, 2, 4, seed=3, neighbors=2, lanes=4)
    root = str(tmp_path / "root")
    shardlake.open(root).pack(src, tag="v1")
    by_keywords = ShardDataset(root, batch_size=2, seed=7, num_workers=0, include_key=True)
    by_object = ShardDataset(
        root, batch_size=2, options=LoaderOptions(seed=7, num_workers=0, include_key=True)
    )
    keys = [b["__key__"] for b in by_keywords]
    assert keys and keys == [b["__key__"] for b in by_object]
    # A keyword overrides the options object.
    assert ShardDataset(root, batch_size=2, options=LoaderOptions(seed=7), seed=8).options.seed == 8
    with pytest.raises(UsageError, match="unknown keyword 'sede' \\(did you mean 'seed'\\?\\)"):
        ShardDataset(root, batch_size=2, sede=7)
    with pytest.raises(UsageError, match="did you mean 'num_workers'"):
        shardlake.open(root).dataset().to_torch(batch_size=2, num_worker=0)


def test_both_engines_yield_the_same_batches_bit_for_bit(corpus: tuple[Path, Path]) -> None:
    _, root = corpus
    for options in (
        {"include_index": True, "meta_columns": ("timestamp",)},
        {"exact": True, "include_key": True, "world_size": 3, "rank": 2},
    ):
        got = {
            engine: list(
                ShardDataset(str(root), batch_size=5, engine=engine, seed=4, **options).loader(
                    num_workers=2
                )
            )
            for engine in ("threads", "processes")
        }
        assert len(got["threads"]) == len(got["processes"]) > 2
        for a, b in zip(got["threads"], got["processes"], strict=True):
            assert list(a) == list(b) and a.get("__key__") == b.get("__key__")
            assert_batch_equal(a, {k: v for k, v in b.items() if k != "__key__"})


def test_thread_engine_stops_its_threads_and_checks_its_options(corpus: tuple[Path, Path]) -> None:
    import threading

    from shardlake.errors import UsageError

    _, root = corpus
    before = threading.active_count()
    ds = ShardDataset(str(root), batch_size=4, engine="threads")
    for i, _batch in enumerate(ds.loader(threads=3)):
        if i == 1:
            break  # leaving the loop early stops the feeder, builders and readers
    for _ in range(50):
        if threading.active_count() <= before:
            break
        time.sleep(0.05)
    assert threading.active_count() <= before
    with pytest.raises(UsageError, match="worker_init_fn applies to engine='processes'"):
        ds.loader(worker_init_fn=print)
    with pytest.raises(UsageError, match="engine='fibers'"):
        ShardDataset(str(root), batch_size=4, engine="fibers")
    with pytest.raises(UsageError, match="threads=0"):
        ds.loader(threads=0)


def test_thread_engine_keeps_its_batch_buffers_from_one_pass_to_the_next(
    corpus: tuple[Path, Path],
) -> None:
    import gc

    from torch.multiprocessing.reductions import StorageWeakRef

    source, root = corpus
    ds = ShardDataset(str(root), batch_size=4, engine="threads", include_key=True)
    loader = ds.loader(threads=2)
    first = set()
    refs = []
    for batch in loader:
        storage = batch["lanes"].untyped_storage()
        first.add(storage.data_ptr())
        refs.append(StorageWeakRef(storage))
        del batch, storage
    gc.collect()
    # The pass is over and no batch is held: the loader still has the buffers (a fresh one
    # costs a page fault per page), and the next pass fills them again, with its own batches.
    assert any(not ref.expired() for ref in refs)
    ds.set_epoch(1)
    second = set()
    for batch in loader:
        second.add(batch["lanes"].untyped_storage().data_ptr())
        assert_batch_equal(batch, reference_batch(source, batch["__key__"]))
    assert second & first  # refilled, not allocated anew


def test_thread_engine_splits_a_batch_among_idle_builders(
    corpus: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from shardlake.torch.collate import PayloadDecoder

    source, root = corpus
    decoded_by: dict[int, str] = {}
    plain_raw = PayloadDecoder.raw

    def raw(self: PayloadDecoder, row: int, payload: bytes | memoryview) -> bytes:
        decoded_by[row] = threading.current_thread().name
        time.sleep(0.005)  # every builder thread has started before the first range is done
        return plain_raw(self, row, payload)

    monkeypatch.setattr(PayloadDecoder, "raw", raw)
    ds = ShardDataset(str(root), batch_size=16, engine="threads", include_index=True)
    batches = list(ds.loader(threads=2))
    # The first batch of the pass had idle builders: both threads decoded some of its rows
    # (the rows keep their order and values).
    first = batches[0]["__index__"].tolist()
    assert len({decoded_by[r] for r in first}) == 2
    keys = ds.keys_of(batches[0]["__index__"])
    assert_batch_equal(
        {k: v for k, v in batches[0].items() if k != "__index__"}, reference_batch(source, keys)
    )


def test_thread_engine_pin_memory_without_cuda_warns_and_yields_the_same_batches(
    corpus: tuple[Path, Path],
) -> None:
    _, root = corpus
    ds = ShardDataset(str(root), batch_size=4, engine="threads", include_key=True)
    want = list(ds.loader())
    if torch.cuda.is_available():
        got = list(ds.loader(pin_memory=True))
        assert all(b["lanes"].is_pinned() for b in got)
    else:
        with pytest.warns(UserWarning, match="CUDA is not available"):
            got = list(ds.loader(pin_memory=True))
    assert [b["__key__"] for b in got] == [b["__key__"] for b in want]
    for a, b in zip(got, want, strict=True):
        assert_batch_equal(a, {k: v for k, v in b.items() if k != "__key__"})
