"""SB3's buffer arrays on ExpstoreReplayBuffer (``observations``, ``actions``, ``rewards``,
``timeouts``, ``dones``), time-limit flags without ``done``, and the sampling bound from
``pos``/``full``: what SB3's own tests read (``tests/test_sb3_upstream.py`` runs those;
these checks run without SB3's sdist), each against SB3's real buffer on the same steps."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

pytest.importorskip("stable_baselines3")
from stable_baselines3.common.buffers import (  # noqa: E402
    DictReplayBuffer,
    NStepReplayBuffer,
    ReplayBuffer,
)

from expstore.integrations.sb3 import ExpstoreReplayBuffer  # noqa: E402

N_ENVS = 2


def _stream(obs_space: spaces.Space, action_space: spaces.Space, steps: int, seed: int = 0):
    """``steps`` SB3-style adds for ``N_ENVS`` envs: a termination in env 0 at step 3, a
    time limit in env 1 at step 5 (``done`` with ``TimeLimit.truncated``)."""
    rng = np.random.default_rng(seed)
    obs_space.seed(seed)
    action_space.seed(seed)

    def batch(space):
        if isinstance(space, spaces.Dict):
            return {k: np.stack([s.sample() for _ in range(N_ENVS)]) for k, s in space.items()}
        return np.stack([space.sample() for _ in range(N_ENVS)])

    obs = batch(obs_space)
    for t in range(steps):
        next_obs = batch(obs_space)
        action = batch(action_space)
        reward = rng.normal(size=N_ENVS).astype(np.float32)
        done = np.array([t == 3, t == 5])
        infos = [{}, {"TimeLimit.truncated": t == 5}]
        yield obs, next_obs, action, reward, done, infos
        obs = next_obs


def _pair(sb3_cls, obs_space, action_space, size=8, **kw):
    ref = sb3_cls(size, obs_space, action_space, device="cpu", n_envs=N_ENVS, **kw)
    ours = ExpstoreReplayBuffer(size, obs_space, action_space, device="cpu", n_envs=N_ENVS,
                                **kw)
    return ref, ours


@pytest.mark.parametrize("action_space", [spaces.Discrete(4),
                                          spaces.Box(-1, 1, (2, 3), np.float64)],
                         ids=["discrete", "box-float64"])
@pytest.mark.parametrize("steps", [5, 11], ids=["partial", "wrapped"])
def test_arrays_equal_sb3s(action_space: spaces.Space, steps: int) -> None:
    obs_space = spaces.Box(-5, 5, (3,), np.float32)
    ref, ours = _pair(ReplayBuffer, obs_space, action_space)
    for step in _stream(obs_space, action_space, steps):
        ref.add(*step)
        ours.add(*step)
    for name in ("observations", "next_observations", "actions", "rewards"):
        a, b = getattr(ref, name), getattr(ours, name)
        assert b.shape == a.shape and b.dtype == a.dtype, name
        np.testing.assert_array_equal(b, a, err_msg=name)
    np.testing.assert_array_equal(ours.timeouts, ref.timeouts.astype(bool))
    np.testing.assert_array_equal(np.asarray(ours.dones), ref.dones)
    assert np.asarray(ours.dones).dtype == np.float32 and len(ours.dones) == len(ref.dones)
    ours.close()


def test_dict_observations_equal_sb3s() -> None:
    obs_space = spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32),
                             "img": spaces.Box(0, 255, (3, 4), np.uint8)})
    action_space = spaces.Box(-1, 1, (2,), np.float32)
    ref, ours = _pair(DictReplayBuffer, obs_space, action_space)
    for step in _stream(obs_space, action_space, 6):
        ref.add(*step)
        ours.add(*step)
    for name in ("observations", "next_observations"):
        a, b = getattr(ref, name), getattr(ours, name)
        assert set(b) == set(a)
        for key in a:
            assert b[key].dtype == a[key].dtype
            np.testing.assert_array_equal(b[key], a[key], err_msg=f"{name}[{key}]")
    ours.close()


def test_extend_from_arrays_copies_a_buffer() -> None:
    """SB3's ``extend(observations, ..., dones, infos)`` from another buffer's arrays."""
    obs_space, action_space = spaces.Box(-5, 5, (3,), np.float32), spaces.Discrete(3)
    _, src = _pair(ReplayBuffer, obs_space, action_space)
    for step in _stream(obs_space, action_space, 8):
        src.add(*step)
    dst = ExpstoreReplayBuffer(8, obs_space, action_space, device="cpu", n_envs=N_ENVS)
    infos = [[{"TimeLimit.truncated": t} for t in row] for row in src.timeouts]
    dst.extend(src.observations, src.next_observations, src.actions, src.rewards,
               src.dones, infos)
    for name in ("observations", "next_observations", "actions", "rewards", "timeouts"):
        np.testing.assert_array_equal(getattr(dst, name), getattr(src, name), err_msg=name)
    np.testing.assert_array_equal(np.asarray(dst.dones), np.asarray(src.dones))
    src.close()
    dst.close()


def _fill(buffer, length: int, truncated_at: int) -> None:
    """SB3's n-step test stream: obs = step, reward 1, ``TimeLimit.truncated`` at one step
    with ``done`` left 0."""
    for i in range(length):
        buffer.add(np.full((1, 4), i, np.float32), np.full((1, 4), i + 1, np.float32),
                   np.zeros((1, 2), np.float32), np.array([1.0]), np.array([0.0]),
                   [{"TimeLimit.truncated": i == truncated_at}])


@pytest.mark.parametrize("truncated_at", [1, 2])
def test_time_limit_without_done_ends_nstep_as_sb3(truncated_at: int) -> None:
    box4, box2 = spaces.Box(0, 1, (4,), np.float32), spaces.Box(0, 1, (2,), np.float32)
    ref = NStepReplayBuffer(10, box4, box2, device="cpu", n_steps=5, gamma=0.9)
    ours = ExpstoreReplayBuffer(10, box4, box2, device="cpu", n_steps=5, gamma=0.9)
    _fill(ref, 10, truncated_at)
    _fill(ours, 10, truncated_at)
    for base in range(4):
        a = ref._get_samples(np.array([base]))
        b = ours._get_samples(np.array([base]))
        for name in ("rewards", "discounts", "dones"):
            np.testing.assert_allclose(getattr(b, name).numpy(), getattr(a, name).numpy(),
                                       rtol=1e-6, err_msg=f"{name} at {base}")
        np.testing.assert_array_equal(b.next_observations.numpy(), a.next_observations.numpy())
    np.testing.assert_array_equal(ours.timeouts, ref.timeouts.astype(bool))
    ours.close()


def test_sample_bound_follows_pos_and_full() -> None:
    """As SB3's: ``full`` (set by hand too) lets ``sample`` draw from the whole buffer."""
    space = spaces.Box(0, 100, (2,), np.int16)
    ours = ExpstoreReplayBuffer(1, space, spaces.Discrete(3), device="cpu")
    with pytest.raises(Exception, match="empty"):
        ours.sample(4)
    ours.full = True
    batch = ours.sample(4)
    assert batch.observations.shape == (4, 2)
    assert batch.observations.numpy().dtype == np.int16
    assert int(batch.observations.abs().sum()) == 0
    ours.close()


def test_store_sampled_buffer_has_no_arrays() -> None:
    ours = ExpstoreReplayBuffer(8, spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2),
                                device="cpu", mirror=False)
    for name in ("observations", "next_observations", "actions", "rewards", "timeouts"):
        assert not hasattr(ours, name)
        with pytest.raises(AttributeError, match=f"{name}: .*mirror=False"):
            getattr(ours, name)
    with pytest.raises(TypeError, match="dones: .*mirror=False"):
        np.asarray(ours.dones)
    ours.close()
