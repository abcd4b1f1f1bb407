"""Sequences (R2D2): windows, masks and starts against a plain reference over random
episode layouts with wrap-around, lanes and interrupted episodes; priorities."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import expstore as es
from expstore.loading import assemble
from expstore.sampling import make_sequence_plan, sequence_valid
from expstore.testing import EpisodeWriter, ident_spec, ref_sequence


def _store(tmp_path, stack, lanes, seed, laps=3.5):
    store = es.create(tmp_path / f"s{seed}.zarr", ident_spec(stack=stack),
                      capacity=lanes * 48, lanes=lanes, shard_rows=8, fsync=False)
    w = EpisodeWriter(store, np.random.default_rng(seed))
    while min(w.count(i) for i in range(lanes)) < laps * 48:
        w.random(1, max_len=12, p_open=0.4, p_interrupt=0.05)
    return w


def _obs_stack(batch, stack):
    o = batch["obs"]
    return o if stack else o[:, :, None]


def _check(w, batch, burn_in, length, period, guard=0):
    store = w.store
    stack = store.spec.fields["obs"].stack
    obs = _obs_stack(batch, stack)
    for i, row in enumerate(batch["index"]):
        ref = ref_sequence(w, row, burn_in, length, store.history, period, guard)
        assert ref is not None, f"start row {row} returned but cannot start a sequence"
        assert batch["step_id"][i] == ref["step"]
        np.testing.assert_array_equal(batch["mask"][i], ref["mask"])
        np.testing.assert_array_equal(batch["is_last"][i], ref["is_last"])
        np.testing.assert_array_equal(obs[i], ref["obs"])
        np.testing.assert_array_equal(batch["action"][i], ref["action"])
        off = ~ref["mask"]
        assert (batch["reward"][i][off] == 0).all()
        assert not batch["terminated"][i][off].any()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("stack", [None, 3])
@pytest.mark.parametrize(("burn_in", "length", "period"), [(0, 1, 1), (3, 5, 3), (2, 8, 4)])
def test_every_start_matches_reference(tmp_path, seed, stack, burn_in, length, period):
    w = _store(tmp_path, stack, 1 + seed % 2, seed)
    store = w.store
    rows = np.arange(store.capacity)
    for guard in (0, 6):
        ok = sequence_valid(store.index, rows, burn_in, length, store.history, guard, period)
        ref = np.array([ref_sequence(w, r, burn_in, length, store.history, period, guard)
                        is not None for r in rows])
        np.testing.assert_array_equal(ok, ref)
    good = rows[sequence_valid(store.index, rows, burn_in, length, store.history, 0, period)]
    assert len(good) > 3
    plan = make_sequence_plan(store.index, good, None, burn_in, length, store.history)
    batch, stale = assemble(plan, store.layout, store.source)
    assert stale == 0
    W = burn_in + length
    assert batch["obs"].shape == (len(good), W, *((stack,) if stack else ()), 4)
    assert batch["mask"].shape == (len(good), W)
    _check(w, batch, burn_in, length, period)


@pytest.mark.parametrize("prioritized", [False, True])
def test_sampler_batches_match_reference(tmp_path, prioritized):
    w = _store(tmp_path, 2, 2, seed=7)
    s = es.SequenceSampler(w.store, length=6, burn_in=2, overlap=3, prioritized=prioritized,
                           guard=4, seed=0, persist=False)
    assert s.period == 3 and s.window == 8
    for _ in range(15):
        b = s.sample(12)
        assert b["obs"].shape == (12, 8, 2, 4)
        _check(w, b, 2, 6, 3, guard=4)
    s.cer = True
    b = s.sample(4)
    lane = w.store.index.last_lane
    starts = [w.step_of(r)[1] for r in range(lane * 48, (lane + 1) * 48)
              if ref_sequence(w, r, 2, 6, w.store.history, 3, 4) is not None]
    assert w.step_of(b["index"][-1]) == (lane, max(starts))  # CER: the newest sequence


def test_uniform_starts_are_equally_likely(tmp_path):
    w = _store(tmp_path, None, 1, seed=3, laps=1.5)
    s = es.SequenceSampler(w.store, length=4, period=2, seed=0)
    rows = np.arange(w.store.capacity)
    valid = rows[sequence_valid(w.store.index, rows, 0, 4, 0, 0, 2)]
    counts = np.zeros(w.store.capacity)
    for _ in range(200):
        got, _ = s.sample_rows(100)
        np.add.at(counts, got, 1)
    assert set(np.flatnonzero(counts)) == set(valid.tolist())
    exp = np.full(len(valid), counts.sum() / len(valid))
    chi = ((counts[valid] - exp) ** 2 / exp).sum()
    assert chi < stats.chi2.ppf(0.9999, len(valid) - 1)


def test_r2d2_priorities(tmp_path):
    w = _store(tmp_path, None, 1, seed=5, laps=1.2)
    s = es.SequenceSampler(w.store, length=5, overlap=2, prioritized=True, eta=0.9,
                           alpha=0.9, eps=0.0, seed=0)
    leaves = s.priorities.get()
    pos = w.store.index.episode_step
    assert (leaves[pos % 3 != 0] == 0).all()  # only sequence starts carry priority
    b = s.sample(6)
    td = np.random.default_rng(0).normal(size=(6, 5))
    mask = b["mask"][:, :]
    assert s.update_priorities(b["index"], td, b["step_id"], mask) > 0
    a = np.abs(td)
    for i, row in enumerate(b["index"]):
        m = mask[i]
        if m.any():
            p = 0.9 * a[i][m].max() + 0.1 * a[i][m].mean()
            assert s.priority([row])[0] == pytest.approx(p ** 0.9, rel=1e-6)
    with pytest.raises(ValueError, match="sequences"):
        s.update_priorities(b["index"][:3], td)
    w.store.flush()
    assert (tmp_path / "s5.zarr" / "_index" / "sequence_priorities.bin").exists()
    s2 = es.SequenceSampler(w.store, length=5, overlap=2, prioritized=True, alpha=0.9)
    np.testing.assert_allclose(s2.priorities.get(), s.priorities.get())
    # another period is another set of starts: the saved file is not used
    with pytest.warns(UserWarning, match="sequence"):
        es.SequenceSampler(w.store, length=5, period=2, prioritized=True)


def test_committed_only_keeps_to_flushed_rows(tmp_path):
    store = es.create(tmp_path / "c.zarr", ident_spec(), capacity=256, shard_rows=64,
                      fsync=False)
    w = EpisodeWriter(store, np.random.default_rng(0))
    w.segment(0, 30, "terminated")
    store.flush()
    w.segment(0, 20, "open")  # staged only
    s = es.SequenceSampler(store, length=4, seed=0)
    flushed = es.ReaderView(committed_only=True)
    for _ in range(10):
        b = s.sample(16, view=flushed)
        steps = b["obs"][..., 1][b["mask"]]
        assert steps.max() < 31
    assert max(s.sample(64)["obs"][..., 1].max() for _ in range(5)) > 31


def test_bad_arguments(tmp_path):
    w = _store(tmp_path, None, 1, seed=0, laps=0.5)
    with pytest.raises(ValueError, match="overlap"):
        es.SequenceSampler(w.store, length=4, overlap=4)
    with pytest.raises(ValueError, match="n_step"):
        es.SequenceSampler(w.store, length=4, n_step=3)
    with pytest.raises(ValueError, match="not both"):
        es.SequenceSampler(w.store, length=4, overlap=1, period=2)


def test_window_stops_at_an_interrupted_episode(tmp_path):
    store = es.create(tmp_path / "i.zarr", ident_spec(), capacity=64, shard_rows=16,
                      fsync=False)
    w = EpisodeWriter(store, np.random.default_rng(0))
    w.segment(0, 7, "open")  # steps 0..6, cut off by the reopen below
    w.interrupt()
    w.segment(0, 6, "terminated")  # steps 7..12 + final 13, a new episode
    store = w.store
    rows = store.index.lane_rows(0, np.arange(14))
    ok = sequence_valid(store.index, rows, 0, 5, 0, 0, 3)
    assert np.flatnonzero(ok).tolist() == [0, 3, 6, 7, 10]
    plan = make_sequence_plan(store.index, rows[[3, 10]], None, 0, 5, 0)
    b, _ = assemble(plan, store.layout, store.source)
    assert b["mask"].tolist() == [[True] * 4 + [False], [True] * 4 + [False]]
    assert b["is_last"].tolist() == [[False] * 5, [False, False, False, True, False]]
    assert b["obs"][0, :4, 1].tolist() == [3, 4, 5, 6] and (b["obs"][0, 4] == 0).all()
    assert b["is_first"][:, 0].tolist() == [False, False]


def test_sequences_through_dataloader_workers(tmp_path):
    w = _store(tmp_path, 2, 1, seed=9)
    w.store.flush()
    s = es.SequenceSampler(w.store, length=5, burn_in=2, period=2, prioritized=True,
                           seed=0, persist=False)
    loader = es.make_loader(w.store, s, batch_size=8, num_workers=1, num_batches=3,
                            persistent_workers=False)
    n = 0
    for batch in loader:
        b = {k: v.numpy() for k, v in batch.items()}
        assert b["obs"].shape == (8, 7, 2, 4) and b["mask"].shape == (8, 7)
        _check(w, b, 2, 5, 2, guard=s.guard)
        s.update_priorities(b["index"], np.ones((8, 5)), b["step_id"], b["mask"][:, 2:])
        n += 1
    assert n == 3 and loader.stats.stale_replaced == 0


def test_starts_whose_burn_in_was_overwritten_are_pruned(tmp_path):
    store = es.create(tmp_path / "p.zarr", ident_spec(), capacity=64, shard_rows=16,
                      fsync=False)
    w = EpisodeWriter(store, np.random.default_rng(0))
    w.segment(0, 150, "open")  # one long episode, 2+ laps
    s = es.SequenceSampler(store, length=4, burn_in=8, period=4, prioritized=True, seed=0,
                           persist=False)
    lo = int(store.index.lower_bound(0)[0])
    doomed = store.index.lane_rows(0, np.array([t for t in range(lo, lo + 8) if t % 4 == 0]))
    assert len(doomed) == 2 and (s.priority(doomed) > 0).all()
    assert s.priorities.set(doomed, 1e6) == 2
    for _ in range(3):
        assert not set(s.sample(8)["index"].tolist()) & set(doomed.tolist())
    assert (s.priority(doomed) == 0).all()
