"""RecordToStore: what real Gymnasium envs and vector envs did is what the store holds.

Ground truth comes from a tracing wrapper *under* the recorder (inside each sub-env of a
vector env), so it sees the true per-env transitions independently of autoreset logic.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import expstore as es
from expstore.rows import FLAG_LAST, FLAG_TERMINATED, FLAG_TRUNCATED


class Tracer(gym.Wrapper):
    """Logs every transition of one env, and every reset, into ``log``."""

    def __init__(self, env, log):
        super().__init__(env)
        self.log = log
        self._obs = None

    def reset(self, **kw):
        obs, info = self.env.reset(**kw)
        self.log.append("reset")
        self._obs = obs
        return obs, info

    def step(self, action):
        obs, r, term, trunc, info = self.env.step(action)
        self.log.append(dict(obs=self._obs, action=np.asarray(action), reward=r, next_obs=obs,
                             term=bool(term), trunc=bool(trunc)))
        self._obs = obs
        return obs, r, term, trunc, info


class DictEnv(gym.Env):
    """Dict observations, random episode ends (both kinds), an info extra."""

    observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-5, 5, (2,), np.float32),
                                         "t": gym.spaces.Discrete(100)})
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {"cost": 0.0}

    def _obs(self):
        return {"pos": self.np_random.uniform(-1, 1, 2).astype(np.float32), "t": self.t}

    def step(self, action):
        self.t += 1
        end = self.np_random.random() < 0.15 or self.t >= 99
        term = bool(end and self.np_random.random() < 0.5)
        return self._obs(), float(action), term, bool(end and not term), {"cost": self.t * 0.5}


def reference(log, closed=True):
    """Rows a lane should hold for a tracer log: steps, + a final row per ended episode
    (an episode cut by a reset, or still open at close, ends truncated)."""
    steps = [e for e in log if e != "reset"]
    rows = []
    for i, e in enumerate(log):
        if e == "reset":
            continue
        cut = not (e["term"] or e["trunc"]) and (
            i + 1 == len(log) and closed or i + 1 < len(log) and log[i + 1] == "reset")
        rows.append(dict(e, trunc=e["trunc"] or cut, final=False))
        if e["term"] or e["trunc"] or cut:
            rows.append(dict(obs=e["next_obs"], final=True))
    assert steps
    return rows


def check_lane(store, lane, rows):
    idx = store.index
    assert int(idx.count[lane]) == len(rows) and int(idx.valid_from[lane]) == 0
    r = idx.lane_rows(lane, np.arange(len(rows)))
    flags = store.read("_flags", r)
    got = {n: store.read(n, r) for n in store.spec.fields}
    for j, e in enumerate(rows):
        for name, v in store.spec.flatten("obs", e["obs"]).items():
            np.testing.assert_array_equal(got[name][j], v, err_msg=f"{name} row {j}")
        assert bool(flags[j] & FLAG_LAST) == e["final"], j
        if e["final"]:
            continue
        np.testing.assert_array_equal(got["action"][j], e["action"])
        assert got["reward"][j] == np.float32(e["reward"])
        assert bool(flags[j] & FLAG_TERMINATED) == e["term"], j
        assert bool(flags[j] & FLAG_TRUNCATED) == e["trunc"], j


def test_single_env_records_every_step(tmp_path):
    log = []
    env = Tracer(gym.make("CartPole-v1", max_episode_steps=20), log)
    env = es.RecordToStore(env, tmp_path / "cp.zarr", capacity=2048)
    assert isinstance(env, gym.Wrapper)
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    episodes = 0
    for t in range(300):
        if t == 150:  # cut an episode short
            env.reset()
        _, _, term, trunc, _ = env.step(int(rng.integers(2)))
        if term or trunc:
            episodes += 1
            env.reset()
    assert any(e != "reset" and e["trunc"] for e in log)  # TimeLimit truncations happened
    assert any(e != "reset" and e["term"] for e in log)
    env.close()  # the open episode ends truncated
    store = es.open(tmp_path / "cp.zarr")
    rows = reference(log)
    check_lane(store, 0, rows)
    assert store.episodes_written == episodes + 2  # + the cut one + the one open at close
    # transitions read back pair each step with its real next observation
    anchors = np.array([j for j, e in enumerate(rows) if not e["final"]])
    tr = store.transitions(anchors)
    want = np.stack([rows[j]["next_obs"] for j in anchors])
    np.testing.assert_array_equal(tr["next_obs"], want)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_vector_env_one_lane_per_sub_env(tmp_path, mode):
    logs = [[] for _ in range(3)]
    venv = SyncVectorEnv([lambda i=i: Tracer(gym.make("CartPole-v1", max_episode_steps=12),
                                             logs[i]) for i in range(3)],
                         autoreset_mode=mode)
    env = es.RecordToStore(venv, tmp_path / "v.zarr", capacity=3 * 512)
    assert isinstance(env, es.RecordVectorToStore) and env.store.lanes == 3
    env.reset(seed=1)
    for _ in range(100):
        env.step(venv.action_space.sample())
    env.close()
    store = es.open(tmp_path / "v.zarr")
    for lane in range(3):
        assert sum(e != "reset" and (e["term"] or e["trunc"]) for e in logs[lane]) >= 5
        check_lane(store, lane, reference(logs[lane]))


def test_vector_env_disabled_autoreset_and_dict_obs_with_extras(tmp_path):
    logs = [[] for _ in range(2)]
    venv = SyncVectorEnv([lambda i=i: Tracer(DictEnv(), logs[i]) for i in range(2)],
                         autoreset_mode=AutoresetMode.DISABLED)
    env = es.RecordToStore(venv, tmp_path / "d.zarr", capacity=2 * 256,
                           extras={"cost": es.Field((), np.float32)})
    env.reset(seed=2)
    costs = [[], []]
    for _ in range(120):
        _, _, term, trunc, infos = env.step(venv.action_space.sample())
        for i in range(2):
            costs[i].append(infos["cost"][i])
        done = term | trunc
        if done.any():
            env.reset(options={"reset_mask": done})
    env.close()
    store = es.open(tmp_path / "d.zarr")
    assert set(store.spec.fields) >= {"obs.pos", "obs.t", "cost"}
    for lane in range(2):
        rows = reference(logs[lane])
        check_lane(store, lane, rows)
        r = store.index.lane_rows(lane, np.array([j for j, e in enumerate(rows)
                                                  if not e["final"]]))
        np.testing.assert_allclose(store.read("cost", r), costs[lane])


def test_missing_info_extra_is_a_clear_error_and_nothing_is_lost(tmp_path):
    env = es.RecordToStore(gym.make("CartPole-v1"), tmp_path / "e.zarr",
                           extras={"logp": es.Field((), np.float32)})
    env.reset(seed=0)
    with pytest.raises(es.ValidationError, match="logp"):
        env.step(0)
    assert len(env.store) == 0
    env.close()


def test_reopen_appends_and_rejects_other_spaces(tmp_path):
    url = tmp_path / "r.zarr"
    for _ in range(2):
        env = es.RecordToStore(gym.make("CartPole-v1"), url, capacity=1024)
        env.reset(seed=0)
        for _ in range(30):
            _, _, term, trunc, _ = env.step(0)
            if term or trunc:
                env.reset()
        env.close()
    store = es.open(url)
    assert sum(1 for s in store.read("_flags", np.arange(len(store))) if s & FLAG_LAST) \
        == store.episodes_written
    assert len(store) == 60 + store.episodes_written
    with pytest.raises(es.SpecError, match="differs"):
        es.RecordToStore(gym.make("MountainCar-v0"), url)


def test_a_wrapped_ring_always_holds_the_capacity_asked(tmp_path):
    """A lane's writer drops a whole shard's old rows when it enters it: the store an
    integration makes has a shard per lane more, so ``capacity`` rows stay held."""
    venv = SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(2)])
    env = es.RecordToStore(venv, tmp_path / "ring.zarr", capacity=5000, shard_rows=512)
    store = env.store
    assert store.layout.requested_capacity == 5000
    assert store.capacity == 6144  # 5000 + 2 x 512, rounded up to 2 lanes x 512
    env.reset(seed=0)
    fewest = store.capacity
    for _ in range(10_000):  # over 3 laps of each lane's 3072 rows
        env.step(venv.action_space.sample())
        if store.index.count.min() > 2500:
            per_lane = store.index.held().reshape(2, -1).sum(axis=1)
            fewest = min(fewest, int(per_lane.min()))
    assert store.index.count.min() > 3 * store.layout.lane_capacity  # wrapped
    assert 2500 <= fewest < 3072  # (a shard was dropped on entering it)
    env.close()
