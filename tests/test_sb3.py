"""SB3 drop-in buffer: real SB3 DQN/SAC training writes exactly what SB3 added, and samples
are transitions SB3 added (with SB3's done/timeout semantics)."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")
from stable_baselines3 import DQN, SAC  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402

import expstore as es  # noqa: E402
from expstore.integrations import (  # noqa: E402
    ExpstoreReplayBuffer,
    PrioritizedDQN,
    PrioritizedExpstoreReplayBuffer,
)
from expstore.rows import FLAG_LAST, FLAG_TERMINATED, FLAG_TRUNCATED  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny MLPs: threads only contend on a 2-core machine
    yield
    torch.set_num_threads(n)


class Recording:
    """Mixin keeping a copy of every ``add`` call SB3 makes (not pickled)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls = []

    def add(self, obs, next_obs, action, reward, done, infos):
        self.calls.append(copy.deepcopy((obs, next_obs, action, reward, done,
                                         [{"TimeLimit.truncated":
                                           i.get("TimeLimit.truncated", False)}
                                          for i in infos])))
        super().add(obs, next_obs, action, reward, done, infos)

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("calls", None)
        return state


class RecordingBuffer(Recording, ExpstoreReplayBuffer):
    pass


def written(buf, lane=0):
    """Add calls the store holds for ``lane`` (the newest step may still be held)."""
    return len(buf.calls) - (buf.writer.held[lane] is not None)


def expected_rows(calls, lane, written):
    """Rows lane ``lane`` should hold for the first ``written`` add calls (plain model).

    A step is followed by a final row (holding its next obs) when it ended the episode,
    when SB3's next step did not continue it, or when it is the last written step and
    ``written`` covers every call (the buffer was closed).
    """
    rows = []
    for t in range(written):
        obs, nxt, act, rew, done, infos = calls[t]
        timeout = bool(infos[lane]["TimeLimit.truncated"]) and bool(done[lane])
        term = bool(done[lane]) and not timeout
        cont = t + 1 < len(calls) and np.array_equal(calls[t + 1][0][lane], nxt[lane])
        trunc = timeout or (not term and not cont)
        rows.append(dict(obs=obs[lane], action=np.ravel(act[lane]), reward=rew[lane],
                         term=term, trunc=trunc, next_obs=nxt[lane], step=t))
        if term or trunc:
            rows.append(dict(obs=nxt[lane], final=True))
    return rows


def check_lane(store, lane, rows):
    """The lane's intact rows equal the tail of ``rows``."""
    idx = store.index
    lo, hi = int(idx.lower_bound()[lane]), int(idx.count[lane])
    assert hi == len(rows), (hi, len(rows))
    assert lo < hi
    steps = np.arange(lo, hi)
    r = idx.lane_rows(lane, steps)
    obs, act, rew = store.read("obs", r), store.read("action", r), store.read("reward", r)
    flags = store.read("_flags", r)
    for j, s in enumerate(steps):
        e = rows[s]
        np.testing.assert_array_equal(obs[j], e["obs"])
        if e.get("final"):
            assert flags[j] & FLAG_LAST
            continue
        assert not flags[j] & FLAG_LAST
        np.testing.assert_array_equal(np.ravel(act[j]), e["action"])
        assert rew[j] == np.float32(e["reward"])
        assert bool(flags[j] & FLAG_TERMINATED) == e["term"], s
        assert bool(flags[j] & FLAG_TRUNCATED) == e["trunc"], s
    return r


