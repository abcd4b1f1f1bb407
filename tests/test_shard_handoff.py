"""Handing a full shard over inside an ``add``: the buffers' records, the writers' gates and
the writing threads' job rings (``storage/write/shard_buffer.py``, ``background.JobRing``,
``hand_off`` / ``enter`` in ``storage/native/step_shards.h``).

The step kernel hands shards over by itself only in the common case and reads no Python
attribute to decide it: what would send the hand-over through the writer's Python code
(spare lineages of a partial flush, writes halted after a failure, a full job ring) has to
be visible to it in those bytes and words, and the shards must still be written in order.
"""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest
from _writer_spies import count_calls, disk_full

import expstore as es
from expstore.storage.write import background, step_plan
from expstore.storage.write.background import JobRing
from expstore.storage.write.shard_buffer import R_DONE, R_ENTERED, R_FIRST, R_N, ShardBuffer
from expstore.storage.write.writer import LaneWriter

kernel = pytest.mark.skipif(step_plan.native is None, reason="step kernel not built")


def cartpole_spec() -> es.Spec:
    return es.Spec.create(obs=es.Field((4,), np.float32),
                          action=es.Field((), np.int64, low=0, high=1))


def add_steps(store: es.Store, k: int, start: int = 0) -> None:
    """``k`` steps of one episode, obs ``[i, i, i, i]`` for step ``i``."""
    for i in range(start, start + k):
        obs = np.full(4, i, np.float32)
        store.add(obs, i % 2, float(i), obs + 1, False, False)


def test_job_ring_is_first_in_first_out_as_it_grows():
    ring = JobRing(1)
    rng = random.Random(5)
    added = taken = 0
    for _ in range(2_000):
        if rng.random() < 0.55:
            ring.append((f"w{added}", added))
            added += 1
        elif len(ring):
            assert ring.popleft() == (f"w{taken}", taken)
            taken += 1
        assert len(ring) == added - taken
    assert len(ring.shards) >= added - taken and len(ring.shards) & (len(ring.shards) - 1) == 0
    while len(ring):
        assert ring.popleft() == (f"w{taken}", taken)
        taken += 1
    ring.append(None)  # the stop mark
    assert ring.popleft() is None and len(ring) == 0
    assert set(ring.writers) == {None} and set(ring.shards) == {None}  # nothing kept alive


def test_a_buffers_record_is_its_state():
    buf = ShardBuffer(-1, {}, {}, np.array([11, 22, 0], np.int64))
    assert (buf.n, buf.first_step, buf.entered, buf.clean, buf.done, buf.slot) == \
        (0, 0, False, True, True, -1)
    buf.n, buf.first_step, buf.entered, buf.done = 5, 32, True, False
    assert buf.rec[R_N] == 5 and buf.rec[R_FIRST] == 32 and buf.rec[R_ENTERED] == 1
    assert buf.rec[R_DONE] == 0 and list(buf.addresses) == [11, 22, 0]
    assert buf.rec_at == buf.rec.ctypes.data


@kernel
def test_the_kernel_keeps_the_open_buffers_record(tmp_path):
    store = es.create(str(tmp_path / "s.zarr"), cartpole_spec(), capacity=64, shard_rows=16,
                      fsync=False)
    w = store.writers[0]
    add_steps(store, 21)  # 16 rows: one shard handed over; 5 in the next
    assert w.cur.rec[R_N] == w.cur.n == 5 and w.cur.first_step == 16 and w.cur.entered
    assert store._appender.lane_rows.rec[0] == w.cur.rec_at  # the kernel's table
    w.wait()
    assert w.committed.count == 16
    store.close()


