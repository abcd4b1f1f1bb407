"""Full shards written by a background thread, flushes that rewrite only what changed, and
the open shards' staging in shared memory (docs/architecture.md §4).

Rows come from ``expstore.testing.data`` (every byte derives from lane, step and writer
session), so every check is byte for byte.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time

import numpy as np
import pytest
import zarr
from _writer_spies import route_puts

import expstore as es
from expstore.errors import StoreLockedError
from expstore.storage.backends.local import LocalBackend
from expstore.storage.format import shard as shard_mod
from expstore.storage.native.kernels import write as native  # the write kernel
from expstore.storage.write.staging import SharedStaging, StagedLanes, staging_path, sweep
from expstore.testing import data, scratch_dir


@pytest.fixture
def workdir(tmp_path):
    with scratch_dir(str(tmp_path)) as d:
        yield d


def _session0(lane, steps):
    return np.zeros(len(np.atleast_1d(steps)), np.int64)


def check_all(store) -> int:
    return sum(data.check_lane(store, lane, _session0, {0}) for lane in range(store.lanes))


def make(workdir, lanes=1, shard_rows=32, shards=4, **kw):
    url = os.path.join(workdir, "s.zarr")
    return es.create(url, data.spec(), capacity=lanes * shard_rows * shards, lanes=lanes,
                     shard_rows=shard_rows, **kw)


def add(store, lane=0, n=1):
    for _ in range(n):
        b, _ = data.make_steps(lane, store.writers[lane].count, 1, 0)
        one = {k: ({kk: vv[0] for kk, vv in v.items()} if isinstance(v, dict) else v[0])
               for k, v in b.items()}
        store.add(one["obs"], one["action"], one["reward"], one["next_obs"],
                  one["terminated"], one["truncated"], lane=lane, session=one["session"])


# -- shard objects assembled incrementally -------------------------------------------------
@pytest.mark.parametrize("dtype,shape,rows_per_chunk", [
    (np.uint8, (6, 5), 1), (np.float32, (), 16), (np.int64, (), 4), (np.bool_, (), 16)])
def test_incremental_image_equals_a_shard_assembled_at_once(dtype, shape, rows_per_chunk):
    S = 16
    codec = shard_mod.Checked(shard_mod.make_codec({"name": "blosc"}, np.dtype(dtype).itemsize))
    enc = shard_mod.encoder(codec)
    many = shard_mod.rows_encoder(codec, np.dtype(dtype))
    rng = np.random.default_rng(0)
    rows = (rng.random((S, *shape)) * 100).astype(dtype)
    for encode_many in (None, many):
        img = shard_mod.ShardImage(S // rows_per_chunk, rows_per_chunk, enc, 0, encode_many)
        n = 0
        for step in (1, 2, 1, 5, 3, 4):  # flushes after uneven numbers of rows
            n += step
            img.update(rows, n)
            R = rows_per_chunk
            chunks = []
            for c in range(S // R):
                if c * R >= n:
                    chunks.append(None)
                    continue
                part = rows[c * R:(c + 1) * R].copy()
                part[max(n - c * R, 0):] = 0
                chunks.append(enc(np.ascontiguousarray(part)))
            want = shard_mod.assemble(chunks, 100, n, True)
            assert img.compact(100, n, True) == want
            head = shard_mod.parse_head(bytes(img.seal(100, n, True)), S // R, "x")
            assert head.n_rows == n and head.first_step == 100


def test_a_header_read_with_another_version_of_the_index_is_refused():
    a = shard_mod.assemble([b"abcd", None], 0, 1, True)
    b = shard_mod.assemble([b"abcd", b"efgh"], 0, 2, True)
    isz = shard_mod.index_size(2)
    mixed = a[:isz] + b[isz:isz + shard_mod.HEADER_SIZE]  # old index, new header
    with pytest.raises(es.StoreCorruptError, match="another index"):
        shard_mod.parse_head(mixed, 2, "x")


@pytest.mark.skipif(native is None,
                    reason="C kernel not built")
def test_batch_encoder_writes_what_numcodecs_writes():
    codec = shard_mod.Checked(shard_mod.make_codec({"name": "blosc"}, 1))
    rows = np.random.default_rng(1).integers(0, 8, (50, 84, 84), dtype=np.uint8)
    blob, sizes = shard_mod.rows_encoder(codec, np.dtype(np.uint8))(rows, 50)
    one = shard_mod.encoder(codec)
    assert blob == b"".join(one(r) for r in rows) and sizes.sum() == len(blob)


def test_plain_zarr_reads_a_shard_flushed_in_place_many_times(workdir):
    store = make(workdir, shard_rows=64, shards=2)
    for _ in range(40):  # 40 flushes of one partly filled shard
        add(store, n=1)
        store.flush()
    g = zarr.open_group(store.url[len("file://"):], mode="r")
    n = store.writers[0].count
    assert np.array_equal(g["_step_id"][:n], np.arange(n))
    assert np.array_equal(g["obs.pixels"][:n], store.read("obs.pixels", np.arange(n)))
    assert (g["_step_id"][n:64] == -1).all()  # rows not written read as the fill value
    store.close()


def test_a_flush_writes_what_was_added_since_the_last_one(workdir, monkeypatch):
    """The cost of a flush follows the rows added since the last one, not the open shard:
    the bytes written by a one-row flush stay flat as the shard fills."""
    store = make(workdir, shard_rows=512, shards=2)
    written = []
    real = os.pwrite

    def counting(fd, buf, offset):
        written[-1] += len(buf)
        return real(fd, buf, offset)

    monkeypatch.setattr(os, "pwrite", counting)
    per_flush = []
    for _ in range(300):
        add(store, n=1)
        written.append(0)
        store.flush()
        per_flush.append(written[-1])
    early, late = np.median(per_flush[10:30]), np.median(per_flush[-20:])
    assert late < 1.5 * early + 4096, (early, late)
    store.close()


# -- the background thread ---------------------------------------------------------------
def test_a_full_shard_is_written_by_one_kernel_call_for_all_its_fields(workdir, monkeypatch):
    """The writing thread hands a full shard's objects (one per field) to the write kernel
    at once: one call without the GIL, not a temp file, fsync and rename per field each
    taking the GIL back (docs/architecture.md §4); the rows read back."""
    if native is None:
        pytest.skip("the write kernel was not built")
    store = make(workdir, shard_rows=16)
    calls, real = [], native.replace_files
    monkeypatch.setattr(native, "replace_files", lambda *a: calls.append(a[1]) or real(*a))
    add(store, 0, 16)
    store.writers[0].wait()
    L = store.layout
    assert [sorted(paths) for paths in calls] == [sorted(
        os.path.join(store.backend.root, L.shard_key(name, 0)) for name in L.fields)]
    assert store.writers[0].committed.count == 16
    root = store.backend.root  # its temp files went to the writer's own folder, now empty
    assert not [f for _, _, fs in os.walk(root) for f in fs if f.endswith(".tmp")]
    store.close()
    back = es.open(os.path.join(workdir, "s.zarr"))
    assert back.index.count[0] >= 16 and back.sample(8)["action"].shape == (8,)
    back.close()


class Gate:
    """Hold the background thread's shard writes until ``open()``."""

    def __init__(self, backend):
        self.backend, self.real = backend, backend.put
        self.event = threading.Event()
        self.waited = 0
        route_puts(backend, self.put)

    def put(self, key, data):
        if threading.current_thread().name == "expstore-writer":
            self.waited += 1
            self.event.wait()
        self.real(key, data)

    def open(self):
        self.event.set()


