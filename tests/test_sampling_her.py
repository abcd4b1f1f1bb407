"""Hindsight relabeling: goals from the right rows of the same episode, rewards recomputed,
the relabel ratio, and batches through a real DataLoader."""

from __future__ import annotations

import numpy as np
import pytest

import expstore as es
from expstore.testing import EpisodeWriter, ident_spec


def reward_fn(achieved, desired, info):
    return -(np.linalg.norm(achieved - desired, axis=-1) > 0.5).astype(np.float32)


def _store(tmp_path, lanes=2, seed=0, laps=2.5):
    store = es.create(tmp_path / "her.zarr", ident_spec(goal=True), capacity=lanes * 64,
                      lanes=lanes, shard_rows=16, fsync=False)
    w = EpisodeWriter(store, np.random.default_rng(seed), goal=True)
    while min(w.count(i) for i in range(lanes)) < laps * 64:
        w.random(1, max_len=10, p_open=0.2)
    return w


def _goal_step(w, lane, uid, goal):
    hits = [s for s, r in w.log[lane].items() if r.uid == uid and np.array_equal(r.goal, goal)]
    assert len(hits) == 1, "relabeled goal is not an achieved goal of the same episode"
    return hits[0]


def _check(w, b, strategy):
    n_rel = 0
    for i in range(len(b["index"])):
        lane, step, uid, pos = b["obs.observation"][i].astype(int)
        log = w.log[lane]
        end = next((s for s in range(step, step + 100) if s in log and log[s].uid == uid
                    and log[s].final), None)
        goal = b["obs.desired_goal"][i]
        np.testing.assert_array_equal(b["next_obs.desired_goal"][i], goal)
        if not b["relabeled"][i]:
            np.testing.assert_array_equal(goal, log[step].desired)
            continue
        n_rel += 1
        assert end is not None, "a transition of an unfinished episode was relabeled"
        g = _goal_step(w, lane, uid, goal)
        if strategy == "future":
            assert step < g <= end
        elif strategy == "final":
            assert g == end
        else:
            assert step - pos < g <= end and g >= w.lower(lane)
        expect = reward_fn(b["next_obs.achieved_goal"][i], goal, {})
        assert b["reward"][i] == expect
        np.testing.assert_array_equal(b["next_obs.achieved_goal"][i], log[step + 1].goal)
    return n_rel


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_relabeled_goals_come_from_the_episode(tmp_path, strategy):
    w = _store(tmp_path)
    her = es.HERSampler(w.store, reward_fn, strategy=strategy, k=4, seed=0)
    assert her.ratio == 0.8
    total = rel = 0
    offsets = set()
    for _ in range(30):
        b = her.sample(20)
        rel += _check(w, b, strategy)
        total += 20
        for i in np.flatnonzero(b["relabeled"]):
            lane, step, uid, _ = b["obs.observation"][i].astype(int)
            offsets.add(_goal_step(w, lane, uid, b["obs.desired_goal"][i]) - step)
    # only the lanes' open episodes are left alone; nearly all samples are finished ones
    assert 0.7 * total <= rel <= 0.8 * total
    if strategy == "future":
        assert offsets >= set(range(1, 8))
    if strategy == "episode":
        assert min(offsets) < 0 < max(offsets)


def test_open_episodes_are_not_relabeled_and_ratio_is_exact(tmp_path):
    store = es.create(tmp_path / "o.zarr", ident_spec(goal=True), capacity=256, shard_rows=16,
                      fsync=False)
    w = EpisodeWriter(store, np.random.default_rng(1), goal=True)
    for _ in range(8):
        w.segment(0, 9, "terminated")
    her = es.HERSampler(store, reward_fn, k=3, seed=1)
    for _ in range(10):
        assert her.sample(16)["relabeled"].sum() == 12  # round(16 * 3/4)
    w.segment(0, 40, "open")
    her = es.HERSampler(es.UniformSampler(store, seed=2), reward_fn, k=1, seed=2)
    for _ in range(10):
        b = her.sample(32)
        _check(w, b, "future")
        opened = b["obs.observation"][:, 1] >= 80
        assert not b["relabeled"][opened].any()
    her0 = es.HERSampler(store, reward_fn, k=0)
    assert not her0.sample(16)["relabeled"].any()


def test_bad_configuration(tmp_path):
    w = _store(tmp_path, lanes=1, laps=0.5)
    with pytest.raises(ValueError, match="strategy"):
        es.HERSampler(w.store, reward_fn, strategy="random")
    with pytest.raises(ValueError, match="achieved"):
        es.HERSampler(w.store, reward_fn, achieved="obs.goal")
    with pytest.raises(ValueError, match="n_step"):
        es.HERSampler(es.UniformSampler(w.store, n_step=3), reward_fn)
    her = es.HERSampler(w.store, lambda a, d, i: np.zeros(3), seed=0)
    with pytest.raises(ValueError, match="compute_reward"):
        her.sample(16)


def test_her_through_dataloader_workers(tmp_path):
    w = _store(tmp_path, lanes=1)
    w.store.flush()
    her = es.HERSampler(es.PrioritizedSampler(w.store, seed=0, persist=False), reward_fn,
                        seed=0)
    loader = es.make_loader(w.store, her, batch_size=16, num_workers=1, num_batches=4,
                            persistent_workers=False)
    n = 0
    for batch in loader:
        b = {k: v.numpy() for k, v in batch.items()}
        _check(w, b, "future")
        assert b["relabeled"].any()
        her.update_priorities(b["index"], np.ones(16), b["step_id"])
        n += 1
    assert n == 4


def test_a_loader_batch_wholly_overwritten_is_planned_again_after_a_refresh(tmp_path):
    """A learner's loader plans relabeled batches from a view its sampler never refreshes
    by itself, and the writer lapped the ring three times since: the loader refreshes
    through the HER sampler (its wrapped sampler's store) and plans again, where it would
    plan from the same stale view until ``StaleBatchError``."""
    w = _store(tmp_path, lanes=1)
    w.store.flush()
    reader = es.open(tmp_path / "her.zarr")
    base = es.UniformSampler(reader, seed=0, refresh_every=None)
    her = es.HERSampler(base, reward_fn, seed=0)
    seen = int(reader.index.count[0])
    while w.count(0) < seen + 3 * 64:
        w.random(1, max_len=10, p_open=0.2)
    w.store.flush()
    loader = es.make_loader(reader, her, batch_size=16, num_workers=0, num_batches=2)
    for batch in loader:
        b = {k: v.numpy() for k, v in batch.items()}
        _check(w, b, "future")
        assert b["step_id"].min() >= seen + 2 * 64  # the current lap's rows
    assert int(reader.index.count[0]) == w.count(0)
    assert loader.stats.batches == 2
    reader.close()
