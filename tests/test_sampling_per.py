"""Prioritized sampling: frequencies, importance weights, the index events, step-checked
updates, persistence with the store, beta schedules, CER."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import expstore as es
from expstore.errors import ReadOnlyError, StoreCorruptError
from expstore.testing import EpisodeWriter, ident_spec, ref_transition


def _writer(tmp_path, name="s.zarr", capacity=512, shard_rows=32, lanes=1, seed=0):
    store = es.create(tmp_path / name, ident_spec(), capacity=capacity, lanes=lanes,
                      shard_rows=shard_rows, fsync=False)
    return EpisodeWriter(store, np.random.default_rng(seed))


def _leaves(sampler):
    return sampler.priorities.get()


def _chi2(counts, probs):
    exp = probs * counts.sum()
    return float(((counts - exp) ** 2 / exp).sum())


def test_frequencies_and_weights_match_priorities(tmp_path):
    w = _writer(tmp_path)
    for _ in range(30):
        w.segment(0, 11, "terminated")  # 360 rows, 330 transitions, no wrap
    store = w.store
    alpha, beta, eps = 0.7, 0.5, 1e-3
    s = es.PrioritizedSampler(store, alpha=alpha, beta=beta, eps=eps, seed=1, persist=False)
    rows = np.arange(store.capacity)
    valid = store.index.valid(rows, 0, 1)
    live = np.flatnonzero(_leaves(s) > 0)
    np.testing.assert_array_equal(live, rows[valid])  # exactly the sampleable rows
    td = np.random.default_rng(2).exponential(1.0, size=len(live)) + 0.05
    assert s.update_priorities(live, -td) == len(live)  # sign of td is ignored
    p = (td + eps) ** alpha
    np.testing.assert_allclose(_leaves(s)[live], p, rtol=1e-6)
    probs = p / p.sum()

    counts = np.zeros(store.capacity)
    n_batches = 400  # 102,400 draws
    for _ in range(n_batches):
        got, weight = s.sample_rows(256)
        np.add.at(counts, got, 1)
        # (N P(i))^-beta / max_w with N live rows and P the normalized priorities
        N = len(live)
        pi = _leaves(s)[got] / p.sum()
        expect = (N * pi) ** -beta / (N * p.min() / p.sum()) ** -beta
        np.testing.assert_allclose(weight, expect, rtol=1e-5)
    assert counts[~valid].sum() == 0
    dof = len(live) - 1
    bound = stats.chi2.ppf(0.9999, dof)
    assert _chi2(counts[live], probs) < bound
    # the test has power: the frequencies do not fit alpha = 1 or uniform sampling
    wrong = (td + eps) / (td + eps).sum()
    assert _chi2(counts[live], wrong) > 5 * bound
    assert _chi2(counts[live], np.full(len(live), 1 / len(live))) > 5 * bound


def test_new_rows_get_max_priority_and_dropped_rows_zero(tmp_path):
    w = _writer(tmp_path, capacity=128, shard_rows=16)
    w.segment(0, 20, "terminated")
    s = es.PrioritizedSampler(w.store, alpha=1.0, eps=0.0, seed=0, persist=False)
    b = s.sample(8)
    s.update_priorities(b["index"][:4], np.array([0.5, 7.0, 2.0, 1.0]), b["step_id"][:4])
    assert s.priorities.max_priority == pytest.approx(7.0)
    w.segment(0, 5, "open")
    new = w.store.index.lane_rows(0, np.arange(21, 26))
    np.testing.assert_allclose(_leaves(s)[new[:4]], 7.0)
    assert _leaves(s)[new[4]] == 0  # the newest row waits for its next row
    w.segment(0, 1, "open")
    assert _leaves(s)[new[4]] == 7.0
    for _ in range(20):  # several laps
        w.segment(0, 9, "truncated")
    store = w.store
    rows = np.arange(store.capacity)
    steps = store.index.steps(rows)
    lo = store.index.lower_bound(0)[0]
    live = (steps >= lo) & ((store.index.flags & 2) == 0)
    assert (_leaves(s)[~live] == 0).all()
    assert (_leaves(s)[live] > 0).all()


def test_update_skips_rows_overwritten_since_sampling(tmp_path):
    w = _writer(tmp_path, capacity=64, shard_rows=16)
    w.segment(0, 40, "open")
    s = es.PrioritizedSampler(w.store, seed=3, persist=False, alpha=1.0, eps=0.0)
    b = s.sample(32)
    w.segment(0, 40, "open")
    w.segment(0, 40, "open")  # every row sampled above is overwritten by now
    before = _leaves(s)
    assert s.update_priorities(b["index"], np.full(32, 100.0), b["step_id"]) == 0
    np.testing.assert_array_equal(_leaves(s), before)
    b = s.sample(8)
    assert s.update_priorities(b["index"], np.full(8, 100.0), b["step_id"]) == 8
    assert (_leaves(s)[b["index"]] == 100.0).all()
    with pytest.raises(ValueError, match="td_error"):
        s.update_priorities(b["index"], np.full(8, np.nan))
    with pytest.raises(ValueError, match="td_error"):
        s.update_priorities(b["index"], np.ones(3))


def test_priorities_persist_with_the_store(tmp_path):
    w = _writer(tmp_path, capacity=128, shard_rows=16)
    for _ in range(6):
        w.segment(0, 9, "terminated")
    store = w.store
    s = es.PrioritizedSampler(store, alpha=0.5, eps=0.0, seed=0)
    b = s.sample(32)
    s.update_priorities(b["index"], np.arange(32) + 1.0, b["step_id"])
    saved = _leaves(s)
    max_p = s.priorities.max_priority
    store.flush()
    assert (tmp_path / "s.zarr" / "_index" / "priorities.bin").exists()
    store.close()

    # another process appends without a sampler: its rows are new to the saved file
    other = es.open(tmp_path / "s.zarr", mode="r+")
    w2 = EpisodeWriter(other, np.random.default_rng(5))
    w2.segment(0, 30, "terminated")  # wraps over the oldest shard
    other.close()

    store = es.open(tmp_path / "s.zarr", mode="r+")
    s2 = es.PrioritizedSampler(store, alpha=0.5, eps=0.0, seed=0)
    idx = store.index
    rows = np.arange(store.capacity)
    steps = idx.steps(rows)
    live = (steps >= idx.lower_bound(0)[0]) & ((idx.flags & 2) == 0)
    kept = live & (steps < 60)  # written before the save and still intact
    new = live & (steps >= 60)
    assert kept.sum() > 20 and new.sum() == 30
    np.testing.assert_allclose(_leaves(s2)[kept], saved[kept], rtol=1e-6)
    np.testing.assert_allclose(_leaves(s2)[new], max_p, rtol=1e-6)
    assert (_leaves(s2)[~live] == 0).all()
    s2.close()
    # a sampler with another alpha converts p**0.5 -> p**1.0
    s3 = es.PrioritizedSampler(store, alpha=1.0, eps=0.0)
    np.testing.assert_allclose(_leaves(s3)[kept], saved[kept] ** 2, rtol=1e-5)
    s3.close()
    store.close()

    ro = es.open(tmp_path / "s.zarr", mode="r")
    s4 = es.PrioritizedSampler(ro, alpha=0.5)
    ro.flush()  # no error: a read-only store does not persist
    with pytest.raises(ReadOnlyError):
        s4.save_priorities()
    ro.close()
    key = tmp_path / "s.zarr" / "_index" / "priorities.bin"
    raw = bytearray(key.read_bytes())
    raw[-5] ^= 0xFF
    key.write_bytes(bytes(raw))
    with pytest.raises(StoreCorruptError, match="priorities.bin"):
        es.PrioritizedSampler(es.open(tmp_path / "s.zarr"))


def test_beta_schedules(tmp_path):
    w = _writer(tmp_path)
    w.segment(0, 50, "terminated")
    s = es.PrioritizedSampler(w.store, beta=0.4, beta_steps=10, persist=False)
    betas = []
    for _ in range(12):
        betas.append(s.beta)
        s.sample_rows(4)
    np.testing.assert_allclose(betas[:11], np.linspace(0.4, 1.0, 11))
    assert betas[11] == 1.0
    s = es.PrioritizedSampler(w.store, beta_schedule=lambda n: 0.1 * (n % 3), persist=False)
    assert [s.beta for _ in range(1)] == [0.0]
    s.sample_rows(2)
    s.sample_rows(2)
    assert s.beta == pytest.approx(0.2)
    with pytest.raises(ValueError, match="beta"):
        es.PrioritizedSampler(w.store, beta=1.5)


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_cer_puts_newest_transition_in_every_batch(tmp_path, kind):
    w = _writer(tmp_path, capacity=64, shard_rows=8, lanes=2, seed=4)
    w.segment(0, 5, "terminated")
    w.segment(1, 5, "open")
    s = (es.UniformSampler(w.store, cer=True, seed=0) if kind == "uniform" else
         es.PrioritizedSampler(w.store, cer=True, seed=0, persist=False))
    rng = np.random.default_rng(0)
    for _ in range(40):
        lane = int(rng.integers(2))
        w.segment(lane, int(rng.integers(1, 4)), ["open", "terminated", "truncated"][
            int(rng.integers(3))])
        newest = None
        for step in range(w.count(lane) - 1, -1, -1):
            row = w.store.index.lane_rows(lane, np.array([step]))[0]
            if ref_transition(w, row, 0, 1, 0.9) is not None:
                newest = row
                break
        b = s.sample(8)
        assert b["index"][-1] == newest
        assert b["weight"][-1] == 1.0
        assert b["obs"][-1][1] == w.step_of(newest)[1]


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_cer_newest_is_a_batch_sample_not_a_spare(tmp_path, kind):
    """With spares (the loader's stale-row replacements) and several batches planned at
    once, the newest transition is the last sample of every batch, before its spares."""
    w = _writer(tmp_path, capacity=64, shard_rows=8, seed=5)
    w.segment(0, 20, "open")
    s = (es.UniformSampler(w.store, cer=True, seed=0) if kind == "uniform" else
         es.PrioritizedSampler(w.store, cer=True, seed=0, persist=False))
    view = es.ReaderView(spare=3)
    newest = s.newest_row(view)
    assert newest is not None
    plan = s.plan(8, batches=4, view=view)
    assert plan.batches == 4 and plan.batch_size == 8 and len(plan.rows) == 4 * 11
    for j in range(4):
        rows, weight = plan.rows[j * 11 : (j + 1) * 11], plan.weight[j * 11 : (j + 1) * 11]
        assert rows[7] == newest and weight[7] == 1.0
    with pytest.raises(ValueError, match="batches"):
        s.plan(8, batches=0, view=view)
    b = s.sample(8)  # spares are not returned: the newest is the last returned sample
    assert len(b["index"]) == 8 and b["index"][-1] == newest


def test_batches_planned_at_once_each_use_their_own_beta(tmp_path):
    w = _writer(tmp_path)
    for _ in range(10):
        w.segment(0, 11, "terminated")
    s = es.PrioritizedSampler(w.store, beta=0.2, beta_final=1.0, beta_steps=10, seed=3,
                              persist=False)
    live = np.flatnonzero(_leaves(s) > 0)
    s.update_priorities(live, np.random.default_rng(1).exponential(1.0, len(live)) + 0.1)
    plan = s.plan(16, batches=5, view=es.ReaderView(spare=2))
    assert s.batches_drawn == 5
    leaves = _leaves(s)
    cum = np.cumsum(leaves)
    edges = np.linspace(0.0, cum[-1], 19)
    for j in range(5):
        part = slice(j * 18, (j + 1) * 18)
        expect = s.priorities.weights(plan.rows[part], s.beta_schedule(j))
        np.testing.assert_allclose(plan.weight[part], expect, rtol=1e-6)
        # each batch is stratified on its own: its i-th row (in tree order) covers part of
        # the i-th 1/18 of the whole priority mass
        rows = np.sort(plan.rows[part])
        lo, hi = cum[rows] - leaves[rows], cum[rows]
        tol = 1e-9 * cum[-1]
        assert np.all(lo <= edges[1:] + tol) and np.all(hi >= edges[:-1] - tol), j
    assert s.beta == pytest.approx(s.beta_schedule(5))


def test_permanently_invalid_rows_are_pruned(tmp_path):
    w = _writer(tmp_path, capacity=128, shard_rows=16)
    w.segment(0, 10, "open")
    w.interrupt()  # the open episode is cut off: its last row has no next step
    w.segment(0, 10, "terminated")
    s = es.PrioritizedSampler(w.store, n_step=1, seed=0, persist=False, alpha=1.0, eps=0.0)
    stuck = w.store.index.lane_rows(0, np.array([9]))
    assert not w.store.index.valid(stuck, 0, 1)[0]
    assert s.priorities.set(stuck, 1e6) == 1  # would take nearly every draw
    for _ in range(3):
        b = s.sample(16)
        assert stuck[0] not in b["index"]
    assert _leaves(s)[stuck[0]] == 0


def test_reader_process_priorities_follow_refresh(tmp_path):
    w = _writer(tmp_path, capacity=128, shard_rows=16)
    w.segment(0, 10, "open")
    w.store.flush()
    reader = es.open(tmp_path / "s.zarr", mode="r")
    s = es.PrioritizedSampler(reader, seed=0, alpha=1.0, eps=0.0)
    rows = reader.index.lane_rows(0, np.arange(10))
    assert (_leaves(s)[rows[:9]] == 1.0).all() and _leaves(s)[rows[9]] == 0
    b = s.sample(16)
    assert 9 not in reader.index.steps(b["index"])
    w.segment(0, 3, "terminated")  # steps 10..12 + final 13
    w.store.flush()
    reader.refresh()
    rows = reader.index.lane_rows(0, np.arange(14))
    assert (_leaves(s)[rows[:13]] > 0).all() and _leaves(s)[rows[13]] == 0
    for _ in range(20):
        b = s.sample(16)
        assert b["obs"][:, 1].tolist() == reader.index.steps(b["index"]).tolist()
    reader.close()


def test_priorities_read_back_publicly_per_row_total_and_max(tmp_path):
    w = _writer(tmp_path)
    for _ in range(10):
        w.segment(0, 11, "terminated")
    w.segment(0, 5, "open")  # its newest row waits for a next one: not drawn yet
    store = w.store
    s = es.PrioritizedSampler(store, alpha=0.5, beta=0.4, eps=0.0, seed=3, persist=False)
    rows = np.arange(store.capacity)
    valid = store.index.valid(rows, 0, 1)
    assert not hasattr(s.priorities, "tree")  # the sum tree is private
    p = s.priority(rows)
    assert p.dtype == np.float64 and p.shape == (store.capacity,)
    np.testing.assert_array_equal(p[valid], 1.0)  # new rows: the running max (1 at first)
    np.testing.assert_array_equal(p[~valid], 0.0)  # final rows, the newest, never written
    np.testing.assert_array_equal(s.priorities.get(), p)
    assert s.total_priority == pytest.approx(valid.sum()) and s.max_priority == 1.0
    live = rows[valid]
    td = np.linspace(0.0, 15.0, len(live))
    assert s.update_priorities(live, td) == len(live)
    np.testing.assert_allclose(s.priority(live), td ** 0.5, rtol=1e-6)
    assert s.total_priority == pytest.approx((td ** 0.5).sum(), rel=1e-6)
    assert s.max_priority == pytest.approx(15.0 ** 0.5, rel=1e-6)
    assert s.priorities.min_priority == pytest.approx(td[1] ** 0.5, rel=1e-6)  # 0: not drawn
    got, weight = s.sample_rows(256)
    np.testing.assert_allclose(weight, (s.priority(got) / s.priorities.min_priority) ** -0.4,
                               rtol=1e-5)
    # set: sampling units as given, rows not drawn skipped, bad values named
    final = rows[(store.index.flags & 2) != 0][:3]
    assert s.priorities.set(np.append(live[1:5], final), 9.0) == 4
    assert (s.priority(live[1:5]) == 9.0).all() and (s.priority(final) == 0).all()
    with pytest.raises(ValueError, match="priority: expected finite values >= 0, got -1"):
        s.priorities.set(live[:2], -1.0)
    with pytest.raises(ValueError, match="out of range"):
        s.priority([store.capacity])
    plain = es.SequenceSampler(store, length=4)
    with pytest.raises(ValueError, match="does not draw by priority .*prioritized=True"):
        plain.priority(live[:2])
    seq = es.SequenceSampler(store, length=4, prioritized=True, persist=False)
    assert seq.total_priority == pytest.approx(seq.priority(rows).sum())
    assert seq.total_priority > 0 and seq.max_priority == 1.0
