"""The hot set: decoded small fields (state vectors, scalars) held in RAM for sampling.

A batch of a low-dim store is gathered out of the hot set in one kernel call
(``ShardReader.gather_held``). It must return exactly what the general path returns for
the same plan, across ring wraps, rows still staged, a writer in another process lapping
the ring, a budget too small for the store (admission, no churn) and ``hot_bytes=0``; the
C kernel and its numpy fallback return the same batches.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import expstore as es
from expstore.loading.columns import numpy_alloc
from expstore.loading.store_rows import StoreRows
from expstore.loading.transition_batch import finish_many, read_columns
from expstore.testing.thread_race import EP_LEN, key, write, wrong_samples

#: rows per inner chunk of the vector fields of the stores below (``None``: the default,
#: which for 5 floats is the whole 32- or 64-row shard); set per test by ``chunking``
CHUNK_ROWS: list[int | None] = [None]


@pytest.fixture(autouse=True, params=[None, 8], ids=["one-chunk", "8-row-chunks"])
def chunking(request):
    """Every test twice: vector fields of one chunk per shard, and of 8-row chunks (a
    shard is then filled whole into the hot set from several chunks)."""
    CHUNK_ROWS[0] = request.param
    yield request.param
    CHUNK_ROWS[0] = None


def make_store(path, capacity=256, shard_rows=32, **kw):
    cr = CHUNK_ROWS[0]
    spec = es.Spec.create(obs=es.Field((5,), np.float32, chunk_rows=cr),
                          action=es.Field((2,), np.float32, chunk_rows=cr))
    return es.create(path, spec, capacity=capacity, shard_rows=shard_rows, **kw)


def check(batch: dict) -> None:
    """Every sampled field belongs to the one transition the obs names (``write``'s
    transitions, ``thread_race.wrong_samples``)."""
    wrong = wrong_samples(batch)
    assert not len(wrong), {k: v[wrong[:3]].tolist() for k, v in batch.items()}


def general(store, plan) -> dict:
    """The plan read without the hot set (every field through ``read_columns``)."""
    (batch, stale), = finish_many(plan, *read_columns(plan, store.layout, store.source,
                                                      lazy=True), numpy_alloc)
    assert stale == 0
    return batch


def same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


@pytest.fixture
def hot_calls(monkeypatch):
    """Batches served from the hot set (``StoreRows.gather_held`` answering True)."""
    served = [0, 0, False]  # answered True, False; the last answer
    real = StoreRows.gather_held

    def counting(self, locs, jobs):
        ok = real(self, locs, jobs)
        served[0 if ok else 1] += 1
        served[2] = ok
        return ok

    monkeypatch.setattr(StoreRows, "gather_held", counting)
    return served


@pytest.mark.parametrize("shard_rows", [32, 24])  # (24: the kernel divides, no shift)
def test_hot_batches_match_the_general_path_across_wraps_and_staged_rows(tmp_path,
                                                                         hot_calls,
                                                                         shard_rows):
    store = make_store(tmp_path / "s.zarr", shard_rows=shard_rows)
    sampler = es.UniformSampler(store, seed=0)
    write(store, 0, 100)
    store.flush()
    g, staged = 100, 0
    for i in range(120):  # ~5 laps of the 256-row ring
        write(store, g, 9)
        g += 9
        if i % 4:
            store.flush()
        for _ in range(3):  # (the first batch after a flush refills the rewritten shard)
            plan = sampler.plan(32)
            batch = store.read_plan(plan)
            check(batch)
            same(batch, general(store, plan))
            staged += int((batch["step_id"] >= store.writers[0].committed.count).sum())
    assert staged > 0  # rows still in the writer's RAM were sampled (not from the hot set)
    assert hot_calls[0] > 20 and hot_calls[1] > 0
    store.close()


def test_rows_the_learners_own_writers_staged_come_in_the_same_kernel_call(tmp_path,
                                                                           monkeypatch):
    """A learner sampling the lanes it writes: most batches hold rows of the shards being
    filled. The hot set's kernel call copies them from the writers' RAM itself, for every
    lane this process writes (not Python per field and part: ``_own_staged``), and the
    batch is the general path's, across laps of both lanes' rings."""
    store = make_store(tmp_path / "s.zarr", capacity=512, shard_rows=32, lanes=2)
    python_merges = []
    real = StoreRows._own_staged
    monkeypatch.setattr(StoreRows, "_own_staged",
                        lambda self, *a: python_merges.append(1) or real(self, *a))
    sampler = es.UniformSampler(store, seed=3)
    g = [0, 0]
    staged = 0
    for i in range(90):  # ~4 laps of each lane's 256 rows
        for lane, n in ((0, 7), (1, 5)):
            for t in range(g[lane], g[lane] + n):
                k = key(t)
                store.add(np.full(5, k, np.float32), np.array([k, -k], np.float32), float(k),
                          np.full(5, k + 1, np.float32), t % EP_LEN == EP_LEN - 1, False,
                          lane=lane)
            g[lane] += n
        if i % 10 == 9:
            store.flush()
        for w in store.writers.values():
            w.wait()  # (no full shard queued: every staged row is in a shard being filled)
        plan = sampler.plan(32)
        batch = store.read_plan(plan)
        check(batch)
        same(batch, general(store, plan))
        lanes = plan.rows // store.layout.lane_capacity
        committed = np.array([store.writers[int(x)].committed.count for x in lanes])
        staged += int((plan.steps >= committed).sum())
    assert staged > 200  # rows of both lanes' open shards were sampled
    assert not python_merges
    store.close()


def _refill_under(store, start: int) -> int:
    """Another thread's adds, run inside a read: the lane's shard being filled is handed
    off, written and its buffer refilled as a later shard, so every row it held is now on
    storage only and its RAM holds other steps. Returns the next transition number."""
    w = store.writers[0]
    buf, first = w.cur, w.cur.first_step
    g = start
    while not (w.cur is buf and buf.first_step != first and buf.n >= 24):
        write(store, g, 8)
        g += 8
        w.wait()  # (the written shard's buffer is recycled here)
    return g


@pytest.mark.parametrize("path", ["kernel", "python"])
def test_staged_rows_refilled_during_a_read_are_read_from_storage(tmp_path, monkeypatch,
                                                                  path):
    """The race of a learner thread sampling while another adds, made deterministic: the
    adds run between the moment a read takes a writer's staged rows and their copy. The
    one-call kernel path sees the shard being filled change and reads again; the Python
    merge finds the rows gone from RAM and reads them from storage. Either way every
    sample is its own transition (before: a row of a later lap, or uninitialised memory)."""
    from expstore.storage.write.writer import LaneWriter

    store = make_store(tmp_path / "s.zarr", capacity=256, shard_rows=32, fsync=False)
    write(store, 0, 100)
    store.flush()
    write(store, 100, 20)  # staged only
    sampler = es.UniformSampler(store, seed=5)
    w = store.writers[0]
    plan = sampler.plan(64)
    while not (plan.steps >= w.committed.count).any():
        plan = sampler.plan(64)
    g = [120]
    if path == "kernel":
        real = StoreRows._staged_sources

        def late(self, *a):
            got = real(self, *a)
            monkeypatch.setattr(StoreRows, "_staged_sources", real)
            g[0] = _refill_under(store, g[0])
            return got

        monkeypatch.setattr(StoreRows, "_staged_sources", late)
    else:
        monkeypatch.setattr(StoreRows, "_staged_sources", lambda self, *a: None, raising=False)
        real = LaneWriter.staged

        def late(self, *a):
            monkeypatch.setattr(LaneWriter, "staged", real)
            g[0] = _refill_under(store, g[0])
            return real(self, *a)

        monkeypatch.setattr(LaneWriter, "staged", late)
    batch = store.read_plan(plan)
    assert g[0] > 120  # the adds ran inside the read
    check(batch)
    assert np.array_equal(batch["step_id"], plan.steps[:64])
    store.close()


@pytest.mark.parametrize("seconds", [3.0, pytest.param(40.0, marks=pytest.mark.slow)])
def test_a_learner_thread_samples_while_another_thread_adds_at_full_speed(tmp_path,
                                                                          seconds):
    """Staged rows are copied from a writer's RAM while another thread of the process may
    fill, hand off, write and refill its buffers (a user's actor and learner threads on one
    store; the integrations lock instead): every batch must still hold each sample's own
    transition, across many laps of a small ring (``expstore.testing.thread_race``). Before
    rows were checked to be still staged after their copy, about one run of this test in 15
    got a row of another lap or of uninitialised memory. The slow variant runs it for 40 s,
    its second half with the GIL handed between the threads every 10 us instead of 5 ms
    (adds then land between any two steps of a sample: before plans judged their anchors
    again at the steps they name, a final row came out as a transition in 5 of 6 runs of
    20 s of that, ``benchmarks/RESULTS.md``)."""
    from expstore.testing.thread_race import race

    batches, added, wrong = race(str(tmp_path / "s.zarr"), seconds, 4, CHUNK_ROWS[0],
                                 seconds / 2 if seconds > 10 else None)
    assert wrong == [] and batches > 100
    assert added > 8 * 256  # the ring was lapped many times


def lapping_writer(path) -> subprocess.Popen:
    """A 512-row store of 64-row shards holding rows 0-599 at ``path``, and a process
    lapping its ring three times (a flush every 40 rows) that prints the rows it reached."""
    store = make_store(path, capacity=512, shard_rows=64)
    write(store, 0, 600)
    store.close()
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = {sys.path!r}
        import numpy as np, expstore as es
        from expstore.testing.thread_race import write
        store = es.open({str(path)!r}, "r+", fsync=False)
        g = 600
        while g < 600 + 3 * 512:  # three laps, a flush every 40 rows
            write(store, g, 40)
            g += 40
            store.flush()
        store.close()
        print(g)
    """)
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)