def test_the_add_that_fills_a_shard_does_not_wait_for_its_write(workdir):
    store = make(workdir)
    S = store.layout.shard_rows
    gate = Gate(store.backend)
    w = store.writers[0]
    add(store, n=3 * S // 2)  # a full shard goes to the background thread, which is held
    assert w.queued and w.committed.count == 0
    assert check_all(store) == len(store)  # rows of the queued shard read from its buffer
    other = es.open(store.url)  # another reader: committed rows when opened, ...
    assert int(other.index.count[0]) == 0
    other.refresh()  # ... and what writers staged since, from shared memory
    assert int(other.index.count[0]) == w.count and check_all(other) == w.count
    gate.open()
    w.wait()
    store._poll_writes()
    assert w.committed.count == S and int(store.index.committed[0]) == S
    other.refresh()
    assert int(other.index.committed[0]) == S and check_all(other) == w.count
    store.close()
    other.close()


def test_when_every_buffer_waits_for_its_write_the_next_add_waits(workdir):
    store = make(workdir, shard_rows=16, shards=8)
    S = store.layout.shard_rows
    gate = Gate(store.backend)
    w = store.writers[0]
    k = w.n_buffers
    add(store, n=(k - 1) * S)  # k - 1 full shards queued, the last buffer current
    assert len(w.queued) == k - 1
    timer = threading.Timer(0.3, gate.open)
    timer.start()
    t0 = time.monotonic()
    add(store, n=S)  # fills the last buffer: no free one until the oldest write is done
    assert time.monotonic() - t0 >= 0.25
    timer.join()
    store.flush()
    assert w.committed.count == w.count and check_all(store) == len(store)
    store.close()


def test_a_forked_child_cannot_write_through_its_parent_store(workdir):
    store = make(workdir)
    add(store, n=40)
    path = staging_path(store.backend.root, 0)
    ctx = mp.get_context("fork")
    q = ctx.Queue()

    def child():
        try:
            add(store, n=1)
            q.put("added")
        except StoreLockedError as e:
            q.put("refused" if "fork" in str(e) else str(e))
        store.close()  # no flush, no lease release, no unlink: all the parent's
        q.put(os.path.exists(path))

    p = ctx.Process(target=child)
    p.start()
    assert q.get(timeout=30) == "refused" and q.get(timeout=30) is True
    p.join(30)
    add(store, n=40)  # the parent goes on as before
    store.flush()
    assert check_all(store) == len(store) and os.path.exists(path)
    store.close()
    assert not os.path.exists(path)


# -- shared-memory staging -----------------------------------------------------------------
def test_another_process_sees_staged_rows_byte_for_byte(workdir):
    store = make(workdir, lanes=2)
    ctx = mp.get_context("fork")
    r, w = ctx.Pipe()

    def writer():
        s = es.open(store.url, "r+")
        add(s, 0, 45)
        add(s, 1, 10)
        s.writers[0].wait()  # the full shard of lane 0 is committed (in the background)
        r.send([s.writers[i].count for i in range(2)])
        r.recv()  # stay alive (and unflushed) until the reader has looked
        s.close()

    store.close()
    p = ctx.Process(target=writer, daemon=True)
    p.start()
    try:
        counts = w.recv()
        reader = es.open(store.url)
        reader.refresh()
        assert reader.index.count.tolist() == counts
        assert int(reader.index.committed[0]) == 32 and int(reader.index.committed[1]) == 0
        assert check_all(reader) == sum(counts)
        batch = reader.sample(64)  # samplers see them
        data.check_batch(batch, reader.index, _session0)
    finally:
        w.send("done")
        p.join(30)
    reader.refresh()  # closed: flushed, and the staging is gone
    assert reader.index.committed.tolist() == counts and check_all(reader) == sum(counts)
    reader.close()


def test_a_recycled_buffer_is_never_read_as_the_rows_it_held(workdir):
    store = make(workdir, shard_rows=16, shards=8)
    add(store, n=10)
    lanes = StagedLanes(store.backend.root, store.layout, recheck=0)
    m = lanes.lane(0)
    steps = np.arange(10)
    out = np.empty((10, *data.SHAPE), np.uint8)
    assert m.read("obs.pixels", steps, out).all()
    w = store.writers[0]
    w.shared.begin(w.cur.slot, 1000)  # the writer recycles that buffer for another shard
    assert not m.read("obs.pixels", steps, out).any()
    store.close()


def test_readers_ignore_a_dead_writers_staging_and_it_is_swept(workdir):
    store = make(workdir)
    add(store, n=10)
    path = staging_path(store.backend.root, 0)
    ctx = mp.get_context("fork")

    def dies():
        kept = SharedStaging.create(store.backend.root, 5, store.layout, 2)
        assert kept is not None
        os._exit(0)  # killed, in effect: nothing runs on the way out

    p = ctx.Process(target=dies)
    p.start()
    p.join(30)  # a writer of lane 5 that died without closing: its file stays
    dead = staging_path(store.backend.root, 5)
    assert os.path.exists(dead)
    assert StagedLanes(store.backend.root, store.layout, recheck=0).lane(5) is None
    assert sweep() >= 1 and not os.path.exists(dead) and os.path.exists(path)
    store.close()


def test_loader_workers_read_rows_never_flushed(workdir):
    store = make(workdir, shard_rows=64, shards=4)
    add(store, n=120)
    assert store.publishes_staging
    loader = es.make_loader(store, batch_size=16, num_workers=2, num_batches=8, guard=0)
    assert not loader.plans.view.committed_only
    # make_loader flushed nothing: at most the filled shard 0 is committed (by the background
    # writer, whenever its write lands), never the 120 rows added
    assert int(store.index.committed[0]) in (0, 64)
    n = 0
    for batch in loader:
        data.check_batch({k: v.numpy() for k, v in batch.items()}, None, _session0,
                         store.layout.lane_capacity)
        n += int((batch["step_id"].numpy() + 1 >= 64).sum())
    assert n > 0, "no sample of a staged row"
    loader.close()
    store.close()


def test_a_store_not_on_this_machine_flushes_for_its_loader():
    store = es.create("memory://bg-writer-test", data.spec(), capacity=128, shard_rows=32,
                      lease_ttl=None)
    add(store, n=40)
    assert not store.publishes_staging and store.writers[0].shared is None
    assert int(store.index.committed[0]) < store.writers[0].count  # rows only staged
    loader = es.make_loader(store, batch_size=8, num_workers=2, num_batches=1)
    assert loader.plans.view.committed_only  # workers read storage only: flushed for them
    assert int(store.index.committed[0]) == store.writers[0].count
    del loader
    store.close()


def test_total_bytes_counts_a_file_with_two_names_once(workdir):
    b = LocalBackend(workdir)
    b.put("a/x", b"1" * 10000)
    os.link(os.path.join(workdir, "a/x"), os.path.join(workdir, "a/y"))
    one = b.total_bytes("a")
    os.remove(os.path.join(workdir, "a/y"))
    assert b.total_bytes("a") == one


# -- a vector env's add: one row in every lane per call ----------------------------------------
def add_lanes(store, n=1):
    """``n`` vector adds: one step of each lane (its next step, as ``add`` gives one)."""
    for _ in range(n):
        one = [data.make_steps(lane, store.writers[lane].count, 1, 0)[0]
               for lane in range(store.lanes)]

        def stacked(key, one=one):
            if isinstance(one[0][key], dict):
                return {k: np.concatenate([b[key][k] for b in one]) for k in one[0][key]}
            return np.concatenate([b[key] for b in one])

        store.add(stacked("obs"), stacked("action"), stacked("reward"), stacked("next_obs"),
                  stacked("terminated"), stacked("truncated"), session=stacked("session"))


@pytest.fixture(params=["native", "numpy"])
def scatter(request, monkeypatch):
    """The vector path with the C kernel, and without it (a build without a compiler)."""
    if request.param == "native" and native is None:
        pytest.skip("C kernel not built")
    if request.param == "numpy":
        monkeypatch.setattr("expstore.storage.native.kernels.write", None)
    return request.param


def test_vector_add_stores_the_rows_one_add_per_lane_stores(workdir, scatter):
    # 3 lanes of 64 rows in 16-row shards: 150 vector adds wrap every lane around twice,
    # episodes end (final rows) at different steps in each lane
    vec = make(workdir, lanes=3, shard_rows=16, shards=4)
    one = es.create(os.path.join(workdir, "one.zarr"), data.spec(), capacity=3 * 64, lanes=3,
                    shard_rows=16)
    for t in range(150):
        add_lanes(vec)
        for lane in range(3):
            add(one, lane)
        if t in (7, 70, 149):  # staged rows (shared memory), then as flushed
            idx, ref = vec.index, one.index
            assert idx.count.tolist() == ref.count.tolist()
            assert idx.valid_from.tolist() == ref.valid_from.tolist()
            assert np.array_equal(idx.flags, ref.flags)
            assert np.array_equal(idx.episode_step, ref.episode_step)
            assert check_all(vec) == check_all(one) == len(vec)
            other = es.open(vec.url)  # a reader elsewhere: sees the staged rows at once
            other.refresh()
            assert other.index.count.tolist() == idx.count.tolist()
            assert check_all(other) == len(vec)
            other.close()
    vec.close()
    one.close()
    again = es.open(vec.url)
    assert check_all(again) == len(again) > 0
    again.close()


def test_vector_add_refuses_a_bad_lane_value_and_stores_nothing(workdir, scatter):
    store = make(workdir, lanes=3, shard_rows=16, shards=4)
    add_lanes(store, 5)
    before = store.index.count.copy()
    b = [data.make_steps(lane, store.writers[lane].count, 1, 0)[0] for lane in range(3)]
    obs = {k: np.concatenate([x["obs"][k] for x in b]) for k in ("pixels", "vec")}
    nxt = {k: np.concatenate([x["next_obs"][k] for x in b]) for k in ("pixels", "vec")}
    obs["vec"][2, 1] = np.nan
    with pytest.raises(es.ValidationError, match=r"^obs\.vec: expected finite values"):
        store.add(obs, np.zeros(3, np.int64), np.zeros(3, np.float32), nxt,
                  np.zeros(3, bool), np.zeros(3, bool), session=np.zeros(3, np.int32))
    assert store.index.count.tolist() == before.tolist()
    add_lanes(store, 40)  # the lanes go on as if nothing happened
    store.flush()
    assert check_all(store) == len(store)
    store.close()


def test_a_lane_whose_writes_stall_does_not_hold_up_the_other_lanes(workdir):
    store = make(workdir, lanes=2, shard_rows=16, shards=4)
    L = store.layout
    lane0 = {L.shard_key(n, s) for n in L.fields for s in range(L.shards_per_lane)}
    stalled, real = threading.Event(), store.backend.put

    def put(key, blob):
        if key in lane0 and threading.current_thread().name == "expstore-writer":
            stalled.wait()
        real(key, blob)

    route_puts(store.backend, put)
    w0, w1 = store.writers[0], store.writers[1]
    add(store, 0, 16)  # lane 0's full shard: its write stalls
    add(store, 1, 16)  # lane 1's full shard is written meanwhile, by another thread
    deadline = time.monotonic() + 20
    while w1.queued and time.monotonic() < deadline:
        time.sleep(0.01)
        w1.poll()
    try:
        assert w1.committed.count >= 16 and w0.committed.count == 0 and w0.queued
    finally:
        stalled.set()
    store.flush()
    assert [w.committed.count for w in (w0, w1)] == [w0.count, w1.count]
    assert check_all(store) == len(store) >= 32
    store.close()


@pytest.mark.skipif(native is None, reason="C kernel not built")
def test_stage_lanes_kernel_writes_each_lanes_row_then_its_count():
    L, S = 3, 4
    bufs = [{"x": np.zeros((S, 2), np.float32), "_step_id": np.full(S, -1, np.int64)}
            for _ in range(L)]
    names = ["x", "_step_id"]
    base = np.array([[b[name].ctypes.data for b in bufs] for name in names], np.int64)
    counts = np.zeros(L, np.int64)  # each lane's published row count
    pub = np.array([counts[1:].ctypes.data, 0, counts.ctypes.data], np.int64)  # lane 1: none
    n = np.array([3, 0, 1], np.int64)
    first = np.array([100, 200, 300], np.int64)
    lanes = np.array([2, 0], np.int64)
    src = np.array([[1, 2], [3, 4]], np.float32)
    steps = np.empty(2, np.int64)
    full = native.stage_lanes((src, None), lanes, base, n, first, pub,
                              np.array([8, 8], np.int64), 1, steps, S)
    assert full == 1 and n.tolist() == [4, 0, 2] and steps.tolist() == [301, 103]
    assert bufs[2]["x"][1].tolist() == [1, 2] and bufs[0]["x"][3].tolist() == [3, 4]
    assert bufs[2]["_step_id"].tolist() == [-1, 301, -1, -1]
    assert bufs[0]["_step_id"].tolist() == [-1, -1, -1, 103]
    assert not bufs[1]["x"].any()
    assert counts.tolist() == [2, 4, 0]  # lane 2's count at counts[0], lane 0's at counts[1]
    with pytest.raises(IndexError, match="lane 3 out of range"):
        native.stage_lanes((src, None), np.array([3], np.int64), base, n, first, pub,
                           np.array([8, 8], np.int64), 1, steps, S)
    with pytest.raises(ValueError, match="fewer than"):
        native.stage_lanes((src[:1], None), lanes, base, n, first, pub,
                           np.array([8, 8], np.int64), 1, steps, S)


def test_a_burst_of_small_shards_is_staged_while_storage_stalls(workdir):
    store = make(workdir, shard_rows=16, shards=32)
    w = store.writers[0]
    assert w.n_buffers == 16  # small shards: 16 buffers within the store's staging budget
    gate = Gate(store.backend)
    burst = threading.Thread(target=add, args=(store, 0, 15 * 16))  # 15 full shards
    burst.start()
    burst.join(30)
    try:
        assert not burst.is_alive() and len(w.queued) >= 14  # nothing waited for storage
    finally:
        gate.open()
    burst.join()
    store.flush()
    assert w.committed.count == w.count and check_all(store) == len(store)
    store.close()


def test_shard_buffers_per_lane_follow_the_staging_budget():
    from expstore.storage.write.writer import MAX_BUFFERS, POOL_BYTES, pool_size

    assert pool_size(90_000, 1) == MAX_BUFFERS  # CartPole-sized shards
    assert pool_size(14 << 20, 1) == 4  # 2048 Atari frames: 4 x 14 MiB within 64 MiB
    assert pool_size(2 << 20, 64) == 3  # many lanes: at least 3 each
    assert pool_size(POOL_BYTES + 1, 1) == 2  # one shard beyond the budget: 2


def test_an_idle_writer_thread_looks_for_work_less_and_less_often():
    """After a write the thread looks again in ``POLL`` seconds, then twice as long after
    each look that finds nothing, up to ``MAX_POLL`` (each look takes the GIL from the
    training loop); a hurry or a new write brings it back to ``POLL``."""

    from expstore.storage.write.background import JobRing, _run, _stop

    class Wake(threading.Event):
        def __init__(self) -> None:
            super().__init__()
            self.timeouts: list[float | None] = []

        def wait(self, timeout: float | None = None) -> bool:
            self.timeouts.append(timeout)
            return super().wait(timeout)

    class Writer:
        written = 0

        def _background_write(self, shard: object) -> None:
            Writer.written += 1

    poll, most = 0.002, 0.016
    jobs = JobRing()
    jobs.append((Writer(), "shard"))
    wake = Wake()
    thread = threading.Thread(target=_run, args=(jobs, wake, np.zeros(1, np.uint8),
                                                 {"news": False}, (poll, most), 60.0))
    thread.start()
    try:
        time.sleep(0.2)  # ~0.03 s of backing off, then looks every 0.016 s
        looks = list(wake.timeouts)
        assert Writer.written == 1
        assert looks[:4] == [poll, 2 * poll, 4 * poll, most]
        assert set(looks[4:]) == {most} and 8 <= len(looks) <= 20  # (at 2 ms: ~100)
        wake.set()  # a hurry: the next look comes soon again
        time.sleep(0.05)
        after = wake.timeouts[len(looks):]
        assert after[:2] == [most, poll] or after[:1] == [poll]
    finally:
        _stop(jobs, wake)
        thread.join(5)
    assert not thread.is_alive()


def test_a_killed_writers_temp_files_are_cleared_by_the_lanes_next_writer(workdir):
    """What a writer killed mid-write leaves (temp files in its own folder, an index
    snapshot block's temp file) goes when the next writer takes the lane; another
    lane's folders are its own writer's to clear."""
    url = os.path.join(workdir, "s.zarr")
    make(workdir, lanes=2).close()
    root = LocalBackend(url).root
    left = ["_state/spare/lane_0/dead0001/tmp/obs%c%0%0.99.1.tmp",
            "_index/lane_0/.block_0.99.2.tmp", "_index/lane_1/.block_0.99.3.tmp"]
    for key in left:
        os.makedirs(os.path.dirname(os.path.join(root, key)), exist_ok=True)
        open(os.path.join(root, key), "wb").close()
    store = es.open(url, mode="r+", lane=0)
    assert [k for k in left if os.path.exists(os.path.join(root, k))] == [left[2]]
    store.close()
