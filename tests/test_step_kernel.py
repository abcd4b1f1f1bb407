"""The per-step C kernel (``storage/native/_step.c``, ``StepKernelPath.add``): one ``add``
(one lane, or one step in every lane) staged by one C call stores exactly the rows, index
entries and held ``next_obs`` of the Python paths (``add_one`` / ``add_lanes``), which
every step the kernel does not take as is goes through: values to cast, clip or refuse,
stream breaks, failed shard writes waiting, shard boundaries.

Each case writes the same steps into a store using the kernel and into one whose kernel
is switched off (the Python paths: a build without a C compiler), and compares them.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from _writer_spies import count_calls, disk_full

import expstore as es
from expstore.errors import WriteFailedError
from expstore.storage.write import step_plan

pytestmark = pytest.mark.skipif(step_plan.native is None, reason="step kernel not built")


def cartpole_spec(**kw) -> es.Spec:
    return es.Spec.create(obs=es.Field((4,), np.float32),
                          action=es.Field((), np.int64, low=0, high=1), **kw)


def atari_spec() -> es.Spec:
    return es.Spec.create(obs=es.Field((6, 6), np.uint8, stack=4),
                          action=es.Field((), np.int64, low=0, high=5))


def pair(tmp_path, spec, lanes=1, shard_rows=16, shards=4, **kw):
    """(kernel store, Python-path store) of the same shape."""
    cap = lanes * shard_rows * shards
    fast = es.create(str(tmp_path / "fast.zarr"), spec, capacity=cap, lanes=lanes,
                     shard_rows=shard_rows, fsync=False, **kw)
    slow = es.create(str(tmp_path / "slow.zarr"), spec, capacity=cap, lanes=lanes,
                     shard_rows=shard_rows, fsync=False, **kw)
    slow._appender.step_kernel._plan = None  # the Python paths only
    return fast, slow


def spy(store) -> list:
    """Results of the store's ``step_kernel.add`` calls (True: the kernel took the step)."""
    kernel, taken = store._appender.step_kernel, []
    real = kernel.add

    def add(*a):
        r = real(*a)
        taken.append(r)
        return r

    kernel.add = add
    return taken


