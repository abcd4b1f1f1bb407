"""Reading a store back: ``store.episodes()``, ``store.episode(i)``, filters, counts that say
what they count, capacity rounding stated, and ``read()`` naming the fields that exist."""

from __future__ import annotations

import numpy as np
import pytest

import expstore as es

LENGTHS = (7, 3, 11, 5)  # episode lengths (steps) written into each lane, then an open one


def _frame(t: int) -> np.ndarray:
    return np.full((6, 6), t % 251, np.uint8)


@pytest.fixture
def store(tmp_path):
    spec = es.Spec.create(obs=es.Field((6, 6), np.uint8, stack=3),
                          action=es.Field((), np.int64), extras={"cost": es.Field((), np.float32)})
    s = es.create(tmp_path / "s.zarr", spec, capacity=1000, lanes=2)
    for lane in range(2):
        t = 1000 * lane
        for i, T in enumerate((*LENGTHS, 4)):
            for k in range(T):
                end = k == T - 1 and i < len(LENGTHS)
                s.add(_frame(t), t, float(k), _frame(t + 1), terminated=end and i % 2 == 0,
                      truncated=end and i % 2 == 1, lane=lane, cost=np.float32(t))
                t += 1
            t += 1  # the final observation's frame
    s.flush()
    yield s
    s.close()


def test_counts_say_what_they_count(store):
    steps = 2 * (sum(LENGTHS) + 4)
    assert store.num_transitions == steps
    assert len(store) == steps + 2 * len(LENGTHS)  # + one final row per finished episode
    assert store.num_episodes == 2 * len(LENGTHS)
    assert store.episodes_written == 2 * len(LENGTHS)


def test_episodes_iterate_whole_episodes_like_minari(store):
    eps = list(store.episodes())
    assert [e["steps"] for e in eps] == [*LENGTHS, *LENGTHS]
    assert [e["id"] for e in eps] == list(range(8))
    assert [e["lane"] for e in eps] == [0] * 4 + [1] * 4
    e = eps[2]  # lane 0, third episode: 11 steps starting at frame 7+1+3+1
    T, t0 = 11, 12
    assert e["obs"].shape == (T + 1, 3, 6, 6) and e["action"].shape == (T,)
    assert e["obs"][:, -1, 0, 0].tolist() == [t0 + k for k in range(T + 1)]  # final obs kept
    assert e["obs"][0, :, 0, 0].tolist() == [t0] * 3  # stack padded at the episode start
    assert e["action"].tolist() == list(range(t0, t0 + T))
    assert e["reward"].tolist() == list(range(T))
    assert e["terminated"].tolist() == [False] * (T - 1) + [True]
    assert not e["truncated"].any() and eps[1]["truncated"][-1]
    assert e["cost"].shape == (T + 1,)
    flat = store.episode(2, stacked=False)
    assert flat["obs"].shape == (T + 1, 6, 6) and (flat["obs"] == e["obs"][:, -1]).all()


def test_episode_filters_by_lane_and_step_range(store):
    lane1 = list(store.episodes(lanes=1))
    assert [e["lane"] for e in lane1] == [1] * 4
    assert lane1[0]["action"][0] == 1000
    assert store.episode(-1)["first_step"] == store.episode(3, lanes=1)["first_step"]
    # lane steps [8, 24): episodes 2 (rows 8..11) and 3 (rows 12..23) lie within it
    inside = list(store.episodes(lanes=0, steps=(8, 24)))
    assert [(e["first_step"], e["steps"]) for e in inside] == [(8, 3), (12, 11)]
    assert [e["steps"] for e in store.episodes(steps=(None, 12))] == [7, 3, 7, 3]
    with pytest.raises(IndexError, match="holds 4 complete"):
        store.episode(4, lanes=0)
    with pytest.raises(ValueError, match="lanes: expected lane numbers in 0..1"):
        list(store.episodes(lanes=5))
    with pytest.raises(ValueError, match=r"steps: expected a \(start, stop\)"):
        list(store.episodes(steps=7))


def test_quarantined_rows_end_episodes(store):
    store.index.mark_lost(0, [(14, 15)], 0, 100)  # inside lane 0's third episode
    eps = list(store.episodes(lanes=0))
    assert [e["steps"] for e in eps] == [7, 3, 5]  # the damaged one is left out
    assert store.num_transitions == 2 * (sum(LENGTHS) + 4) - 1


def test_capacity_rounding_is_stated(tmp_path):
    spec = es.Spec.create(obs=es.Field((3,), np.float32), action=es.Field((), np.int64))
    s = es.create(tmp_path / "r.zarr", spec, capacity=100_000)
    assert s.capacity == 100_352
    assert "capacity=100352 (100000 requested, rounded up to whole shards" in repr(s)
    s.close()
    again = es.open(tmp_path / "r.zarr")
    assert "100000 requested" in repr(again) and again.layout.requested_capacity == 100_000
    again.close()
    # headroom: a shard per lane more than asked, so that a wrapped ring holds what was asked
    h = es.create(tmp_path / "h.zarr", spec, capacity=1000, lanes=2, shard_rows=128,
                  headroom_rows=128)
    assert h.capacity == 1280 and h.layout.requested_capacity == 1000  # 1000 + 256 -> 5 x 256
    assert "(1000 requested, rounded up to whole shards with 256 rows of headroom" in repr(h)
    h.close()
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="headroom_rows: expected an int >= 0"):
            es.create(tmp_path / "bad.zarr", spec, capacity=1000, headroom_rows=bad)
    assert not (tmp_path / "bad.zarr").exists()  # refused before anything was written


def test_read_names_the_fields_that_exist(store):
    with pytest.raises(KeyError, match=r"'next_obs' is not stored: it is the next row's 'obs'.*"
                       r"fields: obs, action, reward, terminated, truncated, cost"):
        store.read("next_obs", np.arange(3))
    with pytest.raises(KeyError, match="field 'nope' is not in this store; fields: obs"):
        store.read("nope", np.arange(3))