@kernel
def test_a_partial_flush_sends_the_next_hand_over_through_the_writer(tmp_path, monkeypatch):
    """After a partial flush the open shard has spare lineages (local disk), which only
    ``LaneWriter._hand_off`` attaches: the writer's gate says so to the kernel."""
    store = es.create(str(tmp_path / "s.zarr"), cartpole_spec(), capacity=128, shard_rows=16,
                      fsync=False)
    w = store.writers[0]
    add_steps(store, 5)
    assert w.gate[0] == 0
    store.flush()  # the open shard's objects, rewritten in place later: spares
    assert w._spares and w.gate[0] == 1
    handed = count_calls(monkeypatch, LaneWriter, "_hand_off")
    add_steps(store, 11, start=5)  # fills the shard
    assert handed == [1] and not w._spares and w.gate[0] == 0
    add_steps(store, 16, start=16)  # fills the next one: in the kernel again
    assert handed == [1]
    store.flush()
    other = es.open(store.url)
    assert len(other) == 32
    assert np.array_equal(other.read("reward", np.arange(32)), np.arange(32, dtype=np.float32))
    other.close()
    store.close()


@kernel
def test_a_halted_writer_closes_its_gate_until_a_flush_writes_again(tmp_path):
    store = es.create(str(tmp_path / "s.zarr"), cartpole_spec(), capacity=64, shard_rows=16,
                      fsync=False)
    w = store.writers[0]
    full = disk_full(store)
    add_steps(store, 16)  # its background write fails: the writer halts
    w.wait()
    assert w._halted and w.gate[0] == 1
    full[0] = False
    with pytest.raises(es.errors.WriteFailedError):
        store.add(np.full(4, 16, np.float32), 0, 16.0, np.full(4, 17, np.float32), False,
                  False)  # the error is reported once
    store.flush()
    assert not w._halted and w.gate[0] == 0
    store.close()


@kernel
def test_a_full_job_ring_hands_over_through_the_writer_in_order(tmp_path, monkeypatch):
    """The kernel leaves a hand-over to ``LaneWriter._hand_off`` when the thread's ring is
    full; the ring grows and the shards are still written first handed, first written."""
    monkeypatch.setattr(background.Background, "RING", 1)
    release = threading.Event()
    order: list[int] = []
    real_write = LaneWriter._background_write

    def slow_write(self, sh):
        order.append(sh.first_step)
        release.wait(30)
        real_write(self, sh)

    monkeypatch.setattr(LaneWriter, "_background_write", slow_write)
    store = es.create(str(tmp_path / "s.zarr"), cartpole_spec(), capacity=16 * 8,
                      shard_rows=16, fsync=False)
    w = store.writers[0]
    assert w.n_buffers >= 5
    handed = count_calls(monkeypatch, LaneWriter, "_hand_off")
    add_steps(store, 16 * 4 + 1)  # four full shards while the thread holds the first
    assert handed, "a full ring should have sent a hand-over through the writer"
    assert len(w._worker.jobs.shards) > 1  # grown
    release.set()
    w.wait()
    assert order == [0, 16, 32, 48] and w.committed.count == 64
    store.flush()
    other = es.open(store.url)
    assert np.array_equal(other.read("reward", np.arange(65)), np.arange(65, dtype=np.float32))
    other.close()
    store.close()


@kernel
@pytest.mark.parametrize("record", [(0, 1, 2, 3, 5, 4, 6), None])
def test_a_step_kernel_built_for_another_record_is_refused_naming_the_fix(monkeypatch,
                                                                          record):
    """A stale in-place build (older sources, or a record laid out otherwise) would read and
    write the wrong words of every buffer: importing refuses it, saying to rebuild."""
    import importlib.util

    from expstore.storage.native import _step
    from expstore.storage.write import shard_buffer

    if record is None:
        monkeypatch.delattr(_step, "RECORD")
    else:
        monkeypatch.setattr(_step, "RECORD", record)
    spec = importlib.util.spec_from_file_location("expstore.storage.write._shard_buffer_copy",
                                                  shard_buffer.__file__)
    module = importlib.util.module_from_spec(spec)
    with pytest.raises(ImportError, match="rebuild it"):
        spec.loader.exec_module(module)
