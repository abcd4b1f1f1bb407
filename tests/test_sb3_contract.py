"""SB3's ReplayBuffer contract, held by ExpstoreReplayBuffer with its RAM mirror (the default
for small fields): the same stream goes into SB3's own buffer and ours, and both must
agree on ``size()``, ``pos``, ``full``, ``reset()``, stored values and dtypes, n-step
returns, VecNormalize and timeouts. Mirrors SB3's ``tests/test_buffers.py`` (buffer
dtypes, normalization, n_envs > 1, reset, n-step) and the off-policy parts of its suite
(``learning_starts=0``, ``save_replay_buffer``/``load_replay_buffer``), plus the faults
users hit: subclassed spaces, pickles without their store, copies, capacity."""

from __future__ import annotations

import copy
import shutil

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

pytest.importorskip("stable_baselines3")
from stable_baselines3 import DQN, SAC, TD3  # noqa: E402
from stable_baselines3.common.buffers import NStepReplayBuffer, ReplayBuffer  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.vec_env import VecNormalize  # noqa: E402

import expstore as es  # noqa: E402
from expstore.integrations import (  # noqa: E402
    ExpstoreReplayBuffer,
    PrioritizedDQN,
    PrioritizedExpstoreReplayBuffer,
)
from expstore.rows import FLAG_LAST  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def stream(obs_space, act_space, n, n_envs=1, episode=13, seed=0):
    """``n`` add() argument tuples: episodes of ``episode`` steps, every other one ending
    in a time limit (SB3's ``TimeLimit.truncated``)."""
    obs_space.seed(seed)
    act_space.seed(seed + 1)
    rng = np.random.default_rng(seed)

    def draw(space):
        got = [space.sample() for _ in range(n_envs)]
        if isinstance(got[0], dict):
            return {k: np.stack([g[k] for g in got]) for k in got[0]}
        return np.stack(got)

    obs, out = draw(obs_space), []
    for t in range(n):
        nxt = draw(obs_space)
        done = np.array([(t + e) % episode == episode - 1 for e in range(n_envs)])
        infos = [{"TimeLimit.truncated": bool(d and (t // episode) % 2)} for d in done]
        out.append((obs, nxt, draw(act_space), rng.normal(size=n_envs).astype(np.float32),
                    done, infos))
        obs = draw(obs_space) if done.any() else nxt
    return out


def both(obs_space, act_space, size, n_envs=1, **kw):
    ref = ReplayBuffer(size, obs_space, act_space, "cpu", n_envs=n_envs,
                       handle_timeout_termination=kw.get("handle_timeout_termination", True))
    ours = ExpstoreReplayBuffer(size, obs_space, act_space, "cpu", n_envs=n_envs, seed=0, **kw)
    assert ours.mirrored
    return ref, ours


def same_transitions(ref, ours, inds, envs):
    """Our mirror's transitions at (inds, envs) equal SB3's arrays there."""
    b = ours._mirror.gather(inds, envs)
    np.testing.assert_array_equal(
        b["obs"].reshape(len(inds), *ref.obs_shape), ref.observations[inds, envs])
    np.testing.assert_array_equal(
        b["next_obs"].reshape(len(inds), *ref.obs_shape), ref.next_observations[inds, envs])
    np.testing.assert_array_equal(b["action"].reshape(len(inds), -1), ref.actions[inds, envs])
    np.testing.assert_array_equal(b["reward"], ref.rewards[inds, envs])
    want_done = ref.dones[inds, envs] * (1 - ref.timeouts[inds, envs])
    np.testing.assert_array_equal(b["terminated"], want_done.astype(bool))


# -- size(), pos, full, reset(), the newest step ---------------------------------------------
@pytest.mark.parametrize("n_envs", [1, 3])
def test_size_pos_full_follow_sb3_through_wraparound(n_envs):
    obs_space = spaces.Box(-1, 1, (4,), np.float32)
    act_space = spaces.Discrete(2)
    ref, ours = both(obs_space, act_space, 50 * n_envs, n_envs=n_envs)
    for k, args in enumerate(stream(obs_space, act_space, 130, n_envs), 1):
        ref.add(*args)
        ours.add(*args)
        assert (ours.size(), ours.pos, ours.full) == (ref.size(), ref.pos, ref.full), k
        # the step just added is sampleable at once: its next_obs was given to add()
        newest = (ours.pos - 1) % ours.buffer_size
        same_transitions(ref, ours, np.array([newest] * n_envs), np.arange(n_envs))
    inds = np.arange(ours.buffer_size).repeat(n_envs)
    same_transitions(ref, ours, inds, np.tile(np.arange(n_envs), ours.buffer_size))
    data = ours.sample(200)
    assert data.observations.shape == (200, 4) and data.actions.shape == (200, 1)
    ours.reset()
    assert (ours.size(), ours.pos, ours.full) == (0, 0, False)
    with pytest.raises(es.ValidationError, match="empty"):
        ours.sample(4)
    ours.close()


@pytest.mark.parametrize("n_envs", [1, 2])
def test_same_np_random_seed_gives_sb3s_batches(n_envs):
    """seed=None draws like SB3 (np.random, same calls): CleanRL/SB3 runs stay identical."""
    obs_space, act_space = spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(3)
    ref = ReplayBuffer(100, obs_space, act_space, "cpu", n_envs=n_envs)
    ours = ExpstoreReplayBuffer(100, obs_space, act_space, "cpu", n_envs=n_envs)
    for args in stream(obs_space, act_space, 80, n_envs):
        ref.add(*args)
        ours.add(*args)
    for seed in range(3):
        np.random.seed(seed)
        want = ref.sample(32)
        np.random.seed(seed)
        got = ours.sample(32)
        for f in ("observations", "next_observations", "actions", "rewards", "dones"):
            np.testing.assert_array_equal(getattr(got, f).numpy(), getattr(want, f).numpy(), f)
    ours.close()


def test_one_add_is_one_sampleable_transition(tmp_path):
    """k adds give k transitions (the newest included) and size() says k."""
    space = spaces.Box(-10, 10, (2,), np.float32)
    buf = ExpstoreReplayBuffer(100, space, spaces.Discrete(2), url=tmp_path / "one.zarr")
    o = np.zeros((1, 2), np.float32)
    buf.add(o, o + 1, np.array([1]), np.array([2.0]), np.array([False]), [{}])
    assert buf.size() == 1
    data = buf.sample(16)
    assert (data.next_observations.numpy() == 1).all() and (data.rewards.numpy() == 2).all()
    buf.close()


# -- stored values and dtypes -------------------------------------------------------------------
SPACES = {
    "box_f32": spaces.Box(-1, 1, (3,), np.float32),
    "box_f64": spaces.Box(-1, 1, (2, 2), np.float64),
    "box_u8": spaces.Box(0, 255, (5,), np.uint8),
    "box_i32": spaces.Box(-5, 5, (3,), np.int32),
    "discrete": spaces.Discrete(7, start=2),
    "multidiscrete": spaces.MultiDiscrete([3, 5]),
    "multibinary": spaces.MultiBinary(4),
}
ACTIONS = {
    "discrete": spaces.Discrete(4),
    "box": spaces.Box(-1, 1, (2,), np.float32),
    "box_f64": spaces.Box(-1, 1, (3,), np.float64),
    "multidiscrete": spaces.MultiDiscrete([2, 3]),
    "multibinary": spaces.MultiBinary(3),
}


@pytest.mark.parametrize("obs_name", list(SPACES))
@pytest.mark.parametrize("act_name", list(ACTIONS))
def test_every_obs_and_action_dtype_matches_sb3(obs_name, act_name):
    obs_space, act_space = SPACES[obs_name], ACTIONS[act_name]
    ref, ours = both(obs_space, act_space, 40)
    for args in stream(obs_space, act_space, 60):
        ref.add(*args)
        ours.add(*args)
    inds = np.arange(40)
    want, got = ref._get_samples(inds), ours._get_samples(inds)
    for f in ("observations", "next_observations", "actions", "rewards", "dones"):
        w, g = getattr(want, f), getattr(got, f)
        assert g.shape == w.shape and g.dtype == w.dtype, (f, g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_array_equal(g.numpy(), w.numpy(), f)
    ours.close()


def test_subclassed_spaces_are_matched_like_isinstance():
    class MyBox(spaces.Box):
        pass

    class MyDiscrete(spaces.Discrete):
        pass

    class MyDict(spaces.Dict):
        pass

    obs_space = MyDict({"pos": MyBox(-1, 1, (3,), np.float32), "k": MyDiscrete(3)})
    spec = es.Spec.from_spaces(obs_space, MyDiscrete(2))
    assert spec.fields["obs.pos"].shape == (3,) and spec.fields["obs.k"].shape == ()
    buf = ExpstoreReplayBuffer(64, obs_space, MyDiscrete(2))
    for args in stream(obs_space, MyDiscrete(2), 20):
        buf.add(*args)
    assert buf.sample(8).observations["pos"].shape == (8, 3)
    buf.close()


def test_optimize_memory_usage_and_timeouts_match_sb3():
    """optimize_memory_usage is accepted (SB3's own buffer refuses it together with
    handle_timeout_termination); timeouts bootstrap, handle_timeout_termination=False
    makes them terminations."""
    obs_space, act_space = spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2)
    for handle in (True, False):
        ref, ours = both(obs_space, act_space, 80, handle_timeout_termination=handle,
                         optimize_memory_usage=True)
        for args in stream(obs_space, act_space, 80):
            ref.add(*args)
            ours.add(*args)
        same_transitions(ref, ours, np.arange(80), np.zeros(80, np.int64))
        timeouts = np.array([a[5][0]["TimeLimit.truncated"] for a in stream(
            obs_space, act_space, 80)])
        got = ours._get_samples(np.flatnonzero(timeouts)).dones.numpy()
        assert timeouts.sum() >= 2 and (got == (0.0 if handle else 1.0)).all()
        ours.close()


def test_n_step_with_several_envs_matches_sb3():
    obs_space, act_space = spaces.Box(-9, 9, (2,), np.float32), spaces.Discrete(3)
    ref = NStepReplayBuffer(60, obs_space, act_space, "cpu", n_envs=2, n_steps=4, gamma=0.8)
    ours = ExpstoreReplayBuffer(60, obs_space, act_space, "cpu", n_envs=2, n_steps=4,
                                gamma=0.8, seed=0)
    # continuous streams per env (next obs = following obs unless the episode ended)
    args = stream(obs_space, act_space, 71, n_envs=2, episode=7)
    for i in range(len(args) - 1):
        o, nxt, a, r, d, inf = args[i]
        o = args[i - 1][1].copy() if i else o
        for e in range(2):
            if i and not args[i - 1][4][e]:
                o[e] = args[i - 1][1][e]
        args[i] = (o, nxt, a, r, d, inf)
    args = args[:-1]
    for a in args:
        ref.add(*a)
        ours.add(*a)
    inds = np.arange(30)
    for env in (0, 1):
        np.random.seed(5)
        # SB3 draws env indices with np.random: give both the same ones
        envs = np.full(len(inds), env)
        orig = np.random.randint
        np.random.randint = lambda *a, **k: envs  # noqa: B023
        try:
            want = ref._get_samples(inds)
        finally:
            np.random.randint = orig
        got = ours._mirror_samples(inds, envs, None, None)
        for f in ("observations", "next_observations", "actions", "dones"):
            np.testing.assert_array_equal(getattr(got, f).numpy(), getattr(want, f).numpy(), f)
        for f in ("rewards", "discounts"):
            np.testing.assert_allclose(getattr(got, f).numpy(), getattr(want, f).numpy(),
                                       rtol=1e-6, err_msg=f)
    ours.close()


def test_vecnormalize_normalizes_sampled_obs_and_rewards():
    venv = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0), gamma=0.9)
    obs_space, act_space = venv.observation_space, venv.action_space
    ref, ours = both(obs_space, act_space, 200, n_envs=2)
    obs = venv.reset()
    for _ in range(100):
        act = np.stack([act_space.sample() for _ in range(2)])
        nxt, rew, done, infos = venv.step(act)
        raw = (venv.get_original_obs(), venv.get_original_obs(), act,
               venv.get_original_reward(), done, infos)
        ref.add(*raw)
        ours.add(*raw)
        obs = nxt
    del obs
    inds = np.arange(100)
    envs = np.zeros(100, np.int64)
    got = ours._mirror_samples(inds, envs, None, venv)
    np.testing.assert_allclose(got.observations.numpy(),
                               venv.normalize_obs(ref.observations[inds, 0]), rtol=1e-5)
    np.testing.assert_allclose(got.rewards.numpy()[:, 0],
                               venv.normalize_reward(ref.rewards[inds, 0]), rtol=1e-5)
    ours.close()


# -- training: learning_starts=0, vector envs, n-step, Dict obs, PER ---------------------------
def test_sac_and_td3_train_from_learning_starts_zero(tmp_path):
    for algo in (SAC, TD3):
        model = algo("MlpPolicy", "Pendulum-v1", learning_starts=0, batch_size=8,
                     buffer_size=500, seed=0, replay_buffer_class=ExpstoreReplayBuffer,
                     replay_buffer_kwargs={"url": str(tmp_path / f"{algo.__name__}.zarr")},
                     policy_kwargs={"net_arch": [16]})
        model.learn(40)
        assert model.replay_buffer.size() == 40
        assert model._n_updates > 0
        model.replay_buffer.close()


def test_dqn_four_envs_n_step_dict_obs_learning_starts_zero(tmp_path):
    class SplitObs(gym.ObservationWrapper):  # works on gymnasium 0.29 and 1.x
        def __init__(self, env):
            super().__init__(env)
            box = spaces.Box(-np.inf, np.inf, (2,), np.float32)
            self.observation_space = spaces.Dict({"x": box, "v": box})

        def observation(self, o):
            return {"x": o[:2], "v": o[2:]}

    def make():
        return SplitObs(gym.make("CartPole-v1"))

    venv = make_vec_env(make, n_envs=4, seed=0)
    model = DQN("MultiInputPolicy", venv, learning_starts=0, batch_size=16, buffer_size=2000,
                train_freq=1, seed=0, replay_buffer_class=ExpstoreReplayBuffer,
                replay_buffer_kwargs={"url": str(tmp_path / "d.zarr"), "n_steps": 3})
    model.learn(400)
    buf = model.replay_buffer
    assert buf.size() == 100 and buf.n_envs == 4
    data = buf.sample(32)
    assert data.observations["x"].shape == (32, 2) and data.discounts.shape == (32, 1)
    buf.flush()
    assert all(int(buf.store.index.count[lane]) >= 99 for lane in range(4))
    buf.close()


def test_prioritized_buffer_on_the_mirror():
    obs_space, act_space = spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2)
    buf = PrioritizedExpstoreReplayBuffer(100, obs_space, act_space, "cpu", seed=0,
                                          alpha=1.0, beta=0.5)
    assert buf.mirrored
    for args in stream(obs_space, act_space, 150):
        buf.add(*args)
    data = buf.sample(64)
    assert (data.weights.numpy() == 1).all()  # every transition at the max priority
    target = int(data.index[0])
    buf.update_priorities(np.array([target]), np.array([1e4]), data.step_id[:1])
    hits = sum(int((buf.sample(64).index == target).sum()) for _ in range(10))
    assert hits > 300
    w = buf.sample(64).weights.numpy().ravel()
    p = buf._mirror.tree.get(buf.last_batch["index"])
    np.testing.assert_allclose(w, (p / buf._mirror.tree.min) ** -0.5, rtol=1e-5)
    # a transition rewritten since it was drawn keeps its new (max) priority
    stale = buf.sample(8)
    for args in stream(obs_space, act_space, 100, seed=1):
        buf.add(*args)
    assert buf._mirror.update_priorities(stale.index, np.zeros(8), stale.step_id) == 0
    buf.close()


def test_prioritized_dqn_trains_on_the_mirror(tmp_path):
    model = PrioritizedDQN("MlpPolicy", "CartPole-v1", buffer_size=2000, learning_starts=0,
                           batch_size=16, train_freq=4, seed=0,
                           replay_buffer_kwargs={"url": str(tmp_path / "p.zarr")})
    model.learn(600)
    tree = model.replay_buffer._mirror.tree
    assert len(np.unique(np.round(tree.get(np.arange(600)), 6))) > 50
    model.replay_buffer.close()


# -- capacity -----------------------------------------------------------------------------------
@pytest.mark.parametrize("episode,size", [(10, 1000), (200, 10_000)])
def test_holds_buffer_size_transitions(tmp_path, episode, size):
    obs_space, act_space = spaces.Box(-1, 1, (2,), np.float32), spaces.Discrete(2)
    buf = ExpstoreReplayBuffer(size, obs_space, act_space, url=tmp_path / "c.zarr")
    for args in stream(obs_space, act_space, 2 * size, episode=episode):
        buf.add(*args)
    assert buf.size() == size
    buf.flush()
    idx = buf.store.index
    lo, hi = int(idx.lower_bound()[0]), int(idx.count[0])
    rows = idx.lane_rows(0, np.arange(lo, hi))
    assert int(np.count_nonzero((idx.flags[rows] & FLAG_LAST) == 0)) >= size
    buf.close()


# -- save / load, copies --------------------------------------------------------------------------
def test_save_load_replay_buffer_with_a_temporary_store(tmp_path):
    model = DQN("MlpPolicy", "CartPole-v1", buffer_size=1000, learning_starts=1000, seed=0,
                replay_buffer_class=ExpstoreReplayBuffer)
    model.learn(300)
    model.save_replay_buffer(tmp_path / "rb.pkl")
    before = model.replay_buffer
    model2 = DQN("MlpPolicy", "CartPole-v1", buffer_size=1000, seed=1,
                 replay_buffer_class=ExpstoreReplayBuffer)
    model2.load_replay_buffer(tmp_path / "rb.pkl")
    after = model2.replay_buffer
    assert after.size() == before.size() == 300
    assert after.url != before.url  # its own store, written from the saved steps
    same = after._mirror.gather(np.arange(300), np.zeros(300, np.int64))
    want = before._mirror.gather(np.arange(300), np.zeros(300, np.int64))
    for k in ("obs", "next_obs", "action", "reward", "terminated"):
        np.testing.assert_array_equal(same[k], want[k])
    after.flush()
    assert len(after.store) >= 300
    before.close()
    after.close()


def test_load_raises_naming_a_missing_store(tmp_path):
    url = tmp_path / "kept.zarr"
    model = DQN("MlpPolicy", "CartPole-v1", buffer_size=1000, learning_starts=1000, seed=0,
                replay_buffer_class=ExpstoreReplayBuffer,
                replay_buffer_kwargs={"url": str(url)})
    model.learn(300)
    model.save_replay_buffer(tmp_path / "rb.pkl")
    model.replay_buffer.close()
    shutil.move(url, tmp_path / "moved.zarr")
    model2 = DQN("MlpPolicy", "CartPole-v1", buffer_size=1000, seed=1)
    with pytest.raises(FileNotFoundError, match="kept.zarr"):
        model2.load_replay_buffer(tmp_path / "rb.pkl")
    assert not url.exists()  # no new, empty store at the old path
    shutil.move(tmp_path / "moved.zarr", url)
    model2.load_replay_buffer(tmp_path / "rb.pkl")
    assert model2.replay_buffer.size() == 300
    model2.replay_buffer.close()


def test_a_copy_writes_its_own_store(tmp_path):
    obs_space, act_space = spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2)
    buf = ExpstoreReplayBuffer(500, obs_space, act_space, url=tmp_path / "orig.zarr")
    steps = stream(obs_space, act_space, 100)
    for args in steps[:50]:
        buf.add(*args)
    dup = copy.deepcopy(buf)
    assert dup.url != buf.url and dup.size() == 50
    for args in steps[50:]:
        buf.add(*args)
        dup.add(*args)
    buf.close()
    dup.flush()
    for url in (tmp_path / "orig.zarr", dup.url):  # each holds its 100 steps, no more
        store = es.open(url)
        rows = store.index.lane_rows(0, np.arange(int(store.index.count[0])))
        rows = rows[store.index.valid(rows, store.history, 1)]  # dup holds its newest step
        assert len(rows) == 100 if url != dup.url else 98 <= len(rows) <= 100
        t = store.transitions(rows)
        np.testing.assert_array_equal(t["obs"], np.concatenate([s[0] for s in steps])[:len(rows)])
        store.close()
    dup.close()
    store_path = tmp_path / "nomirror.zarr"
    big = ExpstoreReplayBuffer(100, obs_space, act_space, url=store_path, mirror=False)
    with pytest.raises(TypeError, match="another url"):
        copy.deepcopy(big)
    big.close()


