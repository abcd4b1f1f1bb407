"""Property: no sampler ever returns data that crosses an episode start, a lane, overwritten
rows or (for DataLoader use) rows not yet on storage.

Every observation encodes ``(lane, step, episode uid, position)``, so each returned sample
is checked from the bytes it carries, whatever layout hypothesis writes: random episode
segments over lanes, several laps of small rings, interrupted episodes, frame stacks,
n-step horizons, guard bands, flushes at random points.
"""

from __future__ import annotations

import tempfile

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import expstore as es
from expstore.loading import assemble
from expstore.testing import POS, STEP, UID, EpisodeWriter, ident_spec, ref_transition

segments = st.lists(
    st.tuples(st.integers(0, 1), st.integers(1, 14),
              st.sampled_from(["open", "terminated", "truncated"]),
              st.booleans(), st.integers(0, 12)),
    min_size=1, max_size=30)


def _check_stack(stack, lane, uid, step, pos, lower, upper):
    """A frame stack ending at (step, pos): same lane and episode, clamped at its start."""
    k = len(stack)
    for i, frame in enumerate(stack):
        back = k - 1 - i
        want = step - min(back, pos)
        assert frame[0] == lane, "frame from another lane"
        assert frame[UID] == uid, "frame from another episode"
        assert frame[STEP] == want and frame[POS] == pos - min(back, pos)
        assert lower <= frame[STEP] < upper, "frame overwritten or not yet readable"


def _reward(achieved, desired, info):
    return np.linalg.norm(achieved - desired, axis=-1).astype(np.float32)


def _transitions(w, s, b, committed_only):
    store = w.store
    hist = store.history
    key = "obs" if "obs" in b else "obs.observation"
    for i in range(len(b["index"])):
        o = b[key][i] if hist else b[key][i][None]
        n = b["next_" + key][i] if hist else b["next_" + key][i][None]
        lane, step, uid, pos = (int(x) for x in o[-1])
        assert b["index"][i] // store.layout.lane_capacity == lane
        assert b["step_id"][i] == step
        lower = store.index.lower_bound(0)[lane]
        upper = (store.index.committed if committed_only else store.index.count)[lane]
        _check_stack(o, lane, uid, step, pos, lower, upper)
        m = int(b["horizon"][i]) if "horizon" in b else 1
        _check_stack(n, lane, uid, step + m, pos + m, lower, upper)
        assert ref_transition(w, b["index"][i], hist, s.n_step, s.gamma, s.guard) is not None
        if b.get("relabeled", np.zeros(i + 1, bool))[i]:  # the goal is an achieved goal of
            goal = b["obs.desired_goal"][i]  # an intact row of the same episode
            hits = [t for t, r in w.log[lane].items()
                    if r.uid == uid and np.array_equal(r.goal, goal)]
            assert len(hits) == 1 and lower <= hits[0] < upper


def _sequences(w, b, committed_only):
    store = w.store
    stacked = store.history > 0
    for i in range(len(b["index"])):
        mask = b["mask"][i]
        obs = b["obs"][i] if stacked else b["obs"][i][:, None]
        first = obs[np.argmax(mask)][-1]
        lane, uid = int(first[0]), int(first[UID])
        lower = store.index.lower_bound(0)[lane]
        upper = (store.index.committed if committed_only else store.index.count)[lane]
        steps = [int(x[-1][STEP]) for x in obs[mask]]
        assert steps == list(range(steps[0], steps[0] + len(steps))), "window has a gap"
        assert b["step_id"][i] in steps
        for x in obs[mask]:
            _check_stack(x, lane, uid, int(x[-1][STEP]), int(x[-1][POS]), lower, upper)
        assert (obs[~mask] == 0).all()
        assert mask[np.argmax(mask):].cumprod().sum() == mask.sum(), "mask is not one run"


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(segs=segments, lanes=st.integers(1, 2), shards=st.integers(2, 4),
       stack=st.sampled_from([None, 2, 3]), n_step=st.sampled_from([1, 3]),
       guard=st.sampled_from([0, 3]), kind=st.sampled_from(
           ["uniform", "prioritized", "sequence", "sequence-prio", "cer", "her"]),
       committed_only=st.booleans(), seed=st.integers(0, 2**16))
def test_no_sample_crosses_boundaries(segs, lanes, shards, stack, n_step, guard, kind,
                                      committed_only, seed):
    with tempfile.TemporaryDirectory() as d:
        her = kind == "her"
        store = es.create(f"{d}/h.zarr", ident_spec(stack=stack, goal=her),
                          capacity=lanes * 8 * shards, lanes=lanes, shard_rows=8, fsync=False)
        w = EpisodeWriter(store, np.random.default_rng(seed), goal=her)
        for lane, T, end, interrupt, flush in segs:
            w.segment(lane % lanes, T, end)
            if interrupt and flush > 10:
                w.interrupt()
            elif flush > 6:
                w.store.flush()
        store = w.store
        kw = dict(guard=guard, seed=seed)
        if kind in ("uniform", "cer"):
            s = es.UniformSampler(store, n_step=n_step, cer=kind == "cer", **kw)
        elif her:
            strategy = ["future", "final", "episode"][seed % 3]
            s = es.HERSampler(es.UniformSampler(store, **kw), _reward, strategy, k=3,
                              seed=seed)
        elif kind == "prioritized":
            s = es.PrioritizedSampler(store, n_step=n_step, persist=False, **kw)
        else:
            s = es.SequenceSampler(store, length=2 + n_step, burn_in=n_step - 1,
                                   period=n_step, prioritized=kind == "sequence-prio",
                                   persist=False, **kw)
        view = es.ReaderView(committed_only=committed_only)
        for _ in range(3):
            try:
                plan = s.plan(8, view=view)
            except es.NotEnoughData:
                event("not enough data")
                return
            event(f"checked {kind}")
            # nothing is written meanwhile: a stale row means the sampler chose it wrongly
            b, stale = assemble(plan, store.layout, store.source)
            assert stale == 0, "the sampler planned rows that are not intact"
            if kind.startswith("sequence"):
                _sequences(w, b, committed_only)
            else:
                _transitions(w, s, b, committed_only)
            if kind == "prioritized":
                s.update_priorities(b["index"], np.arange(8.0), b["step_id"])
        store.close()
