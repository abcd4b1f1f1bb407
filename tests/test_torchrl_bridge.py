"""TorchRL bridge: real TorchRL buffers, collectors and losses on expstore stores."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("torchrl")
from tensordict import TensorDict  # noqa: E402
from torchrl.collectors import Collector  # noqa: E402
from torchrl.data import LazyTensorStorage, ReplayBuffer  # noqa: E402
from torchrl.envs import GymEnv, SerialEnv  # noqa: E402
from torchrl.envs.utils import RandomPolicy  # noqa: E402

import expstore as es  # noqa: E402
from expstore.integrations import (  # noqa: E402
    ExpstoreSampler,
    ExpstoreStorage,
    replay_buffer,
    to_tensordict,
)

warnings.filterwarnings("ignore", category=UserWarning, module="torchrl")


@pytest.fixture
def cartpole_store(tmp_path):
    """A store written with plain store.add from CartPole, and the steps as written."""
    env = gym.make("CartPole-v1", max_episode_steps=40)
    spec = es.Spec.from_spaces(env.observation_space, env.action_space)
    store = es.create(tmp_path / "cp.zarr", spec, capacity=2048, shard_rows=256)
    rng = np.random.default_rng(0)
    steps = []  # (lane step, obs, action, reward, next_obs, term, trunc)
    obs, _ = env.reset(seed=0)
    row = 0
    for _ in range(600):
        a = int(rng.integers(2))
        nxt, r, term, trunc, _ = env.step(a)
        store.add(obs, a, r, nxt, term, trunc)
        steps.append((row, obs, a, r, nxt, term, trunc))
        row += 1 + (term or trunc)
        obs = nxt if not (term or trunc) else env.reset()[0]
    store.flush()
    store.close()
    return tmp_path / "cp.zarr", {s[0]: s for s in steps}


def check_td(td, by_step):
    """Every sampled transition is the written step at its index (lane 0: row = step)."""
    assert td["next", "reward"].shape == (len(td), 1)
    for k in range(len(td)):
        step, obs, a, r, nxt, term, trunc = by_step[int(td["index"][k])]
        np.testing.assert_array_equal(td["observation"][k].numpy(), obs)
        np.testing.assert_array_equal(td["next", "observation"][k].numpy(), nxt)
        assert int(td["action"][k]) == a
        assert td["next", "reward"][k, 0].item() == pytest.approx(r)
        assert bool(td["next", "terminated"][k, 0]) == term
        assert bool(td["next", "truncated"][k, 0]) == trunc
        assert bool(td["next", "done"][k, 0]) == (term or trunc)


def test_plain_torchrl_replaybuffer_samples_valid_transitions(cartpole_store):
    url, by_step = cartpole_store
    storage = ExpstoreStorage(url)
    rb = ReplayBuffer(storage=storage, batch_size=128)  # TorchRL's default RandomSampler
    assert len(rb) == storage.store.num_transitions == 600  # transitions, not store rows
    for _ in range(3):
        td = rb.sample()
        assert td.batch_size == (128,)
        check_td(td, by_step)
    single = storage[5]
    assert single.batch_size == () and int(single["index"]) == 5
    finals = np.array([s + 1 for s, *rest in by_step.values() if rest[4] or rest[5]])
    assert not storage.contains(torch.as_tensor(finals)).any()  # final rows start nothing


def test_prioritized_sampler_and_td_error_feedback(cartpole_store):
    url, by_step = cartpole_store
    rb = ReplayBuffer(storage=ExpstoreStorage(url),
                      sampler=ExpstoreSampler(prioritized=True, alpha=0.7, beta=0.5, seed=0),
                      batch_size=64)
    data, info = rb.sample(return_info=True)
    check_td(data, by_step)
    assert torch.allclose(info["priority_weight"], torch.ones(64))  # all at max priority
    idx = info["index"]
    td_error = torch.linspace(0.1, 5.0, 64)
    rb.update_priority(idx, td_error)
    prio = rb._sampler.sampler.priorities
    got = prio.get(idx.numpy())
    # duplicates in the batch keep the last value written, like TorchRL's own PER
    last = {int(i): float(e) for i, e in zip(idx, td_error)}
    want = np.array([(last[int(i)] + prio.eps) ** 0.7 for i in idx], np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    data, info = rb.sample(return_info=True)
    p = prio.get(info["index"].numpy())
    np.testing.assert_allclose(info["priority_weight"].numpy(),
                               (p / prio.min_priority) ** -0.5, rtol=1e-5)


def test_collector_batches_into_store_one_lane_per_env(tmp_path):
    env = SerialEnv(2, lambda: GymEnv("CartPole-v1"))
    rb = replay_buffer(tmp_path / "col.zarr", env=env, capacity=2 * 512, batch_size=32)
    store = rb._storage.store
    assert store.lanes == 2 and store.spec.fields["action"].shape == (2,)  # one-hot
    col = Collector(env, RandomPolicy(env.action_spec), frames_per_batch=100,
                    total_frames=600)
    batches = []
    for data in col:
        assert data.shape[0] == 2
        rb.extend(data)
        batches.append(data.clone())
    col.shutdown()
    rb._storage.close()
    reader = es.open(tmp_path / "col.zarr")
    for lane in range(2):
        seq = torch.cat([b[lane] for b in batches])
        done = seq["next", "done"].reshape(-1).numpy()
        # expected rows: each step, + a final row (next obs) per ended episode and at the end
        want_obs, want_act, want_final = [], [], []
        for t in range(len(seq)):
            want_obs.append(seq["observation"][t].numpy())
            want_act.append(seq["action"][t].numpy())
            want_final.append(False)
            if done[t] or t == len(seq) - 1:
                want_obs.append(seq["next", "observation"][t].numpy())
                want_act.append(np.zeros(2, np.int64))
                want_final.append(True)
        rows = reader.index.lane_rows(lane, np.arange(len(want_obs)))
        assert int(reader.index.count[lane]) == len(want_obs)
        np.testing.assert_array_equal(reader.read("obs", rows), np.stack(want_obs))
        np.testing.assert_array_equal(reader.read("action", rows), np.stack(want_act))
        flags = reader.read("_flags", rows)
        np.testing.assert_array_equal((flags & 2) > 0, want_final)
    # sampling through the buffer gives TorchRL-shaped one-hot transitions
    rb2 = ReplayBuffer(storage=ExpstoreStorage(tmp_path / "col.zarr"), batch_size=16)
    td = rb2.sample()
    assert td["action"].shape == (16, 2) and td["action"].sum(-1).eq(1).all()


def test_dqn_loss_runs_on_expstore_batches_and_feeds_priorities(cartpole_store):
    from torchrl.modules import MLP, QValueActor
    from torchrl.objectives import DQNLoss

    url, _ = cartpole_store
    env = GymEnv("CartPole-v1")
    actor = QValueActor(MLP(out_features=2, num_cells=[32]), in_keys=["observation"],
                        spec=env.action_spec)
    loss_fn = DQNLoss(actor, action_space=env.action_spec, delay_value=False)
    rb = ReplayBuffer(storage=ExpstoreStorage(url),
                      sampler=ExpstoreSampler(prioritized=True, seed=1), batch_size=32)
    data, info = rb.sample(return_info=True)
    data["action"] = torch.nn.functional.one_hot(data["action"], 2)  # store holds Discrete
    data["priority_weight"] = info["priority_weight"]
    loss = loss_fn(data)["loss"]
    assert torch.isfinite(loss)
    loss.backward()
    rb.update_priority(info["index"], data["td_error"])
    prio = rb._sampler.sampler.priorities
    assert not np.allclose(prio.get(info["index"].numpy()), 1.0)


def test_to_tensordict_nstep_and_dict_obs(tmp_path):
    spec = es.Spec.create(obs={"pos": es.Field((2,), np.float32), "t": es.Field((), np.int64)},
                          action=es.Field((), np.int64), extras={"cost": es.Field(())})
    store = es.create(tmp_path / "d.zarr", spec, capacity=512, shard_rows=64)
    for t in range(100):
        end = t % 10 == 9
        store.add({"pos": np.full(2, t, np.float32), "t": t}, t % 3, 1.0,
                  {"pos": np.full(2, t + 1, np.float32), "t": t + 1}, end, False, cost=float(t))
    sampler = es.UniformSampler(store, n_step=3, gamma=0.5, seed=0)
    b = sampler.sample(16)
    td = to_tensordict(b)
    assert set(td.keys()) >= {"pos", "t", "action", "cost", "next", "index", "step_id",
                              "priority_weight"}
    assert td["next", "pos"].shape == (16, 2) and td["next", "discount"].shape == (16, 1)
    m = td["next", "horizon"].reshape(-1).numpy()
    np.testing.assert_array_equal(td["next", "t"].numpy(), td["t"].numpy() + m)
    want = np.array([sum(0.5 ** j for j in range(k)) for k in m], np.float32)
    np.testing.assert_allclose(td["next", "reward"].reshape(-1).numpy(), want)
    store.close()


def _steps(T: int, t0: int, ends: tuple[int, ...] = (), lead: tuple[int, ...] = ()):
    """``T`` CartPole-shaped collector steps (steps ``t0..``; episodes end at ``ends``)."""
    t = torch.arange(t0, t0 + T, dtype=torch.float32).expand(*lead, T)
    done = torch.zeros(*lead, T, 1, dtype=torch.bool)
    for e in ends:
        done[..., e - t0, 0] = True
    return TensorDict({"observation": t[..., None].expand(*lead, T, 4).clone(),
                       "action": torch.zeros(*lead, T, dtype=torch.int64),
                       "next": {"observation": (t + 1)[..., None].expand(*lead, T, 4).clone(),
                                "reward": torch.ones(*lead, T, 1), "done": done.clone(),
                                "terminated": done.clone(),
                                "truncated": torch.zeros_like(done)}},
                      batch_size=[*lead, T])


def test_len_counts_transitions_as_torchrl_own_buffer_does(tmp_path):
    spec = es.Spec.create(obs=es.Field((4,), np.float32), action=es.Field((), np.int64))
    rb = replay_buffer(tmp_path / "a.zarr", spec=spec, capacity=4096, batch_size=8)
    ref = ReplayBuffer(storage=LazyTensorStorage(4096), batch_size=8)  # TorchRL's own
    assert len(rb) == len(ref) == 0
    for T, t0, ends in ((10, 0, ()), (15, 10, (14,)), (30, 25, (30, 41, 54)), (1, 55, ())):
        rb.extend(_steps(T, t0, ends))
        ref.extend(_steps(T, t0, ends))
        assert len(rb) == len(ref) == t0 + T  # the step held for its successor counts
    rb.add(_steps(1, 56)[0])
    ref.add(_steps(1, 56)[0])
    assert len(rb) == len(ref) == 57
    store = rb._storage.store
    assert len(store) == 57 - 1 + 4  # rows: less the held step, plus 4 final rows
    rb._storage.close()
    assert len(ReplayBuffer(storage=ExpstoreStorage(tmp_path / "a.zarr"))) == 57
    # one lane per env: a [2, T] batch is 2 * T transitions, as TorchRL counts them flat
    rb2 = replay_buffer(tmp_path / "b.zarr", spec=spec, capacity=4096, lanes=2)
    ref2 = ReplayBuffer(storage=LazyTensorStorage(4096))
    for T, t0, ends in ((12, 0, (5,)), (9, 12, ())):
        rb2.extend(_steps(T, t0, ends, lead=(2,)))
        ref2.extend(_steps(T, t0, ends, lead=(2,)).reshape(-1))
        assert len(rb2) == len(ref2) == 2 * (t0 + T)
    rb2._storage.close()
    # past capacity the ring drops the oldest rows: still every step held, counted anew
    rb3 = replay_buffer(tmp_path / "c.zarr", spec=spec, capacity=256)
    for k in range(10):
        rb3.extend(_steps(60, 60 * k, (60 * k + 17,)))
        store = rb3._storage.store
        assert len(rb3) == store.num_transitions + 1 <= 256
    store.index.mark_lost(0, [(int(store.index.count[0]) - 30, int(store.index.count[0]) - 20)],
                          0, int(store.index.count[0]))  # (what a repair's quarantine does)
    assert len(rb3) == store.num_transitions + 1
    rb3._storage.close()