def check_samples(buf, calls, rows_by_lane, n=256):
    """Sampled tensors are transitions SB3 added, with dones = terminations."""
    data = buf.sample(n)
    L = buf.store.layout.lane_capacity
    assert data.observations.shape == (n, *buf.obs_shape)
    assert data.actions.shape == (n, buf.action_dim) and data.rewards.shape == (n, 1)
    assert data.dones.shape == (n, 1) and data.weights.shape == (n, 1)
    for k in range(n):
        if int(data.index[k]) == -1:  # a step the store cannot serve yet, dealt from RAM
            recent = [(c[0][e], c[1][e], c[2][e], c[3][e]) for c in calls[-2:]
                      for e in range(len(c[0]))]
            assert any(np.allclose(data.observations[k].numpy(), o)
                       and np.allclose(data.next_observations[k].numpy(), nx)
                       and np.array_equal(data.actions[k].numpy(), np.ravel(a))
                       and data.rewards[k, 0].item() == pytest.approx(float(r))
                       for o, nx, a, r in recent)
            assert data.dones[k, 0].item() == 0.0 and int(data.step_id[k]) == -1
            continue
        lane, step = divmod(int(data.index[k]), L)[0], int(data.step_id[k])
        e = rows_by_lane[lane][step]
        assert not e.get("final")
        np.testing.assert_allclose(data.observations[k].numpy(), e["obs"])
        np.testing.assert_allclose(data.next_observations[k].numpy(), e["next_obs"])
        np.testing.assert_array_equal(data.actions[k].numpy(), e["action"])
        assert data.rewards[k, 0].item() == pytest.approx(float(e["reward"]))
        assert data.dones[k, 0].item() == float(e["term"])
    return data


@pytest.mark.filterwarnings("ignore:The last trajectory in the replay buffer")
def test_dqn_cartpole_buffer_holds_what_sb3_added(tmp_path):
    url = tmp_path / "dqn.zarr"
    # optimize_memory_usage with handle_timeout_termination: SB3's own buffer refuses this
    model = DQN("MlpPolicy", "CartPole-v1", buffer_size=10_000, learning_starts=500,
                train_freq=5, seed=0, optimize_memory_usage=True,
                replay_buffer_class=RecordingBuffer,
                replay_buffer_kwargs={"url": str(url), "mirror": False})
    model.learn(2500)
    # SB3's load() rebuilds the buffer from the saved kwargs (same url): it must not take
    # the store's write lease from the buffer still training
    model.save(tmp_path / "model")
    loaded = DQN.load(tmp_path / "model")
    assert loaded.replay_buffer._store is None
    model.replay_buffer.flush()  # steps staged in RAM reach the store
    assert model.replay_buffer.writer.held[0] is not None  # an episode is open
    # a second learn() resets the env mid-episode: the cut step must end truncated
    model.learn(500, reset_num_timesteps=True)
    buf = model.replay_buffer
    buf.flush()
    calls = buf.calls
    assert len(calls) >= 3000
    assert buf.writer.breaks >= 1
    rows = expected_rows(calls, 0, written(buf))  # the newest step may still be held
    check_lane(buf.store, 0, rows)
    check_samples(buf, calls, {0: rows})
    assert buf.size() == len(calls)  # the newest step (held for the store) included
    n_rows = len(buf.store)

    # save/load through SB3: the held step is written (truncated), rows flushed
    model.save_replay_buffer(tmp_path / "rb.pkl")
    assert (tmp_path / "rb.pkl").stat().st_size < 50_000
    buf.close()
    reader = es.open(url)
    check_lane(reader, 0, expected_rows(calls, 0, len(calls)))
    assert len(reader) == n_rows + 2
    reader.close()

    model2 = DQN("MlpPolicy", "CartPole-v1", buffer_size=10_000, seed=1)
    model2.load_replay_buffer(tmp_path / "rb.pkl")
    assert isinstance(model2.replay_buffer, ExpstoreReplayBuffer)
    assert len(model2.replay_buffer.store) == n_rows + 2


def test_two_envs_one_lane_each_with_wraparound(tmp_path):
    env = make_vec_env("CartPole-v1", n_envs=2, seed=3)
    model = DQN("MlpPolicy", env, buffer_size=1024, learning_starts=200, train_freq=8,
                seed=3, replay_buffer_class=RecordingBuffer,
                replay_buffer_kwargs={"url": str(tmp_path / "vec.zarr"), "shard_rows": 64,
                                      "mirror": False})
    model.learn(2400)
    buf = model.replay_buffer
    buf.flush()  # steps staged in RAM reach the store
    assert buf.store.lanes == 2 and buf.n_envs == 2
    # 1.5 x buffer_size rows (+16 per lane) and a shard per lane, rounded up to whole
    # shards: 1536 + 32 + 128 -> 1792
    assert buf.store.capacity == 1792 and buf.full
    rows_by_lane = {}
    for lane in (0, 1):
        rows_by_lane[lane] = expected_rows(buf.calls, lane, written(buf, lane))
        assert len(rows_by_lane[lane]) > buf.store.layout.lane_capacity  # wrapped around
        check_lane(buf.store, lane, rows_by_lane[lane])
    check_samples(buf, buf.calls, rows_by_lane)
    buf.close()