def test_read_only_store_samples_while_another_process_laps_the_ring(tmp_path, hot_calls):
    path = tmp_path / "s.zarr"
    writer = lapping_writer(path)
    reader = es.open(path)
    batches = sample_while_lapping(reader, writer)
    assert batches > 10 and hot_calls[0] > 5  # after the last lap: from the hot set again
    reader.close()


@pytest.mark.parametrize("hot_bytes", [None, 2500])
def test_scalars_in_chunks_of_part_of_a_shard_sample_while_another_process_laps(
        tmp_path, monkeypatch, hot_bytes):
    """Scalars in 16-row chunks of 64-row shards (``Layout.scalar_chunk_rows``, as
    stores past ~268M rows keep them): filled chunk by chunk, into decoded slots or codes
    (``hot_bytes=2500``: the flags as codes, the reward decoded or held compressed by
    chunk), while a writer process laps the ring: every batch holds one transition per
    sample."""
    import expstore.api

    monkeypatch.setattr(expstore.api, "SCALAR_CHUNK_ROWS", 16)
    path = tmp_path / "s.zarr"
    writer = lapping_writer(path)
    reader = es.open(path, **({} if hot_bytes is None else {"hot_bytes": hot_bytes}))
    assert reader.layout.chunk_rows("reward") == reader.layout.chunk_rows("_flags") == 16
    assert sample_while_lapping(reader, writer) > 10
    if hot_bytes is not None:  # the flags as 1-bit codes, filled chunk by chunk
        flags = reader.reader.tables["terminated"]
        assert flags.code is not None and (flags.slot >= 0).any()
    reader.close()


