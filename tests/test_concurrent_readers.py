"""Readers in other processes while a writer wraps the ring many times: never a torn,
mismatched or overwritten row (``expstore.testing.concurrent``; long version:
``python scripts/reader_soak.py``)."""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest

import expstore as es
from expstore import store as store_mod
from expstore.sampling.windows import make_plan
from expstore.storage import faults  # internals: the crash points
from expstore.testing import concurrent, crash, data, scratch_dir


@pytest.fixture
def workdir(tmp_path):
    with scratch_dir(str(tmp_path)) as d:
        yield d


def _report(res: concurrent.RunResult) -> str:
    return (f"{res.samples} samples checked by {len(res.readers)} reader(s), writer "
            f"{res.laps:.0f} laps, {res.writer_sessions} writer session(s), stale replaced "
            f"{sum(r.stale_replaced for r in res.readers)}")


def test_samplers_while_the_writer_wraps(workdir):
    res = concurrent.run(workdir, seconds=7, readers=2, lag=0.1)
    assert not res.errors, res.errors[0]
    assert res.laps > 3, "the writer should wrap each lane several times"
    assert res.samples > 2_000 and all(r.samples > 500 for r in res.readers)
    print("\n" + _report(res))


def test_samplers_while_the_writer_is_killed_and_restarted(workdir):
    res = concurrent.run(workdir, seconds=7, readers=1, restart_every=1.0, lag=0.1)
    assert not res.errors, res.errors[0]
    assert res.writer_sessions >= 4 and res.samples > 1_000
    print("\n" + _report(res))


def test_loader_workers_while_the_writer_wraps(workdir):
    res = concurrent.run(workdir, seconds=8, readers=1, loader_workers=2, batch_size=64)
    assert not res.errors, res.errors[0]
    assert res.samples > 1_000 and res.laps > 3
    print("\n" + _report(res))


def test_reader_never_serves_rows_a_killed_writer_left_uncommitted(workdir):
    """A reader opens a shard version that a killed writer wrote past its last commit;
    the next writer commits other bytes at those steps: the reader must serve those."""
    url, log = os.path.join(workdir, "s.zarr"), os.path.join(workdir, "log")
    crash.create_store(url, lanes=1, shard_rows=32, shards_per_lane=4)
    with es.open(url, "r+") as w:
        crash._log(log, "S", 0, [0])
        w.extend(data.make_steps(0, 0, 36, 0)[0])
    reader = es.open(url)
    r, wfd = os.pipe()

    def killed_writer():  # writes 8 more steps' shards, frozen before the state commit
        faults.arm("flush.state", 1, notify=lambda _: os.write(wfd, b"x"))
        s = es.open(url, "r+")
        crash._log(log, "S", 1, [s.writers[0].count])
        s.extend(data.make_steps(0, s.writers[0].count, 8, 1)[0])
        s.flush()

    p = mp.get_context("fork").Process(target=killed_writer)
    p.start()
    assert os.read(r, 1) == b"x"
    reader.refresh()  # reads committed rows of the shard: opens the uncommitted version
    sessions = crash.Log.read(log, 1)
    # (it also sees the rows the frozen writer staged in shared memory: not committed)
    assert int(reader.index.count[0]) > int(reader.index.committed[0])
    committed = data.check_lane(reader, 0, sessions.session_of, sessions.start_counts(0),
                                steps=np.arange(int(reader.index.lower_bound()[0]),
                                                int(reader.index.committed[0])))
    p.kill()
    p.join()
    with es.open(url, "r+") as w:  # the next writer: same steps, other bytes
        crash._log(log, "S", 2, [w.writers[0].count])
        w.extend(data.make_steps(0, w.writers[0].count, 8, 2)[0])
    reader.refresh()
    sessions = crash.Log.read(log, 1)
    assert data.check_lane(reader, 0, sessions.session_of, sessions.start_counts(0)) > committed
    for _ in range(20):
        data.check_batch(reader.sample(32), reader.index, sessions.session_of)
    reader.close()


def test_a_reader_more_than_a_lap_behind_catches_up(workdir, monkeypatch):
    """refresh() reads the lane states, then the rows they commit; if the writer wrapped
    over those rows in between, the reader re-reads the states instead of failing."""
    url = os.path.join(workdir, "s.zarr")
    crash.create_store(url, lanes=1, shard_rows=32, shards_per_lane=4)
    writer = es.open(url, "r+")
    writer.extend(data.make_steps(0, 0, 60, 0)[0])
    writer.flush()
    reader = es.open(url)
    writer.extend(data.make_steps(0, writer.writers[0].count, 90, 0)[0])
    writer.flush()
    stale = store_mod.read_states(reader.backend, [0])  # newer than the reader, not current
    writer.extend(data.make_steps(0, writer.writers[0].count, 300, 0)[0])  # > 2 laps
    writer.flush()
    real = store_mod.read_states
    calls = []

    def first_stale(backend, lanes):
        calls.append(lanes)
        return stale if len(calls) == 1 else real(backend, lanes)

    monkeypatch.setattr(store_mod, "read_states", first_stale)
    reader.refresh()
    assert len(calls) == 1 and stale[0].count < writer.writers[0].count
    assert int(reader.index.count[0]) == writer.writers[0].count
    assert data.check_lane(reader, 0, lambda lane, s: np.zeros(len(s), np.int64), {0}) == \
        len(reader)
    writer.close()
    reader.close()


