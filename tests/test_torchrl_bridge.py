"""TorchRL bridge: real TorchRL buffers, collectors and losses on expstore stores."""

from __future__ import annotations

import time
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("torchrl")
from _writer_spies import route_puts, unroute_puts  # noqa: E402
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
        assert len(rb3) == store.num_transitions + 1 <= rb3._storage.max_size
    assert rb3._storage.max_size == store.capacity >= 256 + store.layout.shard_rows
    store.index.mark_lost(0, [(int(store.index.count[0]) - 30, int(store.index.count[0]) - 20)],
                          0, int(store.index.count[0]))  # (what a repair's quarantine does)
    assert len(rb3) == store.num_transitions + 1
    rb3._storage.close()


# -- the write path: one check for every lane, then one batched append per lane -----------
def _jump(td, at: int, by: float = 100.0):
    """``td`` (batch [..., T]) with every observation from step ``at`` on shifted by ``by``:
    step ``at`` does not continue step ``at - 1`` (an env reset without a done flag)."""
    td = td.clone()
    td["observation"][..., at:, :] += by
    td["next", "observation"][..., at:, :] += by
    return td


def _rows_of(store, lane):
    """Every stored column of ``lane``'s rows, oldest first."""
    rows = store.index.lane_rows(lane, np.arange(int(store.index.count[lane])))
    return {name: store.read(name, rows) for name in
            [*store.spec.fields, "_flags", "_episode_step", "_step_id"]}


def test_extend_stores_the_rows_the_checked_step_writer_path_stored(tmp_path):
    """Batches spanning episode ends, ending on a done step, breaking without a done flag,
    in 1 and 2 lanes: the bridge's one-check batched append stores exactly the rows the
    step writer's fully checked ``store.extend`` path stores (flags, final rows, obs)."""
    from expstore.integrations.step_writer import StepWriter

    spec = es.Spec.create(obs=es.Field((4,), np.float32), action=es.Field((), np.int64),
                          extras={"cost": es.Field((), np.float32)})
    batches = [_steps(10, 0, (3,)), _steps(7, 10, (16,)), _jump(_steps(12, 17, (25,)), 5),
               _steps(1, 29), _jump(_steps(30, 130, (140, 159)), 0), _steps(5, 160)]
    for lanes in (1, 2):
        rb = replay_buffer(tmp_path / f"b{lanes}.zarr", spec=spec, capacity=2048, lanes=lanes)
        ref = es.create(tmp_path / f"r{lanes}.zarr", spec, capacity=2048, lanes=lanes,
                        shard_rows=rb._storage.store.layout.shard_rows)
        writer = StepWriter(ref)  # checks again inside store.extend, waits for shard writes
        for k, b in enumerate(batches):
            b = b.expand(lanes, *b.shape).clone() if lanes > 1 else b
            b["cost"] = torch.full(b.shape, float(k))
            rb.extend(b)
            for lane in range(lanes):
                td = b[lane] if lanes > 1 else b
                writer.extend(lane, writer.coerce(
                    td["observation"].numpy(), td["action"].numpy(),
                    td["next", "reward"].reshape(-1).numpy(),
                    td["next", "observation"].numpy(),
                    td["next", "terminated"].reshape(-1).numpy(),
                    td["next", "truncated"].reshape(-1).numpy(),
                    {"cost": td["cost"].numpy()}, lead=(len(td),)))
        rb._storage.close()
        writer.end()
        ref.close()
        got, want = es.open(tmp_path / f"b{lanes}.zarr"), es.open(tmp_path / f"r{lanes}.zarr")
        assert writer.breaks == 3 * lanes  # steps 21, 28 and 29 were closed as truncated
        for lane in range(lanes):
            a, b = _rows_of(got, lane), _rows_of(want, lane)
            assert len(a["reward"]) == 65 + 9  # 65 steps; final rows: 5 ends, 3 breaks, close
            for name in b:
                np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        got.close()
        want.close()