def test_timeouts_bootstrap_and_handle_timeout_false_means_done(tmp_path):
    """SB3 marks TimeLimit truncation in infos: stored truncated, sampled done=0."""
    import gymnasium as gym

    env = make_vec_env(lambda: gym.wrappers.TimeLimit(gym.make("CartPole-v1").unwrapped, 15),
                       n_envs=1)
    for handle, want_done in ((True, 0.0), (False, 1.0)):
        buf = ExpstoreReplayBuffer(400, env.observation_space, env.action_space,
                                   handle_timeout_termination=handle,
                                   url=tmp_path / f"t{handle}.zarr", seed=0, mirror=False)
        obs = env.reset()
        timeouts = 0
        for _ in range(300):
            act = np.array([env.action_space.sample()])
            nxt, rew, done, infos = env.step(act)
            real = nxt.copy()
            if done[0]:
                real[0] = infos[0]["terminal_observation"]
                timeouts += infos[0]["TimeLimit.truncated"]
            buf.add(obs, real, act, rew, done, infos)
            obs = nxt
        assert timeouts > 3
        buf.flush()  # steps staged in RAM reach the store
        b = buf.store.sample(300, rng=np.random.default_rng(0))
        trunc = b["truncated"]
        assert trunc.any() == handle
        data = buf._get_samples(b["index"])
        if handle:  # timeouts bootstrap (done 0) and terminations do not
            assert (data.dones.numpy()[trunc] == want_done).all()
            assert (data.dones.numpy()[b["terminated"]] == 1.0).all()
        else:  # SB3 semantics: a timeout done without the flag is a termination
            assert b["terminated"].sum() > 3
        buf.close()


def test_sac_stores_scaled_actions(tmp_path):
    model = SAC("MlpPolicy", "Pendulum-v1", buffer_size=2000, learning_starts=200,
                batch_size=64, seed=0, replay_buffer_class=RecordingBuffer,
                replay_buffer_kwargs={"url": str(tmp_path / "sac.zarr"), "mirror": False},
                policy_kwargs={"net_arch": [32, 32]})
    model.learn(300)
    buf = model.replay_buffer
    buf.flush()  # steps staged in RAM reach the store
    rows = expected_rows(buf.calls, 0, written(buf))
    check_lane(buf.store, 0, rows)
    data = check_samples(buf, buf.calls, {0: rows}, n=64)
    assert data.actions.dtype == torch.float32
    assert np.abs(buf.store.read("action", np.arange(300))).max() <= 1.0  # scaled to [-1, 1]
    assert buf.store.episodes_written == 1  # Pendulum: 200-step episodes end truncated (timeout)
    assert buf.store.read("_flags", np.array([199]))[0] & FLAG_TRUNCATED
    buf.close()