def assert_same(fast, slow) -> None:
    """Same index, writer and appender state, and the same bytes in every field of every
    row, staged (read here and by another process) and after a flush."""
    a, b = fast.index, slow.index
    for name in ("count", "valid_from", "episode_step", "flags"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.last_lane == b.last_lane
    for lane in fast.writers:
        wa, wb = fast.writers[lane], slow.writers[lane]
        assert (wa.count, wa.episodes, wa.cur.n) == (wb.count, wb.episodes, wb.cur.n)
        if wa.cur.n:  # (a buffer not opened yet holds whichever shard it held before)
            assert wa.cur.first_step == wb.cur.first_step
    pa, pb = fast._appender, slow._appender
    assert np.array_equal(pa.open_step, pb.open_step)
    assert np.array_equal(pa.held_ok, pb.held_ok)
    ok = pa.held_ok
    for name in pa.held_vals:
        assert pa.held_vals[name][ok].tobytes() == pb.held_vals[name][ok].tobytes()
    readers = []
    for store in (fast, slow):  # another process's view: rows staged in shared memory
        other = es.open(store.url)
        other.refresh()
        assert np.array_equal(other.index.count, store.index.count)
        readers.append(other)
    for when in ("staged", "flushed"):
        for lane in range(fast.lanes):
            lo, hi = int(a.lower_bound()[lane]), int(a.count[lane])
            rows = a.lane_rows(lane, np.arange(lo, hi))
            for name in fast.layout.fields:
                got = fast.read(name, rows)
                assert np.array_equal(got, slow.read(name, rows)), (when, lane, name)
                if when == "staged":
                    assert np.array_equal(readers[0].read(name, rows), got), (lane, name)
        fast.flush()
        slow.flush()
    for r in readers:
        r.close()


def cartpole_steps(n: int, seed: int, breaks: bool = True, missing: bool = True
                   ) -> list[tuple]:
    """CartPole-shaped steps given in the forms a training loop uses: python and numpy
    scalars, episode ends (terminated, truncated), a missing ``next_obs``, and (``breaks``)
    steps that do not continue the one before (a final row closes it first); ``missing``:
    some steps give no ``next_obs``."""
    rng = np.random.default_rng(seed)
    out, obs = [], rng.normal(size=4).astype(np.float32)
    for i in range(n):
        nxt = rng.normal(size=4).astype(np.float32)
        term, trunc = bool(rng.random() < 0.06), bool(rng.random() < 0.03)
        a = int(rng.integers(2))
        r = float(rng.normal())
        kind = i % 5
        action = a if kind != 1 else np.int64(a)
        reward = r if kind != 2 else np.float32(r)
        terminated = term if kind != 3 else np.bool_(term)
        given_next = None if missing and kind == 4 and not (term or trunc) else nxt
        out.append((obs, action, reward, given_next, terminated, trunc))
        if breaks and rng.random() < 0.03:
            obs = rng.normal(size=4).astype(np.float32)  # another env's observation
        else:
            obs = rng.normal(size=4).astype(np.float32) if term or trunc else nxt
    return out


def test_one_step_adds_store_the_python_paths_rows(tmp_path):
    fast, slow = pair(tmp_path, cartpole_spec())
    taken = spy(fast)
    # 600 steps over 16-row shards of a 64-row ring: every shard boundary, four laps
    for i, step in enumerate(cartpole_steps(600, seed=1)):
        fast.add(*step)
        slow.add(*step)
        if i in (5, 200, 599):
            assert_same(fast, slow)
    assert taken.count(True) > 0.7 * len(taken)  # the kernel took most steps
    fast.close()
    slow.close()


def vector_steps(lanes: int, n: int, seed: int) -> list[tuple]:
    """``n`` steps of ``lanes`` envs, each continuing its own episodes (as a vector env)."""
    per = [cartpole_steps(n, seed + j, breaks=False, missing=False) for j in range(lanes)]
    calls = []
    for i in range(n):
        rows = [per[j][i] for j in range(lanes)]
        nxt = np.stack([r[3] for r in rows])
        calls.append((np.stack([r[0] for r in rows]), np.array([int(r[1]) for r in rows]),
                      np.array([float(r[2]) for r in rows]), nxt,
                      np.array([bool(r[4]) for r in rows]), np.array([r[5] for r in rows])))
    return calls


def test_vector_adds_store_the_python_paths_rows(tmp_path):
    fast, slow = pair(tmp_path, cartpole_spec(), lanes=8)
    taken = spy(fast)
    # 16-row shards: every few calls some lane opens or completes a shard (through the
    # writer) while the kernel writes the others; episodes end in different lanes
    for i, step in enumerate(vector_steps(8, 150, seed=3)):
        if i == 60:  # an env gives an obs its lane's newest step does not lead to
            step = (step[0].copy(), *step[1:])
            step[0][int(np.flatnonzero(fast._appender.held_ok)[0])] += 1
        fast.add(*step)
        slow.add(*step)
        if i in (0, 1, 17, 60, 90, 149):
            assert_same(fast, slow)
    assert taken.count(False) == 1  # the stream break: the Python path closes it
    fast.close()
    slow.close()


def test_frame_stacks_one_step_and_vector(tmp_path):
    rng = np.random.default_rng(0)
    for lanes in (1, 3):
        fast, slow = pair(tmp_path / str(lanes), atari_spec(), lanes=lanes)
        taken = spy(fast)
        shape = (lanes,) if lanes > 1 else ()
        stack = rng.integers(0, 255, (*shape, 4, 6, 6), dtype=np.uint8)
        for _ in range(120):
            frame = rng.integers(0, 255, (*shape, 1, 6, 6), dtype=np.uint8)
            nxt = np.concatenate([stack[..., 1:, :, :], frame], axis=-3)
            done = rng.random(shape) < 0.05
            term = done if lanes > 1 else bool(done)
            trunc = np.zeros(shape, bool) if lanes > 1 else False
            act = rng.integers(0, 6, shape) if lanes > 1 else int(rng.integers(6))
            rew = rng.normal(size=shape).astype(np.float32) if lanes > 1 else 0.5
            for s in (fast, slow):
                s.add(stack, act, rew, nxt, term, trunc)
            stack = nxt
        assert_same(fast, slow)
        assert taken.count(True) > 0.8 * len(taken)
        fast.close()
        slow.close()


def test_values_it_does_not_take_are_refused_or_cast_as_the_python_path_does(tmp_path):
    fast, slow = pair(tmp_path, cartpole_spec())
    obs = np.ones(4, np.float32)
    for s in (fast, slow):
        s.add(obs, 0, 1.0, obs * 2, False, False)
    refused = [
        ((obs * 2, 2, 1.0, obs, False, False), r"^action: "),  # above high=1
        ((obs * 2, 1, float("nan"), obs, False, False), r"^reward: "),
        ((obs * 2, 1, 1.0, None, True, False), r"^next_obs: required"),
        ((np.array([2, 2, 2, np.inf], np.float32), 1, 1.0, obs, False, False), r"^obs: "),
        ((obs * 2, 1, 1.0, np.array([1, 1, np.nan, 1], np.float32), True, False),
         r"^next_obs: "),
        ((obs * 2, 1.5, 1.0, obs, False, False), r"^action: "),
    ]
    for step, message in refused:
        for s in (fast, slow):
            before = (s.index.count.copy(), s._appender.held_vals["obs"].copy())
            with pytest.raises(es.ValidationError, match=message):
                s.add(*step)
            assert np.array_equal(s.index.count, before[0])  # nothing stored
            assert np.array_equal(s._appender.held_vals["obs"], before[1])
    cast = [  # values the Python checks cast: the same rows either way
        (np.array([2, 2, 2, 2], np.float64), 1, 1.0, obs, False, False),
        (obs, np.array(1), np.float64(0.25), obs * 3, np.bool_(False), 0),
        (obs * 3, True, 1, obs * 4, 1, False),
        (obs * 4, np.int32(1), np.float16(2.0), [4.0, 4.0, 4.0, 4.0], False, False),
        (obs * 4, 1, 2.0, obs, False, False),
    ]
    for step in cast:
        for s in (fast, slow):
            s.add(*step)
    assert_same(fast, slow)
    fast.close()
    slow.close()


def test_strict_stream_break_is_refused_with_nothing_stored(tmp_path):
    store = es.create(str(tmp_path / "s.zarr"), cartpole_spec(), capacity=64, shard_rows=16,
                      strict=True, fsync=False)
    obs = np.ones(4, np.float32)
    for _ in range(3):
        store.add(obs, 0, 1.0, obs, False, False)
    count = store.index.count.copy()
    with pytest.raises(es.ValidationError, match="strict=True"):
        store.add(obs * 2, 0, 1.0, obs, False, False)
    assert np.array_equal(store.index.count, count)
    store.add(obs, 0, 1.0, obs, True, False)  # the held next_obs continues: taken
    assert store.index.count[0] == count[0] + 2  # the step and its final row
    store.close()


def test_a_failed_shard_write_is_retried_before_the_kernel_stages_more(tmp_path):
    store = es.create(str(tmp_path / "s.zarr"), cartpole_spec(), capacity=64,
                      shard_rows=16, fsync=False)
    w = store.writers[0]
    full = disk_full(store)
    obs = np.ones(4, np.float32)
    while w.count < 16:  # fills the first shard: its background write fails
        store.add(obs, 0, 1.0, obs, False, False)
    w.wait()
    n = len(store)
    for _ in range(3):  # while the disk is full, every add is refused, nothing staged
        with pytest.raises(WriteFailedError):
            store.add(obs, 0, 1.0, obs, False, False)
        assert len(store) == n and w.pending
    full[0] = False
    for _ in range(5):
        store.add(obs, 0, 1.0, obs, False, False)
    assert len(store) == n + 5 and not w.pending
    store.flush()
    other = es.open(store.url)
    assert len(other) == len(store)
    assert np.array_equal(other.read("obs", np.arange(len(store))),
                          np.ones((len(store), 4), np.float32))
    other.close()
    store.close()


@pytest.mark.parametrize("lanes", [1, 3])
def test_shards_are_handed_over_and_opened_inside_the_kernel(tmp_path, monkeypatch, lanes):
    """The adds that complete a shard or open the next run no Python code of the writer:
    the kernel hands the full shard to the background thread and opens the next buffer
    itself (``hand_off`` / ``enter`` in ``step_shards.h``), and the shards are written."""
    from expstore.storage.write.writer import LaneWriter

    store = es.create(str(tmp_path / "s.zarr"), cartpole_spec(), capacity=64 * lanes,
                      lanes=lanes, shard_rows=16, fsync=False)
    steps = cartpole_steps(16 * 6, seed=3, breaks=False, missing=False)
    first = steps[0][0]  # a first add (it builds the plan), continued by the steps
    if lanes == 1:
        store.add(first, 0, 0.0, first, False, False)
    else:
        obs = np.stack([first] * lanes)
        store.add(obs, np.zeros(lanes, np.int64), np.zeros(lanes, np.float32), obs,
                  np.zeros(lanes, bool), np.zeros(lanes, bool))
    handed = count_calls(monkeypatch, LaneWriter, "_hand_off")
    entered = count_calls(monkeypatch, LaneWriter, "_enter_shard")
    taken = spy(store)
    for o, a, r, nxt, term, trunc in steps:
        if lanes == 1:
            store.add(o, a, r, nxt, term, trunc)
        else:
            store.add(np.stack([o] * lanes), np.full(lanes, a), np.full(lanes, r, np.float32),
                      np.stack([nxt] * lanes), np.full(lanes, term), np.full(lanes, trunc))
    w = store.writers[0]
    assert all(taken) and w.count > 5 * 16  # every add through the kernel, 5+ shards full
    assert handed == [] and entered == []
    for lane in store.writers.values():
        lane.wait()  # every full shard written by the background thread, before a flush
        assert lane.committed.count == 16 * (lane.count // 16)
    store.flush()
    other = es.open(store.url)
    assert np.array_equal(other.index.count, store.index.count)
    for lane in range(lanes):
        lo, hi = int(store.index.lower_bound()[lane]), int(store.index.count[lane])
        rows = store.index.lane_rows(lane, np.arange(lo, hi))
        for name in ("obs", "action", "reward", "_step_id"):
            assert np.array_equal(other.read(name, rows), store.read(name, rows)), name
    other.close()
    store.close()


@pytest.mark.parametrize("lanes", [1, 3])
def test_the_kernels_shard_moves_leave_the_writers_own_state(tmp_path, lanes):
    """The kernel's ``hand_off`` / ``enter`` (``step_shards.h``) are the fast path of the
    common case of ``LaneWriter._hand_off`` / ``_enter_shard``, the one definition of a
    lane's move to its next shard buffer: after every add across ten shard boundaries, a
    store whose kernel moved its lanes and one whose writers did hold the same state."""
    fast, slow = pair(tmp_path, cartpole_spec(), lanes=lanes)
    taken = spy(fast)
    steps = cartpole_steps(16 * 10, seed=5, breaks=False, missing=False)

    def moved_state(store):
        return [(w.count, w.valid_from, w.cur.first_step, w.cur.n, w.cur.entered,
                 w.cur.clean, w.cur.slot >= 0, len(w.queued) + len(w.pending))
                for _, w in sorted(store.writers.items())]

    for i, (o, a, r, nxt, term, trunc) in enumerate(steps):
        for s in (fast, slow):
            if lanes == 1:
                s.add(o, a, r, nxt, term, trunc)
            else:
                s.add(np.stack([o] * lanes), np.full(lanes, a),
                      np.full(lanes, r, np.float32), np.stack([nxt] * lanes),
                      np.full(lanes, term), np.full(lanes, trunc))
        for s in (fast, slow):
            for w in s.writers.values():
                w.wait()  # (the written shards' buffers freed alike in both)
        assert moved_state(fast) == moved_state(slow), i
        if i % 16 == 15:
            assert_same(fast, slow)
    assert taken.count(True) > 0.9 * len(taken)  # the kernel took (and moved) nearly all
    fast.close()
    slow.close()


def test_a_sleeping_writer_thread_is_woken_by_the_python_hand_off(tmp_path, monkeypatch):
    """The kernel leaves the hand-off to the writer's Python code when the background
    thread sleeps (idle): it must be woken, else the full shard would wait unwritten."""
    import time

    from expstore.storage.write.background import Background
    from expstore.storage.write.writer import LaneWriter

    monkeypatch.setattr(Background, "IDLE", 0.02)
    store = es.create(str(tmp_path / "s.zarr"), cartpole_spec(), capacity=64,
                      shard_rows=16, fsync=False)
    obs = np.ones(4, np.float32)
    store.add(obs, 0, 1.0, obs, False, False)
    w = store.writers[0]
    deadline = time.monotonic() + 10
    while not w._worker.sleeping[0]:
        assert time.monotonic() < deadline, "the writer thread never went to sleep"
        time.sleep(0.01)
    handed = count_calls(monkeypatch, LaneWriter, "_hand_off")
    while w.count < 16:
        store.add(obs, 0, 1.0, obs, False, False)
    assert handed == [1]
    deadline = time.monotonic() + 10
    while not w.queued[0].done if w.queued else False:
        assert time.monotonic() < deadline, "the full shard was never written"
        time.sleep(0.01)
    w.poll()
    assert w.committed.count == 16
    store.close()


def test_rows_are_announced_to_listeners_through_the_python_path(tmp_path):
    store = es.create(str(tmp_path / "s.zarr"), cartpole_spec(), capacity=64,
                      shard_rows=16, fsync=False)
    heard = []
    store.index.subscribe(lambda kind, rows: heard.append(rows.tolist()))
    obs = np.ones(4, np.float32)
    store.add(obs, 0, 1.0, obs, False, False)
    store.add(obs, 0, 1.0, obs, True, False)
    assert heard == [[0], [1], [2]]  # each row announced, the final row too
    store.close()


def test_plan_is_not_built_where_the_kernel_does_not_stage_the_spec(tmp_path, monkeypatch):
    half = es.Spec.create(obs=es.Field((4,), np.float16), action=es.Field((), np.int64))
    store = es.create(str(tmp_path / "h.zarr"), half, capacity=64, shard_rows=16)
    store.add(np.ones(4, np.float16), 0, 1.0, np.ones(4, np.float16), False, False)
    assert store._appender.step_kernel.plan() is None and len(store) == 1
    store.close()
    monkeypatch.setattr(step_plan, "native", None)  # a build without a C compiler
    store = es.create(str(tmp_path / "n.zarr"), cartpole_spec(), capacity=64, shard_rows=16)
    store.add(np.ones(4, np.float32), 0, 1.0, np.ones(4, np.float32), True, False)
    assert store._appender.step_kernel.plan() is None and len(store) == 2
    store.close()


def random_value(rng, name: str, lanes: int):
    """A value of field ``name`` in one of the forms a caller may give: most accepted as
    they are, some cast, some refused (bounds, non-finite, wrong shape or type)."""
    shape = (lanes,) if lanes else ()
    pick = rng.integers(12)
    if name in ("obs", "next_obs"):
        v = rng.normal(size=(*shape, 4)).astype(np.float32)
        if pick == 0:
            v[(0,) * v.ndim] = np.nan
        elif pick == 1:
            return v.astype(np.float64)
        elif pick == 2:
            return v[..., :3]
        elif pick == 3:
            return v.tolist()
        elif pick == 4:
            return np.asfortranarray(np.stack([v, v], -1))[..., 0]  # not contiguous
        return v
    if name == "action":
        v = rng.integers(0, 2, shape)
        forms = [v, v.astype(np.int32), v + 1, v.astype(np.float64), (v > 0)]
        v = forms[pick] if pick < len(forms) else v
        return v if lanes else (v.item() if pick % 2 else v[()])
    if name == "reward":
        v = rng.normal(size=shape)
        if pick == 0:
            v = v * np.inf
        elif pick == 1:
            v = v.astype(np.float32)
        elif pick == 2:
            v = v * 1e300
        return v if lanes else (float(v) if pick % 2 else v[()])
    v = rng.random(shape) < 0.1
    if pick == 0:
        v = v.astype(np.int64)
    return v if lanes else (bool(v) if pick % 2 else v[()])


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("lanes", [1, 4])
def test_fuzz_the_kernel_and_the_python_paths_agree(tmp_path, lanes):
    """Random steps mixing accepted, cast and refused values, continuing and breaking
    streams: each add does the same in both stores (stores or raises the same error) and
    the stores stay identical."""
    rng = np.random.default_rng(lanes)
    fast, slow = pair(tmp_path, cartpole_spec(), lanes=lanes)
    taken = spy(fast)
    held = {}
    for i in range(400):
        vals = {n: random_value(rng, n, lanes if lanes > 1 else 0)
                for n in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}
        if held and rng.random() < 0.8:  # mostly continue the held next_obs
            vals["obs"] = held["next_obs"]
        args = [vals[n] for n in ("obs", "action", "reward", "next_obs", "terminated",
                                  "truncated")]
        outcome = []
        for s in (fast, slow):
            try:
                s.add(*args)
                outcome.append(None)
            except es.ValidationError as e:
                outcome.append(str(e))
        assert outcome[0] == outcome[1], (i, outcome)
        if outcome[0] is None:
            held = vals
        if i % 50 == 49:
            assert_same(fast, slow)
    assert taken.count(True) > 40
    fast.close()
    slow.close()


def _kernel_writer(url: str, ready) -> None:
    store = es.open(url, mode="r+")
    obs = np.zeros(4, np.float32)
    i = 0
    while True:
        nxt = np.full(4, i + 1, np.float32)
        store.add(obs, i % 2, float(i), nxt, i % 37 == 36, False)
        obs = np.full(4, i + 1, np.float32) if i % 37 != 36 else np.zeros(4, np.float32)
        i += 1
        if i == 300:
            ready.set()
        if i % 100 == 0:
            store.flush()


def test_a_writer_killed_while_the_kernel_stages_leaves_a_store_that_opens(tmp_path):
    """Rows the kernel staged in shared memory are read by another process while the
    writer runs (every value matches its step), and a writer killed mid-add leaves a store
    whose committed rows are intact."""
    import multiprocessing as mp
    import signal

    url = str(tmp_path / "k.zarr")
    es.create(url, cartpole_spec(), capacity=1024, shard_rows=64).close()
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_kernel_writer, args=(url, ready))
    p.start()
    try:
        assert ready.wait(60)
        reader = es.open(url)
        for _ in range(20):
            reader.refresh()
            idx = reader.index
            lo, hi = int(idx.lower_bound()[0]), int(idx.count[0])
            rows = idx.lane_rows(0, np.arange(lo, hi))
            flags = idx.flags[rows]
            steps = reader.read("_step_id", rows)
            assert np.array_equal(steps, np.arange(lo, hi))
            obs, reward = reader.read("obs", rows), reader.read("reward", rows)
            last = (flags & 2) != 0  # final rows hold the final obs, zero reward
            assert (reward[last] == 0).all()
            assert (obs[~last][:, 0] == obs[~last][:, 1]).all()
        reader.close()
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.join()
    after = es.open(url)
    n = len(after)
    assert n > 0 and after.index.count[0] >= 300 - 100
    # every held row holds its step (the writer may have lapped the 1024-row ring)
    lo, hi = int(after.index.lower_bound()[0]), int(after.index.count[0])
    held = after.index.lane_rows(0, np.arange(lo, hi))
    assert np.array_equal(after.read("_step_id", held), np.arange(lo, hi))
    from expstore.verify import verify_store
    assert verify_store(url).ok
    after.close()


def test_a_store_that_staged_through_the_kernel_is_collected(tmp_path):
    """The plan holds the writers, which reach the store back: the cycle collector sees
    through it (else the store, its shared memory and its leases would never be freed)."""
    import gc
    import weakref

    store = es.create(str(tmp_path / "s.zarr"), cartpole_spec(), capacity=64, shard_rows=16)
    obs = np.ones(4, np.float32)
    store.add(obs, 0, 1.0, obs, False, False)
    assert store._appender.step_kernel.plan() is not None
    gone = weakref.ref(store)
    del store
    gc.collect()
    assert gone() is None