def sample_while_lapping(reader, writer: subprocess.Popen) -> int:
    """Batches of 64 checked while ``writer`` (:func:`lapping_writer`) runs, then 20 more
    after it lapped the ring at least twice: the batches sampled while it ran."""
    sampler = es.UniformSampler(reader, seed=1, refresh_every=0)
    batches = 0
    try:
        while writer.poll() is None:
            check(sampler.sample(64))
            batches += 1
    finally:
        out, _ = writer.communicate(timeout=60)
    assert writer.returncode == 0
    assert int(out) > 600 + 2 * 512  # the writer lapped the ring at least twice
    for _ in range(20):
        check(sampler.sample(64))
    return batches


@pytest.mark.parametrize("held", [10.5, 3.5])
def test_a_budget_past_the_store_admits_shards_and_never_churns(tmp_path, hot_calls, held):
    """Room for ``held`` of 16 shards of every field: fields are decoded smallest row
    first, the field where the budget ends takes shards as first read until it is full,
    a slot never changes owner after, rows of the others are still read right (from
    their shards)."""
    path = tmp_path / "s.zarr"
    store = make_store(path, capacity=1024, shard_rows=64)
    write(store, 0, 1000)
    store.close()
    L = store.layout
    assert L.chunk_rows("obs") == (CHUNK_ROWS[0] or 64)
    per_row = sum(f.dtype.itemsize * int(np.prod(f.shape)) for n, f in L.spec.fields.items()
                  if L.chunk_rows(n) > 1)
    reader = es.open(path, hot_bytes=int(per_row * 64 * held))
    sampler = es.UniformSampler(reader, seed=2)
    check(sampler.sample(32))
    tables = reader.reader.tables
    slots = {n: tables[n].max_slots for n in L.spec.fields}
    taken = sum(s * tables[n].slot_bytes for n, s in slots.items())  # (flags: 1 bit a row)
    assert taken <= per_row * 64 * held
    if held > 8:  # fewest bytes per row read decoded first (obs is read twice: 10 B)
        assert [slots[n] for n in ("terminated", "truncated", "reward", "action")] == [16] * 4
    partial = [n for n in L.spec.fields if 0 < slots[n] < 16]  # where the budget ends
    assert partial and tables[partial[0]].fills, slots
    owners = {}
    for _ in range(150):
        plan = sampler.plan(32)
        batch = reader.read_plan(plan)
        check(batch)
        same(batch, general(reader, plan))
        for name, t in tables.items():
            for s, shard in enumerate(t.owner.tolist()):
                if shard >= 0:
                    assert owners.setdefault((name, s), shard) == shard, name  # no churn
    table = tables[partial[0]]
    assert (table.owner >= 0).sum() == table.max_slots  # full, of first-read shards
    if held > 8:  # every field admits: rows of shards all hold come from the hot set
        held_shards = np.flatnonzero(np.logical_and.reduce(
            [t.slot >= 0 for n, t in tables.items() if n in L.spec.fields]))
        rows = np.concatenate([np.arange(s * 64, s * 64 + 64) for s in held_shards])
        rows = rows[reader.index.valid(rows, 0, 1) & np.isin((rows + 1) // 64, held_shards)]
        chunks = reader.reader.stats.chunks
        check(reader.transitions(rows[:20]))  # from the hot set: nothing decoded
        assert reader.reader.stats.chunks == chunks
        assert hot_calls[0] > 0
    reader.close()


def test_no_hot_set_gives_the_same_batches(tmp_path, hot_calls):
    path = tmp_path / "s.zarr"
    store = make_store(path)
    write(store, 0, 300)
    store.close()
    hot, cold = es.open(path), es.open(path, hot_bytes=0)
    assert all(t.max_slots == 0 for t in cold.reader.tables.values())
    for seed in range(20):
        a = hot.sample(48, rng=np.random.default_rng(seed))
        b = cold.sample(48, rng=np.random.default_rng(seed))
        check(a)
        same(a, b)
    assert hot_calls[0] >= 15  # (the cold store's calls all answer False)
    hot.close()
    cold.close()


def test_numpy_fallback_gathers_the_same_batches(tmp_path, monkeypatch, hot_calls):
    path = tmp_path / "s.zarr"
    store = make_store(path)
    write(store, 0, 300)
    store.close()
    c_store = es.open(path)
    expect = [c_store.sample(40, rng=np.random.default_rng(s)) for s in range(10)]
    expect = [c_store.sample(40, rng=np.random.default_rng(s)) for s in range(10)]  # warm
    np_store = es.open(path)
    monkeypatch.setattr("expstore.storage.read.reader.native", None)
    for s in range(10):
        np_store.sample(40, rng=np.random.default_rng(s))  # (fills its hot set)
    got = [np_store.sample(40, rng=np.random.default_rng(s)) for s in range(10)]
    for a, b in zip(expect, got):
        check(b)
        same(a, b)
    assert hot_calls[0] >= 20
    c_store.close()
    np_store.close()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_hot_bytes_must_be_a_byte_count(tmp_path, bad):
    store = make_store(tmp_path / "s.zarr")
    store.close()
    with pytest.raises(ValueError, match="hot_bytes"):
        es.open(tmp_path / "s.zarr", hot_bytes=bad)
    with pytest.raises(ValueError, match="hot_bytes"):
        make_store(tmp_path / "t.zarr", hot_bytes=bad)


def test_hot_bytes_given_to_create_and_open_is_the_readers_budget(tmp_path):
    store = make_store(tmp_path / "s.zarr", hot_bytes=1 << 16)
    write(store, 0, 100)
    store.flush()
    assert store.hot_bytes == 1 << 16
    tables = store.reader.tables.values()
    assert sum(t.max_slots * 32 * t.dtype.itemsize * int(np.prod(t.shape)) for t in tables) \
        <= 1 << 16
    store.close()
    again = es.open(tmp_path / "s.zarr")
    assert again.hot_bytes == es.Store.hot_bytes == 512 << 20
    again.close()



def test_loader_of_a_low_dim_store_reads_in_a_prefetch_thread(tmp_path):
    path = tmp_path / "s.zarr"
    store = make_store(path)
    write(store, 0, 300)
    store.close()
    reader = es.open(path)
    loader = es.make_loader(reader, batch_size=16, num_workers=2, num_batches=40)
    assert loader.threaded is not None
    it = iter(loader)
    batches = [next(it)]
    thread = loader._prefetch._thread
    batches += list(it)
    assert len(batches) == 40 == loader.stats.batches
    for b in batches:
        check({k: v.numpy() for k, v in b.items()})
        assert b["obs"].shape == (16, 5) and b["index"].shape == (16,)
    assert not thread.is_alive() and loader._prefetch is None  # done: stopped
    endless = es.make_loader(reader, batch_size=8, num_workers=1)
    it = iter(endless)
    check({k: v.numpy() for k, v in next(it).items()})
    thread = endless._prefetch._thread
    endless.close()
    assert not thread.is_alive()
    reader.sample(8)  # the store's reader is free again
    reader.close()


def test_loader_keeps_worker_processes_where_the_thread_does_not_fit(tmp_path):
    path = tmp_path / "s.zarr"
    store = make_store(path)
    write(store, 0, 300)
    assert es.make_loader(store, batch_size=8, num_workers=2).threaded is None  # writes
    with pytest.raises(ValueError, match="threads=True"):
        es.make_loader(store, batch_size=8, threads=True)
    store.close()
    reader = es.open(path)
    assert es.make_loader(reader, batch_size=8, threads=False).threaded is None
    assert es.make_loader(reader, batch_size=8, num_workers=0).threaded is None
    per = es.PrioritizedSampler(reader) if hasattr(es, "PrioritizedSampler") else None
    if per is not None:  # priorities from the training loop: worker path
        assert es.make_loader(reader, sampler=per, batch_size=8).threaded is None
    reader.close()
    small = es.open(path, hot_bytes=1 << 12)  # the hot set holds a few shards: workers
    assert es.make_loader(small, batch_size=8, num_workers=2).threaded is None
    small.close()


def _reader_with_table(rng):
    """A stand-in reader (``tables``, ``layout``, ``known``, ``stats``; no joint codes)
    whose field ``v`` holds 4 of 6 shards of 8 rows decoded: shard ``s`` as steps
    ``8 s ..``, trusted below ``8 s + 7``."""
    from types import SimpleNamespace

    from expstore.storage.read.read_cache import ShardTable

    t = ShardTable(6, 8, 8, (2,), np.float32, values_budget=1 << 20)
    for shard in (0, 2, 3, 5):
        s = t._take_slot(shard)
        t.values[s] = rng.random((8, 2)).astype(np.float32)
        t.first[shard], t.n_rows[shard], t.trusted[shard] = shard * 8, 8, shard * 8 + 7
    layout = SimpleNamespace(shard_rows=8, shards_per_lane=6, lanes=1)
    stats = SimpleNamespace(chunk_cache_hits=0, rows=0)
    reader = SimpleNamespace(tables={"v": t}, layout=layout, known=np.zeros(1, np.int64),
                             stats=stats, joint_for=lambda names: None)
    reader._bump = lambda shards, steps: np.maximum.at(reader.known, shards // 6, steps + 1)
    return reader, t


@pytest.mark.parametrize("kernel", ["c", "numpy"])
def test_gather_held_serves_only_held_trusted_versions(monkeypatch, kernel):
    from expstore.storage.read import hot_set

    if kernel == "numpy":
        monkeypatch.setattr(hot_set, "native", None)
    elif hot_set.native is None:
        pytest.skip("C kernel not built")
    reader, t = _reader_with_table(np.random.default_rng(0))
    rows = np.array([1, 17, 26, 40, 3, 46], np.int64)
    out = np.full((6, 2), -1, np.float32)
    assert hot_set.gather_held(reader, [(rows, rows.copy())], [(0, "v", out)])
    np.testing.assert_array_equal(out, t.values[t.slot[rows // 8], rows % 8])
    assert reader.known[0] == 47 and reader.stats.rows == 6
    late = np.where(rows == 46, 47, rows)
    for name, rows_, steps in (
            ("another version", rows[:5], rows[:5] + 1),  # each step below trusted
            ("not trusted", late, late)):
        out = np.full((len(rows_), 2), -1, np.float32)
        assert not hot_set.gather_held(reader, [(rows_, steps)], [(0, "v", out)]), name
        assert (out == -1).all(), name  # nothing written
    skip = rows == 40
    bad = np.where(skip, 36, rows)  # shard 4 is not held: skipped, so not asked
    out = np.full((6, 2), -1, np.float32)
    assert hot_set.gather_held(reader, [(bad, bad.copy(), skip)], [(0, "v", out)])
    assert (out[skip] == -1).all() and (out[~skip] != -1).all()


def test_carved_batches_do_not_overlap_and_match_numpy_ones():
    from expstore.loading.prefetch import carving_alloc

    alloc = carving_alloc(lambda n: np.empty(n, np.uint8))
    assert alloc.retryable
    specs = {"obs": ((3, 5), np.dtype(np.float32)), "flag": ((3,), np.dtype(bool)),
             "index": ((3,), np.dtype(np.int64))}
    got = alloc([specs, specs])
    seen = []
    for arrays in got:
        for k, (shape, dtype) in specs.items():
            a = arrays[k]
            assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous
            a[...] = 1
            seen.append(a)
    for i, a in enumerate(seen):  # writing one never changes another
        a[...] = 0
        assert all((b != 0).all() for b in seen[i + 1:])


@pytest.mark.parametrize("n_step,guard,spare", [(1, 0, 0), (3, 5, 2), (1, 40, 3)])
def test_uniform_draw_in_one_pass_gives_the_generic_rows(tmp_path, n_step, guard, spare):
    """``UniformSampler.draw_rows`` (one array, the count read once) draws the rows the
    generic ``Sampler.draw_rows`` draws from the same random numbers."""
    from expstore.sampling import ReaderView
    from expstore.sampling.base import Sampler

    store = make_store(tmp_path / "s.zarr")
    write(store, 0, 400)  # wrapped, episode ends inside
    view = ReaderView(guard=guard, spare=spare)
    for seed in range(5):
        fast = es.UniformSampler(store, n_step=n_step, seed=seed)
        slow = es.UniformSampler(store, n_step=n_step, seed=seed)
        for batches in (1, 3):
            a, _ = fast.draw_rows(24, batches, view)
            b, _ = Sampler.draw_rows(slow, 24, batches, view)
            np.testing.assert_array_equal(a, b)
    store.close()


def race_adds_and_flushes(path, end: int = 47000, switch: float | None = 1e-5,
                          hot_bytes: int | None = None) -> tuple[int, int]:
    """A learner thread (this one) sampling batches of 256 while another thread adds
    transitions 17,000 .. ``end`` to a 16,384-row ring of 256-row shards at ``path`` and
    flushes every 1,500 rows, the GIL handed over every ``switch`` s (``None``: the
    interpreter's): ``(batches, wrong rows)``, every row checked against the transition
    its obs names (``scripts/learner_thread_probe.py`` runs it for longer)."""
    from test_scalar_codes import action_of, transition_of
    from test_scalar_codes import make_store as coded_store
    from test_scalar_codes import write as coded_write

    store = coded_store(path, capacity=16384, shard_rows=256)
    coded_write(store, 0, 17000)
    store.close()
    store = es.open(path, "r+", fsync=False, hot_bytes=hot_bytes)
    done, errors = [], []

    def add() -> None:
        try:
            g = 17000
            while g < end:
                coded_write(store, g, 500)
                g += 500
                if g % 1500 == 0:
                    store.flush()
        except BaseException as e:  # raised below
            errors.append(e)
        done.append(True)

    actor = threading.Thread(target=add)
    interval = sys.getswitchinterval()
    if switch is not None:
        sys.setswitchinterval(switch)
    wrong, batches = 0, 0
    try:
        actor.start()
        while not done:
            b = store.sample(256)
            g = transition_of(b["obs"].reshape(len(b["obs"]), -1))
            right = (transition_of(b["next_obs"].reshape(len(g), -1)) == g + 1) & (
                b["action"] == np.array([action_of(int(x)) for x in g]))
            wrong += int((~right).sum())
            batches += 1
    finally:
        sys.setswitchinterval(interval)
        done.append(True)
        actor.join()
    store.close()
    if errors:
        raise errors[0]
    return batches, wrong


@pytest.mark.parametrize("run", range(2))
def test_a_learner_thread_samples_while_another_thread_adds_and_flushes(tmp_path, run):
    """The writing thread forgets each shard it writes (``Store._forget_shard``), which
    frees the shard's hot-set slot, one array at a time; a learner thread's sample in the
    same moment could claim that slot for another shard and fill it while the first
    shard's version still named it, and serve a row of zeros or of another shard, no
    error (about half of the 30 s runs of ``scripts/learner_thread_probe.py``, 256-row
    shards, flushes every 1,500 rows). Forgetting takes the store's read lock now. With
    that taken out, half of these runs fail (at the interpreter's switch interval; at
    10 us they failed less often)."""
    batches, wrong = race_adds_and_flushes(tmp_path / "s.zarr", end=62000, switch=None)
    assert batches > 20
    assert wrong == 0