def test_prioritized_dqn_feeds_td_errors_back(tmp_path):
    model = PrioritizedDQN("MlpPolicy", "CartPole-v1", buffer_size=5000, learning_starts=300,
                           train_freq=8, seed=0, beta_final=1.0,
                           replay_buffer_kwargs={"url": str(tmp_path / "per.zarr"),
                                                 "alpha": 0.6, "beta": 0.4, "mirror": False,
                                                 "prefetch": False})
    assert isinstance(model.replay_buffer, PrioritizedExpstoreReplayBuffer)
    model.learn(1500)
    buf = model.replay_buffer
    buf.flush()  # steps staged in RAM reach the store
    prio = buf.sampler.priorities
    rows = np.flatnonzero(buf.store.index.flags[:len(buf.store)] & FLAG_LAST == 0)[:-1]
    p = prio.get(rows)
    assert len(np.unique(np.round(p, 6))) > 50  # TD errors were written back per row
    beta_end = buf.sampler.beta
    assert 0.4 < beta_end <= 1.0  # annealed with training progress
    model._current_progress_remaining = -0.02  # rollouts overshoot total_timesteps
    model.train(gradient_steps=1, batch_size=32)
    assert buf.sampler.beta == 1.0
    beta = buf.sampler.beta
    data = buf.sample(64)
    stored = data.index >= 0  # -1: the newest step, dealt from RAM
    w = data.weights.numpy().ravel()
    want = (prio.get(data.index[stored]) / prio.min_priority) ** -beta  # (N P(i))^-beta
    np.testing.assert_allclose(w[stored], want, rtol=1e-5)
    assert w.max() <= 1.0 and w.min() < w.max()
    # priorities follow |TD error|: a row given a huge error is then drawn far more often
    target = int(rows[10])
    buf.update_priorities(np.array([target]), np.array([1e4]))
    hits = sum(int((buf.sample(64).index == target).sum()) for _ in range(20))
    assert hits > 100
    with pytest.raises(TypeError, match="expstore buffer"):
        PrioritizedDQN("MlpPolicy", "CartPole-v1", replay_buffer_class=None)
    buf.close()


def test_pickle_writes_held_steps_and_reopens(tmp_path):
    import gymnasium as gym

    space = gym.spaces.Box(-1, 1, (3,), np.float32)
    buf = ExpstoreReplayBuffer(256, space, gym.spaces.Discrete(2), url=tmp_path / "p.zarr",
                               mirror=False)
    o = np.zeros((1, 3), np.float32)
    for t in range(10):
        buf.add(o + t, o + t + 1, np.array([t % 2]), np.array([1.0]), np.array([False]), [{}])
    buf.flush()  # steps staged in RAM reach the store
    assert len(buf.store) == 9 and buf.writer.held[0] is not None
    blob = pickle.dumps(buf)
    assert len(blob) < 20_000
    assert len(buf.store) == 11 and buf.writer.held[0] is None  # step 9 + its final row
    buf.close()
    buf2 = pickle.loads(blob)
    assert len(buf2.store) == 11
    buf2.add(o + 10, o + 11, np.array([0]), np.array([1.0]), np.array([True]), [{}])
    buf2.close()  # writes step 10 (terminated) and its final row
    r = es.open(tmp_path / "p.zarr")
    assert len(r) == 13
    np.testing.assert_array_equal(r.read("obs", np.arange(13))[:, 0],
                                  list(range(11)) + [10, 11])
    flags = r.read("_flags", np.arange(13))
    assert flags[9] & FLAG_TRUNCATED and flags[10] & FLAG_LAST
    assert flags[11] & FLAG_TERMINATED and flags[12] & FLAG_LAST
    r.close()
    buf3 = pickle.loads(blob)
    buf3.reset()  # SB3's reset() empties the buffer: the store is recreated
    assert len(buf3.store) == 0 and buf3.size() == 0 and not buf3.full
    assert len(es.open(tmp_path / "p.zarr")) == 0
    buf3.close()


