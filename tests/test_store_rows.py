"""One rule for where a planned row is read (``expstore/loading/store_rows.py``): a writer's
RAM, another local writer's shared-memory staging, or shards; the same rule in the store's
own process (``Store.source``), in another process that refreshed (``StagedRows``), and in
a DataLoader worker (``StoreRows.in_worker`` with the item's ``StagedSnapshot``). Also:
``Store.sample`` reads its sampler's plan itself (index -> sampler -> plan -> rows).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import expstore as es
from expstore.loading.store_rows import StagedSnapshot, StoreRows
from expstore.storage.backends import backend_for
from expstore.storage.read import ShardReader
from expstore.storage.write import StagedLanes
from expstore.testing import scratch_dir

SHARD = 16


@pytest.fixture
def workdir(tmp_path):
    with scratch_dir(str(tmp_path)) as d:
        yield d


def make(workdir: str, lanes: int = 2, shards: int = 16) -> es.Store:
    spec = es.Spec.create(obs=es.Field((3,), np.float32), action=es.Field((), np.int64),
                          extras={"tag": es.Field((), np.int64)})
    return es.create(os.path.join(workdir, "s.zarr"), spec, capacity=lanes * SHARD * shards,
                     lanes=lanes, shard_rows=SHARD)


def tag(lane: int, step: int) -> int:
    return lane * 100_000 + step


def add(store: es.Store, lane: int, n: int) -> None:
    """``n`` steps of one episode whose ``tag`` names the row's lane and step."""
    for _ in range(n):
        step = store.writers[lane].count
        obs = np.full(3, step, np.float32)
        store.add(obs, 0, 1.0, obs + 1, False, False, lane=lane, tag=tag(lane, step))


def rows_of(store: es.Store, lane: int, start: int, stop: int) -> tuple[np.ndarray, ...]:
    steps = np.arange(start, stop, dtype=np.int64)
    rows = store.index.lane_rows(lane, steps)
    return rows, steps, np.array([tag(lane, int(s)) for s in steps])


def worker_rows(store: es.Store, snapshot: StagedSnapshot) -> StoreRows:
    """What a DataLoader worker reads through: its own shard reader and staging view."""
    reader = ShardReader(backend_for(store.url), store.layout)
    shared = StagedLanes(store.backend.root, store.layout, recheck=0)
    return StoreRows.in_worker(reader, shared, store.layout.lane_capacity, snapshot)


def read(source, rows: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    out = np.zeros(len(rows), np.int64)
    ok = source.read("tag", rows, steps, out)
    return out, ok


def test_the_writer_a_reader_and_a_worker_read_the_same_rows(workdir):
    store = make(workdir)
    add(store, 0, 20)
    store.flush()  # lane 0: steps 0..19 on shards, 20..39 staged
    add(store, 0, 20)
    add(store, 1, 10)  # lane 1: staged only
    assert store.publishes_staging
    lanes = [rows_of(store, 0, 0, 40), rows_of(store, 1, 0, 10)]
    rows, steps, want = (np.concatenate(parts) for parts in zip(*lanes))

    other = es.open(store.url)  # another process of this machine, in effect
    other.refresh()
    assert other.index.count.tolist() == [40, 10]
    for source in (store.source,  # the writer: its RAM
                   other.source,  # shared memory, sessions found by refresh()
                   worker_rows(store, store.staged_snapshot())):  # shared memory, snapshot
        got, ok = read(source, rows, steps)
        assert ok.all() and (got == want).all()
        cols = source.read_fields(["tag", "reward"], rows, steps)
        assert (cols["tag"][0] == want).all() and cols["tag"][1].all()
    assert (store.read("tag", rows, steps) == want).all()
    other.close()
    store.close()


def test_a_worker_reads_rows_committed_since_its_snapshot_from_shards(workdir):
    store = make(workdir, lanes=1)
    add(store, 0, 20)
    snapshot = store.staged_snapshot()  # plans drawn now may name steps 0..19 as staged
    rows, steps, want = rows_of(store, 0, 0, 20)
    store.writers[0].wait()  # shard 0 (steps 0..15) written: its buffer is free again ...
    add(store, 0, SHARD + 1)  # ... and reused by shard 2 (its first row, step 32)
    store.flush()
    lanes = StagedLanes(store.backend.root, store.layout, recheck=0)
    held, _ = lanes.read(0, int(snapshot.sessions[0]), "tag", steps, np.zeros(20, np.int64))
    assert not held[:SHARD].any()  # planned rows no longer in shared memory ...
    got, ok = read(worker_rows(store, snapshot), rows, steps)
    assert ok.all() and (got == want).all()  # ... are read from shards
    store.close()


def test_rows_of_another_writer_session_are_stale_not_read(workdir):
    store = make(workdir, lanes=1)
    add(store, 0, 20)
    store.flush()
    add(store, 0, 10)  # steps 20..29 staged
    sessions, committed = store.staged_snapshot()
    replaced = StagedSnapshot(sessions + 1, committed)  # planned from a writer gone since
    rows, steps, want = rows_of(store, 0, 0, 30)
    got, ok = read(worker_rows(store, replaced), rows, steps)
    assert ok[:20].all() and (got[:20] == want[:20]).all()  # committed: from shards
    assert not ok[20:].any()  # staged by another session: stale (spares stand in)
    store.close()


def test_store_sample_reads_the_samplers_plan_itself(workdir, monkeypatch):
    store = make(workdir, lanes=1)
    add(store, 0, 40)  # staged: read from this process's writer

    def no_round_trip(*args, **kwargs):
        raise AssertionError("Store.sample went back through the sampler's sample()")

    monkeypatch.setattr(es.UniformSampler, "sample", no_round_trip)
    batch = store.sample(8, rng=np.random.default_rng(0))
    assert len(batch["index"]) == 8
    steps = store.index.steps(batch["index"])
    assert (batch["tag"] == steps).all()  # lane 0: tag == step
    store.close()
