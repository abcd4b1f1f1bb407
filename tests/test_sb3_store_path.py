"""The SB3 buffer sampling from its store (``mirror=False``, or fields over the mirror's
RAM budget): every added transition is sampleable at once, ``size()`` counts it, batches
are drawn ahead on a thread, and PER priorities fed back steer later batches."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from expstore.integrations.sb3 import ExpstoreReplayBuffer, PrioritizedExpstoreReplayBuffer

OBS = spaces.Box(-1000, 1000, (2,), np.float32)


def make(cls=ExpstoreReplayBuffer, **kw):
    kw.setdefault("seed", 0)
    return cls(1000, OBS, spaces.Discrete(3), device="cpu", mirror=False, **kw)


def add_steps(buf, start, stop, done_at=()):
    """One env; step t has obs (t, t), next_obs (t+1, t+1), reward t; ends where told."""
    for t in range(start, stop):
        buf.add(np.full((1, 2), t, np.float32), np.full((1, 2), t + 1, np.float32),
                np.array([[t % 3]]), np.array([float(t)]), np.array([t in done_at]), [{}])


@pytest.mark.parametrize("prefetch", [True, False])
def test_the_newest_step_is_sampleable_at_once_and_counted(tmp_path, prefetch):
    buf = make(url=tmp_path / "s.zarr", prefetch=prefetch)
    add_steps(buf, 0, 1)
    assert buf.size() == 1
    data = buf.sample(8)
    assert (data.observations.numpy() == 0).all() and (data.next_observations.numpy() == 1).all()
    assert (data.rewards.numpy() == 0).all() and (data.dones.numpy() == 0).all()
    add_steps(buf, 1, 12)
    assert buf.size() == 12
    seen = set()
    for _ in range(40):
        d = buf.sample(16)
        np.testing.assert_array_equal(d.next_observations.numpy(), d.observations.numpy() + 1)
        np.testing.assert_array_equal(d.rewards.numpy()[:, 0], d.observations.numpy()[:, 0])
        seen |= set(d.observations.numpy()[:, 0].astype(int).tolist())
    assert seen == set(range(12))  # the newest two (not servable by the store) included
    buf.close()


def test_pending_steps_are_drawn_as_often_as_stored_ones(tmp_path):
    buf = make(url=tmp_path / "f.zarr")
    add_steps(buf, 0, 10)
    counts = np.zeros(10)
    for _ in range(200):
        d = buf.sample(100)
        counts += np.bincount(d.observations.numpy()[:, 0].astype(int), minlength=10)
    share = counts / counts.sum()  # 20,000 draws: each share 0.1 +- 0.006 (3 sigma)
    assert np.abs(share - 0.1).max() < 0.01, share
    buf.close()


def test_n_step_returns_of_pending_steps_stop_at_the_newest(tmp_path):
    buf = make(url=tmp_path / "n.zarr", n_steps=3, gamma=0.5)
    add_steps(buf, 0, 6)
    got = {}
    for _ in range(40):
        d = buf.sample(32)
        for o, nx, r, disc in zip(d.observations.numpy()[:, 0], d.next_observations.numpy()[:, 0],
                                  d.rewards.numpy()[:, 0], d.discounts.numpy()[:, 0],
                                  strict=True):
            got[int(o)] = (int(nx), float(r), float(disc))
    for t in range(6):
        h = min(3, 6 - t)
        want = sum(0.5 ** m * (t + m) for m in range(h))
        assert got[t] == (t + h, pytest.approx(want), pytest.approx(0.5 ** h)), t
    buf.close()


def test_an_episode_end_is_served_by_the_store(tmp_path):
    buf = make(url=tmp_path / "e.zarr")
    add_steps(buf, 0, 5, done_at=(4,))
    assert buf.size() == 5
    d = buf.sample(64)  # staged in RAM, dealt from there
    assert (d.index == -1).all()
    buf.flush()  # in the store: the episode ended, so the store serves every step
    buf.sample(64)  # (the batch drawn ahead before the flush)
    d = buf.sample(64)
    assert buf.size() == 5
    assert (d.index >= 0).all()
    assert set(d.observations.numpy()[:, 0].astype(int).tolist()) <= set(range(5))
    last = d.observations.numpy()[:, 0] == 4
    assert (d.dones.numpy()[last] == 1).all()
    buf.close()


def test_batches_drawn_ahead_are_the_ones_drawn_on_demand(tmp_path):
    a = make(url=tmp_path / "a.zarr", prefetch=True)
    b = make(url=tmp_path / "b.zarr", prefetch=False)
    for buf in (a, b):
        add_steps(buf, 0, 300)
    for _ in range(5):
        da, db = a.sample(32), b.sample(32)
        np.testing.assert_array_equal(da.observations.numpy(), db.observations.numpy())
    assert a._prefetcher is not None and a._prefetcher._next is not None  # one drawn ahead
    a.close()
    b.close()


def test_per_priorities_fed_back_steer_later_batches(tmp_path):
    buf = make(PrioritizedExpstoreReplayBuffer, url=tmp_path / "p.zarr", alpha=1.0)
    add_steps(buf, 0, 200)
    buf.flush()  # the staged steps reach the store (priorities live there)
    favourite = None
    for _ in range(3):
        d = buf.sample(64)
        stored = d.index >= 0
        td = np.full(len(d.index), 1e-3)
        if favourite is None:
            favourite = int(d.observations.numpy()[np.flatnonzero(stored)[0], 0])
        td[d.observations.numpy()[:, 0] == favourite] = 1e4
        buf.update_priorities(d.index, td, d.step_id)  # -1 entries are skipped
    buf.sample(64)  # drawn ahead before the last update
    d = buf.sample(256)
    share = np.mean(d.observations.numpy()[:, 0] == favourite)
    assert share > 0.5, share
    buf.close()