def test_bad_values_name_the_tensordict_key_and_store_nothing(tmp_path):
    spec = es.Spec.create(obs=es.Field((4,), np.float32),
                          action=es.Field((), np.int64, low=0, high=1))
    rb = replay_buffer(tmp_path / "a.zarr", spec=spec, capacity=1024, lanes=2)
    store = rb._storage.store
    rb.extend(_steps(6, 0, (2,), lead=(2,)))
    before = (len(rb), store.index.count.copy(), [dict(h) for h in rb._storage.writer.held])

    def refused(td, match):
        with pytest.raises(es.ValidationError, match=match):
            rb.extend(td)
        assert len(rb) == before[0]
        np.testing.assert_array_equal(store.index.count, before[1])
        for h, h0 in zip(rb._storage.writer.held, before[2]):
            assert h.keys() == h0.keys() and all(np.array_equal(h[k], h0[k]) for k in h)

    bad = _steps(5, 6, lead=(2,))
    bad["action"][1, 3] = 7  # lane 1 only: lane 0 must not be stored either
    refused(bad, r"TensorDict key 'action': action: value 7 at \(1, 3\) is above high")
    bad = _steps(5, 6, lead=(2,))
    bad["next", "observation"][1, 2, 0] = float("nan")
    refused(bad, r"TensorDict key \('next', 'observation'\): next_obs: expected finite")
    bad = _steps(5, 6, lead=(2,))
    bad["observation"] = torch.zeros(2, 5, 3)
    refused(bad, r"TensorDict key 'observation': obs: expected shape \(2, 5, 4\), "
                 r"got \(2, 5, 3\)")
    bad = _steps(5, 6, lead=(2,))
    bad["action"] = torch.full((2, 5), 0.5)
    refused(bad, r"TensorDict key 'action': action: dtype float32 cannot be cast safely")
    bad = _steps(5, 6, lead=(2,))
    bad["next", "reward"] = torch.ones(2, 5, 2)
    refused(bad, r"TensorDict key \('next', 'reward'\): reward: expected shape \(2, 5\)")
    bad = _steps(5, 6, lead=(2,))
    del bad["next", "observation"]
    refused(bad, r"next_obs: key \('next', 'observation'\) missing from the TensorDict")
    rb.extend(_steps(0, 6, lead=(2,)))  # an empty batch stores nothing
    assert len(rb) == before[0]
    rb.extend(_steps(5, 6, lead=(2,)))  # and the stream goes on where it was
    assert len(rb) == before[0] + 10
    rb._storage.close()


def test_a_shard_write_failing_behind_extend_surfaces_and_loses_nothing(tmp_path):
    """extend leaves full shards to the background writer (as add does): a write that
    fails is raised by the next extend (nothing of that batch stored) or flush, every row
    stays readable meanwhile, and once storage works again every row is written."""
    spec = es.Spec.create(obs=es.Field((4,), np.float32), action=es.Field((), np.int64))
    store = es.create(tmp_path / "a.zarr", spec, capacity=1024, shard_rows=64)
    rb = replay_buffer(store)
    failing = []

    def full_disk(key, data):
        failing.append(key)
        raise OSError(28, "No space left on device", key)

    route_puts(store.backend, full_disk)
    rb.extend(_steps(100, 0, (50,)))  # fills a shard: its write fails in the background
    store.writers[0].wait()
    assert failing and len(rb) == 100
    with pytest.raises(es.WriteFailedError, match="No space left on device"):
        rb.extend(_steps(10, 100))
    assert len(rb) == 100  # that batch was not stored
    td = rb.sample(32)  # staged rows stay readable
    assert (td["next", "observation"] == td["observation"] + 1).all()
    unroute_puts(store.backend)
    rb.extend(_steps(10, 100))
    rb._storage.close()
    back = es.open(tmp_path / "a.zarr")
    assert back.num_transitions == 110 and back.num_episodes == 2


