"""n-step transitions and frame stacks against a plain reference, over random episode layouts
(several laps of the ring, lanes, interrupted episodes, terminated and truncated ends)."""

from __future__ import annotations

import numpy as np
import pytest

import expstore as es
from expstore.loading import assemble
from expstore.sampling import make_plan
from expstore.testing import EpisodeWriter, ident_spec, ref_transition

GAMMA = 0.9


def _store(tmp_path, stack, lanes, seed, laps=3.5, p_interrupt=0.05):
    spec = ident_spec(stack=stack)
    store = es.create(tmp_path / f"s{seed}.zarr", spec, capacity=lanes * 32, lanes=lanes,
                      shard_rows=8, fsync=False)
    w = EpisodeWriter(store, np.random.default_rng(seed))
    while min(w.count(i) for i in range(lanes)) < laps * 32:
        w.random(1, max_len=9, p_open=0.3, p_interrupt=p_interrupt)
    return w


def _check(w, rows, batch, history, n, guard=0):
    for i, row in enumerate(rows):
        ref = ref_transition(w, row, history, n, GAMMA, guard)
        assert ref is not None, f"row {row} returned but not sampleable"
        obs = batch["obs"][i]
        nxt = batch["next_obs"][i]
        if history == 0:
            obs, nxt = obs[None], nxt[None]
        np.testing.assert_array_equal(obs, ref["obs"])
        np.testing.assert_array_equal(nxt, ref["next_obs"])
        assert batch["step_id"][i] == ref["step"]
        assert batch["terminated"][i] == ref["terminated"]
        assert batch["truncated"][i] == ref["truncated"]
        np.testing.assert_allclose(batch["reward"][i], ref["reward"], rtol=1e-6, atol=1e-6)
        if n > 1:
            assert batch["horizon"][i] == ref["horizon"]
            np.testing.assert_allclose(batch["discount"][i], ref["discount"], rtol=1e-6)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n", [1, 3, 6])
@pytest.mark.parametrize("stack", [None, 3])
def test_every_row_matches_reference(tmp_path, seed, n, stack):
    lanes = 1 + seed % 2
    w = _store(tmp_path, stack, lanes, seed)
    store = w.store
    history = store.history
    rows = np.arange(store.capacity)
    for guard in (0, 5):
        valid = store.index.valid(rows, history, n, guard)
        ref_ok = np.array([ref_transition(w, r, history, n, GAMMA, guard) is not None
                           for r in rows])
        np.testing.assert_array_equal(valid, ref_ok)
    assert valid.sum() > 10
    good = rows[store.index.valid(rows, history, n, 0)]
    plan = make_plan(store.index, good, None, history, n, GAMMA)
    batch, stale = assemble(plan, store.layout, store.source)
    assert stale == 0
    _check(w, good, batch, history, n)


def test_truncated_bootstraps_terminated_does_not(tmp_path):
    spec = ident_spec()
    store = es.create(tmp_path / "t.zarr", spec, capacity=64, shard_rows=16, fsync=False)
    w = EpisodeWriter(store, np.random.default_rng(0))
    w.segment(0, 3, "terminated")  # rows 0..2 + final 3
    w.segment(0, 3, "truncated")  # rows 4..6 + final 7
    w.segment(0, 5, "open")  # rows 8..12
    b = store.transitions(np.array([1, 5, 8]), n_step=3, gamma=0.5)
    np.testing.assert_array_equal(b["horizon"], [2, 2, 3])
    np.testing.assert_allclose(b["discount"], [0.0, 0.25, 0.125])
    np.testing.assert_array_equal(b["next_obs"][:, 1], [3, 7, 11])  # final obs / 3 ahead
    assert b["terminated"].tolist() == [True, False, False]
    assert b["truncated"].tolist() == [False, True, False]
    r = [w.log[0][s].reward for s in range(13)]
    np.testing.assert_allclose(b["reward"], [r[1] + 0.5 * r[2], r[5] + 0.5 * r[6],
                                             r[8] + 0.5 * r[9] + 0.25 * r[10]], rtol=1e-6)
    # rows 10, 11 cannot look 3 steps ahead yet; 12 is the newest row (no next row)
    assert store.index.valid(np.array([9, 10, 11, 12]), 0, 3).tolist() == [
        True, False, False, False]