def test_atari_frame_stack_stores_one_frame_per_row(tmp_path):
    """DQN on real ALE Pong with VecFrameStack(4): rows hold single 84x84 frames, and
    sampled stacks equal the (4, 84, 84) observations SB3 added."""
    pytest.importorskip("ale_py")
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_atari_env

    if "PongNoFrameskip-v4" not in gym.registry:
        pytest.skip("ALE environments are not registered with this gymnasium")
    from stable_baselines3.common.vec_env import VecFrameStack, VecTransposeImage

    env = VecTransposeImage(VecFrameStack(make_atari_env("PongNoFrameskip-v4", n_envs=1,
                                                         seed=0), 4))
    model = DQN("CnnPolicy", env, buffer_size=4096, learning_starts=10_000, seed=0,
                replay_buffer_class=RecordingBuffer,
                replay_buffer_kwargs={"url": str(tmp_path / "pong.zarr"), "frame_stack": 4})
    model.learn(400)  # collection only (random actions before learning_starts)
    buf = model.replay_buffer
    assert buf.store.spec.fields["obs"].shape == (84, 84)
    assert buf.store.spec.fields["obs"].stack == 4
    rows = [dict(e) for e in expected_rows(buf.calls, 0, written(buf))]
    first = buf._get_samples(np.arange(6))  # zero-padded stacks at the episode start
    assert (first.observations[0, :3] == 0).all()
    for k in range(6):
        np.testing.assert_array_equal(first.observations[k].numpy(), rows[k]["obs"])
    data = buf.sample(64)
    assert data.observations.shape == (64, 4, 84, 84)
    for k in range(64):
        e = rows[int(data.step_id[k])]
        np.testing.assert_array_equal(data.observations[k].numpy(), e["obs"])
        np.testing.assert_array_equal(data.next_observations[k].numpy(), e["next_obs"])
    # a stack that does not shift by one frame is refused before anything is stored
    obs = buf.calls[-1][1]
    bad = obs.copy()
    bad[:, 0] = 255 - bad[:, 0]
    n = len(buf.store)
    with pytest.raises(es.ValidationError, match="frame_stack"):
        buf.add(obs, bad, np.array([0]), np.array([0.0]), np.array([False]), [{}])
    assert len(buf.store) == n
    buf.close()


def test_cleanrl_style_loop(tmp_path):
    """CleanRL builds SB3's buffer itself and passes ``done=terminations`` with
    ``real_next_obs`` (final obs of truncated envs): truncations are recovered from the
    broken continuity, stored truncated with their final obs, and sampled as not done."""
    import gymnasium as gym
    from gymnasium import vector

    make = [lambda: gym.make("CartPole-v1", max_episode_steps=20)] * 2
    if hasattr(vector, "AutoresetMode"):  # gymnasium 1.x
        envs = vector.SyncVectorEnv(make, autoreset_mode=vector.AutoresetMode.SAME_STEP)
        final_key = "final_obs"
    else:  # gymnasium 0.29 (CleanRL's pin): same-step autoreset, "final_observation"
        envs = vector.SyncVectorEnv(make)
        final_key = "final_observation"
    rb = ExpstoreReplayBuffer(2048, envs.single_observation_space, envs.single_action_space,
                              "cpu", n_envs=2, handle_timeout_termination=False,
                              url=tmp_path / "clean.zarr", seed=0)
    obs, _ = envs.reset(seed=0)
    envs.action_space.seed(0)
    n_term, n_trunc = np.zeros(2, int), np.zeros(2, int)
    for _ in range(300):
        actions = envs.action_space.sample()
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        real_next_obs = next_obs.copy()
        for idx, trunc in enumerate(truncations):
            if trunc:
                real_next_obs[idx] = infos[final_key][idx]
        rb.add(obs, real_next_obs, actions, rewards, terminations, infos)
        n_term += terminations
        n_trunc += truncations & ~terminations
        open_at_end = ~(terminations | truncations)
        obs = next_obs
    assert n_trunc.min() >= 3
    rb.close()
    store = es.open(tmp_path / "clean.zarr")
    for lane in range(2):
        rows = store.index.lane_rows(lane, np.arange(int(store.index.count[lane])))
        flags = store.read("_flags", rows)
        assert int(((flags & FLAG_TERMINATED) > 0).sum()) == n_term[lane]
        # + the episode still open when the buffer was closed
        assert int(((flags & FLAG_TRUNCATED) > 0).sum()) == n_trunc[lane] + open_at_end[lane]
    b = store.sample(512, rng=np.random.default_rng(0))
    assert b["truncated"].any() and b["terminated"].any()
    np.testing.assert_array_equal(b["next_obs"][b["truncated"]][:, 0] != 0, True)


