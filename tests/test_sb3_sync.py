"""The SB3 buffer's RAM mirror reaches the store on a background thread that reads the
steps out of the ring itself: the adding thread must never overwrite a step the thread
has not written yet, however far the store falls behind."""

from __future__ import annotations

import time

import numpy as np
from gymnasium import spaces

import expstore as es
from expstore.integrations.sb3 import ExpstoreReplayBuffer
from expstore.integrations.step_writer import StepWriter


def test_a_slow_store_makes_add_wait_instead_of_losing_steps(tmp_path, monkeypatch):
    extend = StepWriter.extend

    def slow_extend(self, lane, steps):  # a store on a slow disk: 5 ms per write
        time.sleep(0.005)
        extend(self, lane, steps)

    monkeypatch.setattr(StepWriter, "extend", slow_extend)
    n_envs, steps = 2, 160
    buf = ExpstoreReplayBuffer(32, spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2),
                               device="cpu", n_envs=n_envs, url=tmp_path / "s.zarr",
                               chunk=4, mirror=True)
    rng = np.random.default_rng(0)
    obs = rng.random((n_envs, 3), dtype=np.float32)
    added = []
    for _ in range(steps):  # one long episode per env: a row per step in the store
        nxt = rng.random((n_envs, 3), dtype=np.float32)
        buf.add(obs, nxt, rng.integers(0, 2, (n_envs, 1)), np.ones(n_envs, np.float32),
                np.zeros(n_envs, bool), [{} for _ in range(n_envs)])
        added.append(obs)
        obs = nxt
    data = buf.sample(64)  # the mirror serves the newest steps meanwhile
    assert data.observations.shape == (64, 3)
    buf.close()
    store = es.open(tmp_path / "s.zarr")
    idx = store.index
    for lane in range(n_envs):
        lo, hi = int(idx.lower_bound()[lane]), int(idx.count[lane])
        assert hi == steps + 1  # every step, then the final row of the unfinished episode
        rows = idx.lane_rows(lane, np.arange(lo, steps))
        got = store.read("obs", rows)
        want = np.stack([a[lane] for a in added[lo:steps]])
        np.testing.assert_array_equal(got, want)
    store.close()


def test_opening_the_store_behind_a_mirror_leaves_np_random_alone(tmp_path):
    """With seed=None the mirror draws its batches from np.random exactly as SB3 does; the
    store opening at the first chunk (inside the training loop) must not draw from it."""
    buf = ExpstoreReplayBuffer(64, spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2),
                               device="cpu", url=tmp_path / "r.zarr", chunk=8, mirror=True)
    np.random.seed(0)
    obs = np.zeros((1, 3), np.float32)
    for t in range(20):  # the store opens at add 8
        buf.add(obs + t, obs + t + 1, np.array([[0]]), np.ones(1, np.float32),
                np.zeros(1, bool), [{}])
    assert buf._store is not None
    drawn = np.random.random()
    np.random.seed(0)
    assert drawn == np.random.random()
    buf.close()
