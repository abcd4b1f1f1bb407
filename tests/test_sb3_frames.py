"""Frame-stacked observations in the SB3 buffer's RAM mirror: one frame of ``obs`` and one
of ``next_obs`` per step, and sampled stacks equal to the ones added, across episode
starts (zero padded or not), several envs, n-step returns, ring wrap-around, pickling."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from gymnasium import spaces

import expstore as es
from expstore.integrations.sb3 import ExpstoreReplayBuffer

K, H, W = 4, 6, 5


def stacked_stream(n_envs: int, steps: int, seed: int, pad: str):
    """(obs, next_obs, action, reward, done, infos) per step, as VecFrameStack hands them:
    channel-first stacks, newest frame last; a new episode's stack is zero padded
    (``pad="zero"``) or repeats its first frame (``pad="repeat"``, gym's FrameStack)."""
    rng = np.random.default_rng(seed)

    def fresh():
        f = rng.integers(1, 255, (H, W), dtype=np.uint8)
        s = np.zeros((K, H, W), np.uint8) if pad == "zero" else np.repeat(f[None], K, 0)
        s[-1] = f
        return s

    stacks = [fresh() for _ in range(n_envs)]
    for _ in range(steps):
        obs = np.stack(stacks)
        nxt = np.stack([np.concatenate([s[1:], rng.integers(0, 255, (1, H, W), np.uint8)])
                        for s in stacks])
        done = rng.random(n_envs) < 0.15  # short episodes, some shorter than the stack
        yield (obs, nxt, rng.integers(0, 3, (n_envs, 1)), rng.random(n_envs).astype(np.float32),
               done, [{} for _ in range(n_envs)])
        stacks = [fresh() if done[e] else nxt[e] for e in range(n_envs)]


def make(size: int, n_envs: int, **kw) -> ExpstoreReplayBuffer:
    return ExpstoreReplayBuffer(size, spaces.Box(0, 255, (K, H, W), np.uint8),
                                spaces.Discrete(3), device="cpu", n_envs=n_envs,
                                frame_stack=K, seed=0, **kw)


def check_all_slots(buf: ExpstoreReplayBuffer, added: list, n_steps: int = 1) -> None:
    m = buf._mirror
    filled = m.filled()
    inds = np.repeat(np.arange(filled), buf.n_envs)
    envs = np.tile(np.arange(buf.n_envs), filled)
    b = m.gather(inds, envs, n_steps, 0.9)
    for i, (pos, e) in enumerate(zip(inds, envs, strict=True)):
        step = int(m.step_at[pos])
        np.testing.assert_array_equal(b["obs"][i], added[step][0][e])
        horizon = 1 if n_steps == 1 else int(b["horizon"][i])
        np.testing.assert_array_equal(b["next_obs"][i], added[step + horizon - 1][1][e])


@pytest.mark.parametrize("pad", ["zero", "repeat"])
@pytest.mark.parametrize("n_envs", [1, 3])
def test_sampled_stacks_equal_added_ones_and_ram_holds_two_frames_per_step(tmp_path, pad,
                                                                          n_envs):
    size = 40
    buf = make(size, n_envs, url=tmp_path / "s.zarr", chunk=16)
    added = []
    for step in stacked_stream(n_envs, 3 * size + 7, seed=n_envs, pad=pad):  # wraps around
        buf.add(*step)
        added.append(step)
        if len(added) in (5, size - 1, 2 * size + 3):
            check_all_slots(buf, added)
    check_all_slots(buf, added)
    frame = H * W
    # the ring: two frames per step and env (plus stack - 1 + 1 spare rows), not 2 x K
    per_env = buf.buffer_size  # steps per env
    assert buf._mirror.nbytes <= (2 * per_env + K) * n_envs * frame + 64 * per_env * n_envs
    data = buf.sample(32)
    assert tuple(data.observations.shape) == (32, K, H, W)
    # the store holds one frame per row, the newest frame of each added obs
    buf.flush()
    assert buf.store.spec.fields["obs"].shape == (H, W)
    buf.close()


def test_n_step_stacks_stop_where_the_stream_breaks(tmp_path):
    buf = make(60, 2, url=tmp_path / "n.zarr", n_steps=3, gamma=0.9)
    added = []
    for step in stacked_stream(2, 90, seed=5, pad="zero"):
        buf.add(*step)
        added.append(step)
    check_all_slots(buf, added, n_steps=3)
    buf.close()


def test_a_stream_reset_without_done_starts_a_new_stack(tmp_path):
    """SB3 resets envs between learn() calls: the next obs does not continue the held
    next_obs, so the stack is not rebuilt from the earlier frames."""
    buf = make(30, 1, url=tmp_path / "r.zarr")
    added = []
    gen = stacked_stream(1, 12, seed=9, pad="repeat")
    for step in gen:
        step = (step[0], step[1], step[2], step[3], np.array([False]), step[5])
        buf.add(*step)
        added.append(step)
    for step in stacked_stream(1, 6, seed=10, pad="repeat"):  # a new stream, no done flag
        buf.add(*step)
        added.append(step)
    check_all_slots(buf, added)
    buf.close()


def test_pickle_and_copy_keep_the_frames(tmp_path):
    buf = make(25, 2)  # a temporary store: a copy writes its own
    added = []
    for step in stacked_stream(2, 40, seed=3, pad="repeat"):
        buf.add(*step)
        added.append(step)
    for other in (pickle.loads(pickle.dumps(buf)), copy.deepcopy(buf)):
        check_all_slots(other, added)
        step = next(stacked_stream(2, 1, seed=4, pad="zero"))
        other.add(*step)  # the copy's frame views still point into its own frames
        check_all_slots(other, [*added, step])
        other.close()
    check_all_slots(buf, added)
    buf.close()


def test_a_ring_pickled_with_its_last_stacks_as_bytes_continues_its_streams(tmp_path):
    """Buffers pickled before the ring kept the newest ``next_obs`` stacks as an array
    (then: a list of ``bytes`` per env) load and continue their streams."""
    buf = make(25, 2)
    added = []
    stream = stacked_stream(2, 41, seed=5, pad="zero")
    for step in stream:
        buf.add(*step)
        added.append(step)
        if len(added) == 40:
            break
    ring = buf._mirror.rings["obs"]
    state = ring.__getstate__()
    state["_last_next"] = [ring._last_next[e].tobytes() for e in range(2)]
    old = type(ring).__new__(type(ring))
    old.__setstate__(state)
    buf._mirror.rings["obs"] = buf._ring = old
    step = next(stream)  # continues the streams (or starts new ones where one ended)
    buf.add(*step)
    # an env whose episode went on is seen to continue its stream (compared with the stack
    # loaded from bytes), one whose episode ended starts a new one
    assert [old._run[e] > 0 for e in range(2)] == [not d for d in added[-1][4]]
    check_all_slots(buf, [*added, step])
    buf.close()


def test_a_stack_that_does_not_shift_is_refused_and_nothing_changes(tmp_path):
    buf = make(10, 1, url=tmp_path / "b.zarr")
    added = []
    for step in stacked_stream(1, 6, seed=1, pad="zero"):
        buf.add(*step)
        added.append(step)
    obs, nxt = added[-1][1], added[-1][1].copy()
    nxt[:, 0] ^= 1
    with pytest.raises(es.ValidationError, match="frame_stack"):
        buf.add(obs, nxt, np.array([[0]]), np.array([0.0]), np.array([False]), [{}])
    with pytest.raises(es.ValidationError, match="obs"):
        buf.add(obs[:, :2], nxt, np.array([[0]]), np.array([0.0]), np.array([False]), [{}])
    assert buf.size() == 6
    check_all_slots(buf, added)
    buf.close()


@pytest.mark.parametrize("n_envs", [1, 3])
def test_observations_arrays_of_frame_stacked_buffers_match_sb3s(n_envs):
    """SB3's ``observations`` / ``next_observations`` arrays of a buffer that keeps single
    frames: the stacks rebuilt in SB3's layout, equal to SB3's own buffer after the same
    adds (wrapped once), zeros where nothing was added."""
    from stable_baselines3.common.buffers import ReplayBuffer

    size = 12
    ours = make(size, n_envs)
    theirs = ReplayBuffer(size, spaces.Box(0, 255, (K, H, W), np.uint8), spaces.Discrete(3),
                          device="cpu", n_envs=n_envs, optimize_memory_usage=False)
    for t, s in enumerate(stacked_stream(n_envs, 17, seed=3, pad="zero")):
        ours.add(*s)
        theirs.add(*s)
        if t == 4:  # before the buffer is full: unfilled slots are zeros in both
            np.testing.assert_array_equal(ours.observations, theirs.observations)
    np.testing.assert_array_equal(ours.observations, theirs.observations)
    np.testing.assert_array_equal(ours.next_observations, theirs.next_observations)
    ours.close()