@pytest.mark.parametrize("mirror", [True, False])
def test_dict_and_discrete_spaces_match_sb3_dict_buffer(tmp_path, mirror):
    """Same stream into SB3's DictReplayBuffer and ours: same tensors for the same steps."""
    import gymnasium as gym
    from stable_baselines3.common.buffers import DictReplayBuffer

    obs_space = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (3,), np.float32),
                                 "room": gym.spaces.Discrete(5)})
    act_space = gym.spaces.MultiDiscrete([3, 4])
    ref = DictReplayBuffer(200, obs_space, act_space, "cpu", n_envs=1)
    buf = ExpstoreReplayBuffer(200, obs_space, act_space, "cpu", url=tmp_path / "dict.zarr",
                               mirror=mirror)
    rng = np.random.default_rng(0)
    o = {"pos": rng.uniform(-1, 1, (1, 3)).astype(np.float32), "room": np.array([0])}
    row_of_step, row = [], 0
    for t in range(120):
        n = {"pos": rng.uniform(-1, 1, (1, 3)).astype(np.float32),
             "room": np.array([t % 5])}
        a = np.array([[t % 3, t % 4]])
        done = np.array([t % 17 == 16])
        for b in (ref, buf):
            b.add(o, n, a, np.array([0.5 * t]), done, [{}])
        row_of_step.append(row)
        row += 1 + int(done[0])
        o = n
    steps = np.arange(0, 110, 7)
    buf.flush()  # steps staged in RAM reach the store
    want = ref._get_samples(steps)
    got = buf._get_samples(steps if mirror else np.array(row_of_step)[steps])
    for k in ("pos", "room"):
        assert got.observations[k].shape == want.observations[k].shape
        np.testing.assert_array_equal(got.observations[k].numpy(), want.observations[k].numpy())
        np.testing.assert_array_equal(got.next_observations[k].numpy(),
                                      want.next_observations[k].numpy())
    np.testing.assert_array_equal(got.actions.numpy(), want.actions.numpy())
    np.testing.assert_array_equal(got.rewards.numpy(), want.rewards.numpy())
    np.testing.assert_array_equal(got.dones.numpy(), want.dones.numpy())
    buf.close()


@pytest.mark.parametrize("mirror", [True, False])
def test_n_step_matches_sb3_nstep_buffer(tmp_path, mirror):
    """n_steps=3: same returns, next obs, dones and discounts as SB3's NStepReplayBuffer,
    across terminations and timeouts."""
    import gymnasium as gym
    from stable_baselines3.common.buffers import NStepReplayBuffer

    space = gym.spaces.Box(-100, 100, (2,), np.float32)
    act = gym.spaces.Discrete(2)
    ref = NStepReplayBuffer(400, space, act, "cpu", n_steps=3, gamma=0.9)
    buf = ExpstoreReplayBuffer(400, space, act, "cpu", url=tmp_path / "n.zarr", n_steps=3,
                               gamma=0.9, mirror=mirror)
    o = np.zeros((1, 2), np.float32)
    row_of_step, row = [], 0
    for t in range(150):
        n = np.full((1, 2), t + 1, np.float32)
        end = t % 13 == 12
        info = [{"TimeLimit.truncated": end and t % 26 == 25}]
        for b in (ref, buf):
            b.add(o, n, np.array([t % 2]), np.array([1.0 + t]), np.array([end]), info)
        row_of_step.append(row)
        row += 1 + end
        o = n if not end else np.full((1, 2), -(t + 1), np.float32)
    steps = np.arange(0, 140)
    buf.flush()  # steps staged in RAM reach the store
    want = ref._get_samples(steps)
    got = buf._get_samples(steps if mirror else np.array(row_of_step)[steps])
    for f in ("observations", "next_observations", "actions", "dones"):
        np.testing.assert_array_equal(getattr(got, f).numpy(), getattr(want, f).numpy(), f)
    for f in ("rewards", "discounts"):
        np.testing.assert_allclose(getattr(got, f).numpy(), getattr(want, f).numpy(),
                                   rtol=1e-6, err_msg=f)
    assert (want.dones.numpy() == 1).any() and (want.discounts.numpy() > 0.9 ** 3 + 1e-6).any()
    buf.close()