def test_sampled_batches_are_the_transitions_at_their_index(tmp_path):
    """The sampler's plan is read for the rows TorchRL asks for next; other rows (or the
    same ones again) are checked and planned anew: the same values either way."""
    spec = es.Spec.create(obs=es.Field((4,), np.float32), action=es.Field((), np.int64))
    for prioritized in (False, True):
        rb = replay_buffer(tmp_path / f"{prioritized}.zarr", spec=spec, capacity=1024,
                           batch_size=64, prioritized=prioritized, n_step=3, gamma=0.5,
                           seed=0, shard_rows=64, fsync=prioritized)
        assert rb._storage.store.layout.shard_rows == 64  # (default here: 128)
        rb.extend(_steps(300, 0, (40, 99, 250)))
        storage = rb._storage
        w = storage.store.writers[0]
        while not all(sh.done for sh in w.queued):  # the shards extend left to the
            time.sleep(0.01)  # background writer get written (nobody applied them yet)
        assert w.queued and storage.store.index.committed[0] == w.committed.count == 0
        rb.sample()  # and a read sees them committed (not walking the queue of RAM buffers)
        assert not w.queued and storage.store.index.committed[0] == w.committed.count > 0
        for _ in range(3):
            td, info = rb.sample(return_info=True)
            assert storage._planned is None  # read once, then dropped
            want = to_tensordict(storage.store.transitions(info["index"].numpy(), 3, 0.5),
                                 weights=False)
            for key in want.keys(True, True):
                assert torch.equal(td[key], want[key]), key
            assert torch.equal(td["priority_weight"], info["priority_weight"])
            assert (td["next", "horizon"] <= 3).all() and td["next", "discount"].shape == (64, 1)
        rows, _ = rb._sampler.sample(storage, 8)
        other = torch.arange(20, 28)
        np.testing.assert_array_equal(storage.get(other)["observation"][:, 0].numpy(),
                                      np.arange(20, 28))  # not the planned rows
        again = storage.get(rows)  # the plan was dropped: checked and planned anew
        np.testing.assert_array_equal(again["index"].numpy(), rows.numpy())
        storage.close()


def test_a_bridge_store_of_small_rows_takes_4096_row_shards(tmp_path):
    """The integrations cap shards at 1024 rows for frames (staging RAM per lane), but a
    store of small rows takes up to 4096 (fewer files to write per row): at 1M transitions
    and at 50k (the store's own default there: 1024), with 8 shards per lane at least;
    rows of a few KB take what fits in 4 MiB."""
    from expstore.integrations.step_writer import default_shard_rows

    small = es.Spec.create(obs=es.Field((4,), np.float32), action=es.Field((), np.int64))
    frames = es.Spec.create(obs=es.Field((84, 84), np.uint8, stack=4),
                            action=es.Field((), np.int64))
    assert default_shard_rows(small, 1_000_000) == 4096
    assert default_shard_rows(small, 1_000_000, lanes=8) == 4096
    assert default_shard_rows(small, 50_000) == 4096
    assert default_shard_rows(small, 50_000, lanes=8) == 512  # lanes of 6,250 rows: 8+ shards
    assert default_shard_rows(frames, 1_000_000) == 1024
    assert default_shard_rows(frames, 50_000) == 1024
    two_kb = es.Spec.create(obs=es.Field((448,), np.float32), action=es.Field((), np.int64))
    assert default_shard_rows(two_kb, 1_000_000) == 2048  # 2048 rows of ~1.8 KB: 4 MiB
    assert default_shard_rows(small, 1024) == 128  # at least 8 shards per lane, as before
    rb = replay_buffer(tmp_path / "big.zarr", spec=small, capacity=1_000_000)
    assert rb._storage.store.layout.shard_rows == 4096
    rb.extend(_steps(300, 0, (40, 99, 250)))
    assert len(rb) == 300 and rb.sample(32)["observation"].shape == (32, 4)
    rb._storage.close()