def test_store_after_flush_holds_the_stream(tmp_path):
    """The background writer puts every added step in the store, in order, with SB3's
    done/timeout semantics."""
    obs_space, act_space = spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(3)
    buf = ExpstoreReplayBuffer(400, obs_space, act_space, url=tmp_path / "s.zarr", chunk=16)
    steps = stream(obs_space, act_space, 300)
    for args in steps:
        buf.add(*args)
    buf.close()
    store = es.open(tmp_path / "s.zarr")
    idx = store.index
    rows = idx.lane_rows(0, np.arange(int(idx.count[0])))
    rows = rows[(idx.flags[rows] & FLAG_LAST) == 0]
    assert len(rows) == 300
    t = store.transitions(rows)
    np.testing.assert_array_equal(t["obs"], np.concatenate([s[0] for s in steps]))
    np.testing.assert_array_equal(t["next_obs"], np.concatenate([s[1] for s in steps]))
    np.testing.assert_array_equal(t["action"], np.concatenate([s[2] for s in steps]))
    timeout = np.array([s[5][0]["TimeLimit.truncated"] for s in steps])
    done = np.concatenate([s[4] for s in steps])
    np.testing.assert_array_equal(t["terminated"], done & ~timeout)
    store.close()


def test_a_buffer_on_an_existing_store_starts_with_its_transitions(tmp_path):
    obs_space, act_space = spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2)
    steps = stream(obs_space, act_space, 60)
    first = ExpstoreReplayBuffer(40, obs_space, act_space, url=tmp_path / "r.zarr")
    for args in steps:
        first.add(*args)
    oldest_first = (first.pos + np.arange(40)) % 40
    want = first._mirror.gather(oldest_first, np.zeros(40, np.int64))
    first.close()
    again = ExpstoreReplayBuffer(40, obs_space, act_space, url=tmp_path / "r.zarr")
    assert (again.size(), again.full, again.pos) == (40, True, 0)
    got = again._mirror.gather(np.arange(40), np.zeros(40, np.int64))
    for k in ("obs", "next_obs", "action", "reward", "terminated"):
        np.testing.assert_array_equal(got[k], want[k], k)
    again.close()