@pytest.mark.parametrize("how", ["sampler", "store"])
def test_a_batch_wholly_overwritten_since_the_last_refresh_is_drawn_again(workdir, how):
    """A learner samples another process's lane, and its writer lapped the ring since the
    learner last read the lane's state: every row of the plan is gone. ``sample`` refreshes
    and draws a fresh plan, as ``make_loader`` does, instead of raising
    ``StaleBatchError`` (a CI run died of it: three writers lapping 96-row rings)."""
    url = os.path.join(workdir, "s.zarr")
    crash.create_store(url, lanes=1, shard_rows=32, shards_per_lane=4)
    writer = es.open(url, "r+")
    writer.extend(data.make_steps(0, 0, 60, 0)[0])
    writer.flush()
    reader = es.open(url)  # read-only: sees the writer's rows at refreshes only
    sampler = es.UniformSampler(reader, seed=1, refresh_every=None)  # never by itself
    rows_before = reader.index.count.copy()
    writer.extend(data.make_steps(0, writer.writers[0].count, 400, 0)[0])  # > 3 laps
    writer.flush()
    old = make_plan(reader.index, np.flatnonzero(reader.index.valid(np.arange(60), 3, 1)))
    with pytest.raises(es.StaleBatchError):  # the old view's rows: all overwritten
        reader.read_plan(old)
    batch = sampler.sample(32) if how == "sampler" else reader.sample(32)
    assert int(reader.index.count[0]) == writer.writers[0].count > rows_before[0]
    assert batch["step_id"].min() >= writer.writers[0].count - 128  # the current lap's
    assert data.check_batch(batch, reader.index) == 32
    writer.close()
    reader.close()


def test_a_mixture_part_wholly_overwritten_is_planned_again(workdir):
    """The same for one component of a mixture: its part is planned again by that
    component after a refresh; the other part is read as planned."""
    urls = [os.path.join(workdir, f"{name}.zarr") for name in ("a", "b")]
    writers = []
    for url in urls:
        crash.create_store(url, lanes=1, shard_rows=32, shards_per_lane=4)
        writers.append(es.open(url, "r+"))
        writers[-1].extend(data.make_steps(0, 0, 60, 0)[0])
        writers[-1].flush()
    reader = es.open(urls[0])
    lagging = es.UniformSampler(reader, seed=1, refresh_every=None)
    mix = es.MixtureSampler([(lagging, 0.5), (writers[1], 0.5)], seed=0)
    plan = mix.plan(16)
    writers[0].extend(data.make_steps(0, writers[0].writers[0].count, 400, 0)[0])  # 3 laps
    writers[0].flush()
    batch = mix.read(plan)
    assert np.bincount(batch["source"]).tolist() == [8, 8]
    a = batch["source"] == 0
    assert batch["step_id"][a].min() >= writers[0].writers[0].count - 128
    assert np.array_equal(batch["index"][~a], plan.parts[1][1].rows)  # read as planned
    for src, index in ((0, reader.index), (1, writers[1].index)):
        part = {k: v[batch["source"] == src] for k, v in batch.items()}
        assert data.check_batch(part, index) == 8
    for w in writers:
        w.close()
    reader.close()


def test_readers_see_rows_never_flushed(workdir):
    """The writer only adds (it never flushes; full shards are committed in the background):
    samplers in other processes and DataLoader workers read its open shards' rows from its
    shared-memory staging, every one checked byte for byte."""
    res = concurrent.run(workdir, seconds=7, readers=2, loader_workers=2, adds_only=True,
                         lag=0.05)
    assert not res.errors, res.errors[0]
    assert res.samples > 1_000 and all(r.samples > 200 for r in res.readers)
    assert all(r.unflushed > 0 for r in res.readers), [r.unflushed for r in res.readers]
    print("\n" + _report(res) + f", unflushed {[r.unflushed for r in res.readers]}")


def test_samplers_see_unflushed_rows_while_the_writer_is_killed(workdir):
    """Staged rows of a writer killed before flushing them were never committed: a reader
    that saw them drops them at its next refresh and never mixes them with the next
    writer's rows at the same steps."""
    res = concurrent.run(workdir, seconds=7, readers=1, restart_every=1.0, lag=0.1,
                         adds_only=True)
    assert not res.errors, res.errors[0]
    assert res.writer_sessions >= 4 and res.samples > 500 and res.readers[0].unflushed > 0
    print("\n" + _report(res) + f", unflushed {res.readers[0].unflushed}")
