"""SLM Lab memories on a real Gymnasium env: Replay, PrioritizedReplay (CER), on-policy."""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import pytest

import expstore as es
from expstore.errors import ValidationError


def _run(memory, steps, seed=0, on_step=None):
    env = gym.make("CartPole-v1")
    state, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    log = []
    for t in range(steps):
        action = int(rng.integers(2))
        nxt, reward, term, trunc, _ = env.step(action)
        memory.update(state, action, reward, nxt, term, trunc)
        log.append((state, action, reward, nxt, term))
        if on_step is not None:
            on_step(t, memory, log)
        state = env.reset()[0] if term or trunc else nxt
    return log


def _key(s, a, r, n, d):
    return (np.asarray(s, np.float32).tobytes(), int(a), float(r),
            np.asarray(n, np.float32).tobytes(), bool(d))


def test_replay_from_slm_spec(tmp_path):
    mem = es.make_memory({"name": "Replay", "batch_size": 32, "max_size": 500,
                          "use_cer": False}, url=tmp_path / "replay.zarr", seed=0)
    assert isinstance(mem, es.Replay) and not mem.to_train
    log = _run(mem, 800)
    assert mem.to_train
    assert mem.max_size <= len(mem) <= mem.store.capacity
    logged = {_key(*t) for t in log}
    b = mem.sample()
    assert set(b) >= {"states", "actions", "rewards", "next_states", "dones", "index"}
    assert b["states"].shape == (32, 4) and b["dones"].dtype == np.float32
    for i in range(32):
        assert _key(b["states"][i], b["actions"][i], b["rewards"][i], b["next_states"][i],
                    b["dones"][i]) in logged
    assert not mem.to_train  # trained on this step already
    oldest = min(b["step_id"].min() for _ in range(20) if (b := mem.sample()))
    assert oldest >= 800 + 30 - mem.store.capacity  # ring holds only the newest rows
    mem.close()


def test_prioritized_replay_with_cer(tmp_path):
    spec = {"name": "PrioritizedReplay", "alpha": 0.6, "epsilon": 0.0001, "batch_size": 16,
            "max_size": 300, "use_cer": True}
    mem = es.make_memory(spec, url=tmp_path / "per.zarr", seed=1)
    assert isinstance(mem, es.PrioritizedReplay)

    def check(t, mem, log):
        if t < 40 or t % 7:
            return
        b = mem.sample()
        assert _key(b["states"][-1], b["actions"][-1], b["rewards"][-1],
                    b["next_states"][-1], b["dones"][-1]) == _key(*log[-1])
        assert mem.update_priorities(np.abs(b["rewards"]) + 1.0) > 0

    _run(mem, 400, seed=1, on_step=check)
    assert mem.sampler.total_priority > 0 and mem.sampler.max_priority > 1.0
    mem.close()


def test_temporary_store_and_inferred_spec():
    mem = es.Replay(batch_size=4, max_size=50)
    _run(mem, 30)
    path = mem.store.url.removeprefix("file://")
    assert os.path.isdir(path) and mem.store.spec.fields["obs"].shape == (4,)
    mem.close()
    assert not os.path.exists(path)


def test_inconsistent_next_state_is_refused(tmp_path):
    mem = es.Replay(batch_size=4, max_size=50, url=tmp_path / "r.zarr")
    s = np.zeros(3, np.float32)
    mem.update(s, 0, 1.0, s + 1, False)
    with pytest.raises(ValidationError, match="next_state"):
        mem.update(s + 5, 0, 1.0, s + 6, False)
    mem.update(s + 1, 0, 1.0, s + 2, False, truncated=True)
    mem.update(s + 9, 0, 1.0, s + 2, False)  # a new episode may start anywhere
    mem.close()


def test_on_policy_replay_trains_on_whole_episodes():
    mem = es.make_memory({"name": "OnPolicyReplay"}, training_frequency=2)
    episodes = []

    def check(t, mem, log):
        if mem.to_train:
            assert log[-1][4]  # only when an episode just ended
            b = mem.sample()
            assert len(b["states"]) == 2
            episodes.append([len(e) for e in b["rewards"]])
            assert not mem.to_train and len(mem.episodes) == 0

    log = _run(mem, 300, on_step=check)
    assert episodes, "no training happened"
    ends = [i for i, t in enumerate(log) if t[4]]
    lengths = np.diff([-1, *ends]).tolist()
    assert [n for pair in episodes for n in pair] == lengths[: 2 * len(episodes)]


def test_on_policy_batch_replay_trains_every_n_steps():
    mem = es.make_memory({"name": "OnPolicyBatchReplay"}, training_frequency=16)
    sizes = []

    def check(t, mem, log):
        if mem.to_train:
            b = mem.sample()
            sizes.append(len(b["rewards"]))
            np.testing.assert_array_equal(b["states"][-1], log[-1][0])
            assert len(mem) == 0 and not mem.to_train

    _run(mem, 100, on_step=check)
    assert sizes == [16] * 6


def test_factory_rejects_bad_specs():
    with pytest.raises(ValueError, match="unknown memory"):
        es.make_memory({"name": "FancyReplay"})
    with pytest.raises(ValueError, match="unknown key"):
        es.make_memory({"name": "Replay", "max_sise": 10})
    with pytest.raises(ValueError, match="name"):
        es.make_memory({"batch_size": 3})
    with pytest.raises(ValueError, match="RAM"):
        es.make_memory({"name": "OnPolicyReplay"}, url="x.zarr")
