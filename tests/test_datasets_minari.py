"""Minari datasets <-> stores, checked with the real ``minari`` library (hdf5 and arrow).

Every dataset here is read back by ``minari.load_dataset``/``MinariDataset`` itself, and
every "minari-written" dataset comes from ``minari.create_dataset_from_buffers`` (or
``DataCollector`` where jax is installed).
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

minari = pytest.importorskip("minari")
gym = pytest.importorskip("gymnasium")

from minari.data_collector import EpisodeBuffer  # noqa: E402

import expstore as es  # noqa: E402
from expstore.datasets import export_minari, import_minari  # noqa: E402
from expstore.datasets.minari import write as minari_write  # noqa: E402  (internals: patched)

spaces = gym.spaces
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*is set to None.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:env_spec is None.*:UserWarning"),
]
HAS_ARROW = True
try:
    import pyarrow  # noqa: F401
except ImportError:
    HAS_ARROW = False
FORMATS = ["hdf5", pytest.param("arrow", marks=pytest.mark.skipif(
    not HAS_ARROW, reason="minari's arrow format needs pyarrow (minari[arrow])"))]


@pytest.fixture(autouse=True)
def minari_root(tmp_path, monkeypatch):
    root = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root


# -- data ----------------------------------------------------------------------------------
OBS_SPACES = {
    "box": spaces.Box(-1.0, 1.0, (3,), np.float32),
    "discrete": spaces.Discrete(5, start=2),
    "dict": spaces.Dict({"pos": spaces.Box(-5.0, 5.0, (2,), np.float32),
                         "cell": spaces.Discrete(4),
                         "img": spaces.Box(0, 255, (6, 5), np.uint8)}),
    "tuple": spaces.Tuple((spaces.Box(-1.0, 1.0, (2,), np.float64), spaces.Discrete(3),
                           spaces.MultiBinary(3), spaces.MultiDiscrete([2, 5]))),
}
#: what an export of a store made with Spec.from_spaces(OBS_SPACES[k]) declares: the
#: store keeps no observation Box bounds, so those become dtype limits / infinities
EXPORTED = {
    "box": spaces.Box(-np.inf, np.inf, (3,), np.float32),
    "discrete": spaces.Discrete(5, start=2),
    "dict": spaces.Dict({"pos": spaces.Box(-np.inf, np.inf, (2,), np.float32),
                         "cell": spaces.Discrete(4), "img": spaces.Box(0, 255, (6, 5), np.uint8)}),
    "tuple": spaces.Tuple((spaces.Box(-np.inf, np.inf, (2,), np.float64), spaces.Discrete(3),
                           spaces.MultiBinary(3), spaces.MultiDiscrete([2, 5]))),
}


def sample_values(space, n, rng):
    """``n`` values of ``space`` as one array per leaf (dict/tuple trees)."""
    if isinstance(space, spaces.Dict):
        return {k: sample_values(s, n, rng) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(sample_values(s, n, rng) for s in space.spaces)
    if isinstance(space, spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, n).astype(np.int64)
    if isinstance(space, spaces.MultiBinary):
        return rng.integers(0, 2, (n, *space.shape)).astype(np.int8)
    if isinstance(space, spaces.MultiDiscrete):
        return (space.start + rng.integers(0, space.nvec, (n, *space.shape))).astype(np.int64)
    if space.dtype == np.uint8:
        return rng.integers(0, 256, (n, *space.shape)).astype(np.uint8)
    lo, hi = np.maximum(space.low, -3), np.minimum(space.high, 3)
    return rng.uniform(lo, hi, (n, *space.shape)).astype(space.dtype)


def cut(tree, sl):
    if isinstance(tree, dict):
        return {k: cut(v, sl) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(cut(v, sl) for v in tree)
    return tree[sl]


def make_episodes(obs_space, act_space, lengths, rng, infos=True, nested=True):
    """Reference episodes as Minari holds them (T + 1 observations and infos)."""
    eps = []
    for i, T in enumerate(lengths):
        term = np.zeros(T, bool)
        trunc = np.zeros(T, bool)
        (term if i % 2 == 0 else trunc)[-1] = True
        inf = {}
        if infos:
            inf = {"lives": np.arange(T + 1, dtype=np.int32)[::-1].copy(),
                   "vel": rng.normal(size=(T + 1, 2)).astype(np.float32)}
            if nested:
                inf["stats"] = {"ok": rng.random(T + 1) < 0.5}
        eps.append(dict(obs=sample_values(obs_space, T + 1, rng),
                        actions=sample_values(act_space, T, rng),
                        rewards=rng.normal(size=T).astype(np.float32),
                        term=term, trunc=trunc, infos=inf))
    return eps


def info_fields(ep):
    out = {}
    for k, v in ep["infos"].items():
        if isinstance(v, dict):
            out.update({f"info.{k}.{k2}": v2 for k2, v2 in v.items()})
        else:
            out[f"info.{k}"] = v
    return out


def write_store(url, obs_space, act_space, eps, **create_kw):
    fields = {n: es.Field(a.shape[1:], a.dtype) for n, a in info_fields(eps[0]).items()}
    spec = es.Spec.from_spaces(obs_space, act_space, extras=fields)
    rows = sum(len(e["rewards"]) + 1 for e in eps)
    store = es.create(url, spec, create_kw.pop("capacity", es.round_capacity(rows, 1, 64)),
                      shard_rows=64, **create_kw)
    for e in eps:
        batch = {"obs": cut(e["obs"], slice(None, -1)), "next_obs": cut(e["obs"], slice(1, None)),
                 "action": e["actions"], "reward": e["rewards"], "terminated": e["term"],
                 "truncated": e["trunc"]}
        for n, a in info_fields(e).items():
            batch[n], batch["next_" + n] = a[:-1], a[1:]
        store.extend(batch)
    store.flush()
    return store


def assert_tree_equal(got, want, what):
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), what
        for k in want:
            assert_tree_equal(got[k], want[k], f"{what}[{k}]")
    elif isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), what
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_tree_equal(g, w, f"{what}[{i}]")
    else:
        got = np.asarray(got)
        assert got.shape == np.shape(want), f"{what}: shape {got.shape} != {np.shape(want)}"
        np.testing.assert_array_equal(got, want, err_msg=what)


def assert_minari_episodes(ds, eps, with_infos=True):
    got = list(ds.iterate_episodes())
    assert len(got) == len(eps) == ds.total_episodes
    assert ds.total_steps == sum(len(e["rewards"]) for e in eps)
    for g, e in zip(got, eps, strict=True):
        assert_tree_equal(g.observations, e["obs"], f"episode {g.id} observations")
        assert_tree_equal(g.actions, e["actions"], f"episode {g.id} actions")
        assert_tree_equal(g.rewards, e["rewards"], f"episode {g.id} rewards")
        assert_tree_equal(g.terminations, e["term"], f"episode {g.id} terminations")
        assert_tree_equal(g.truncations, e["trunc"], f"episode {g.id} truncations")
        if with_infos:
            assert_tree_equal(g.infos, e["infos"], f"episode {g.id} infos")


def assert_store_holds(store, eps):
    """The store's rows, episode by episode, are exactly the reference episodes."""
    from expstore.datasets import store_episodes

    found = store_episodes(store)
    assert len(found) == len(eps)
    spec = store.spec
    for (lane, first, T), e in zip(found, eps, strict=True):
        assert T == len(e["rewards"])
        rows = store.index.lane_rows(lane, np.arange(first, first + T + 1))
        flat = spec.flatten("obs", e["obs"])
        for name, want in flat.items():
            f = spec.fields[name]
            got = store.read(name, rows)
            if f.stack and np.ndim(want) == len(f.shape) + 2:  # stacked source: newest frame
                want = np.asarray(want)[:, -1]
            np.testing.assert_array_equal(got, want, err_msg=name)
        for name, want in spec.flatten("action", e["actions"]).items():
            np.testing.assert_array_equal(store.read(name, rows[:-1]), want, err_msg=name)
        np.testing.assert_array_equal(store.read("reward", rows[:-1]), e["rewards"])
        np.testing.assert_array_equal(store.read("terminated", rows[:-1]), e["term"])
        np.testing.assert_array_equal(store.read("truncated", rows[:-1]), e["trunc"])
        for name, want in info_fields(e).items():
            np.testing.assert_array_equal(store.read(name, rows), want, err_msg=name)
        # transitions (what training reads) agree too: next_obs of the last step is final
        tr = store.transitions(rows[:-1])
        for name, want in flat.items():
            f = spec.fields[name]
            want = np.asarray(want)
            if f.stack and want.ndim == len(f.shape) + 1:
                continue  # single frames in, stacks out: checked by the frame-stack test
            np.testing.assert_array_equal(tr["next_" + name], want[1:], err_msg=name)


def buffers(eps, seed=False):
    return [EpisodeBuffer(observations=e["obs"], actions=e["actions"],
                          rewards=e["rewards"].astype(np.float64), terminations=e["term"],
                          truncations=e["trunc"], infos=e["infos"] or {},
                          seed=(i + 100) if seed else None) for i, e in enumerate(eps)]


def lists_for_scalars(tree):
    """Minari's own arrow writer needs per-step scalar infos as lists (its reader cannot
    parse the shape tag it writes for 1-d numpy infos)."""
    if isinstance(tree, dict):
        return {k: lists_for_scalars(v) for k, v in tree.items()}
    a = np.asarray(tree)
    return a.tolist() if a.ndim == 1 else a


# -- export --------------------------------------------------------------------------------
@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize("kind", list(OBS_SPACES))
def test_export_loads_in_minari(tmp_path, data_format, kind):
    rng = np.random.default_rng(len(kind))
    act = spaces.Discrete(4) if kind != "dict" else spaces.Box(-1.0, 1.0, (2,), np.float32)
    eps = make_episodes(OBS_SPACES[kind], act, [7, 1, 12], rng, nested=data_format == "hdf5")
    store = write_store(tmp_path / "s.zarr", OBS_SPACES[kind], act, eps)
    out = export_minari(store, f"expstore/{kind}-v0", data_format=data_format)
    assert (out.episodes, out.steps) == (3, 20)
    assert out.path == str(pathlib.Path(os.environ["MINARI_DATASETS_PATH"])
                           / f"expstore/{kind}-v0" / "data")
    assert out.nbytes == sum(p.stat().st_size for p in pathlib.Path(out.path).rglob("*")
                             if p.is_file())
    ds = minari.load_dataset(f"expstore/{kind}-v0")
    assert ds.observation_space == EXPORTED[kind]
    assert ds.action_space == act
    assert ds.storage.metadata["data_format"] == data_format
    assert ds.storage.metadata["jpeg_encoding"] is False
    assert_minari_episodes(ds, eps)
    assert "expstore/" + kind + "-v0" in minari.list_local_datasets()
    meta = list(ds.storage.get_episode_metadata([0]))[0]
    assert int(meta["total_steps"]) == 7
    assert meta["rewards_sum"] == pytest.approx(float(eps[0]["rewards"].sum()), rel=1e-6)
    store.close()


def test_export_only_complete_episodes_all_lanes(tmp_path):
    """Episodes cut by ring wrap-around or still open are skipped; lanes go one by one."""
    obs_sp, act = spaces.Box(-1.0, 1.0, (2,), np.float32), spaces.Discrete(3)
    spec = es.Spec.from_spaces(obs_sp, act)
    store = es.create(tmp_path / "s.zarr", spec, capacity=128, lanes=2, shard_rows=16)
    rng = np.random.default_rng(1)
    kept = {0: [], 1: []}
    for lane, lengths in ((0, [20, 30, 9, 11, 5]), (1, [6, 8])):
        eps = make_episodes(obs_sp, act, lengths, rng, infos=False)
        for e in eps:
            store.extend({"obs": e["obs"][:-1], "next_obs": e["obs"][1:], "action": e["actions"],
                          "reward": e["rewards"], "terminated": e["term"],
                          "truncated": e["trunc"]}, lane=lane)
        kept[lane] = eps
    # lane 0 holds 64 rows: 21+31+10+12+6 = 80 written, so the first episode is cut
    open_ep = make_episodes(obs_sp, act, [4], rng, infos=False)[0]
    store.extend({"obs": open_ep["obs"][:3], "action": open_ep["actions"][:3],
                  "reward": open_ep["rewards"][:3], "terminated": np.zeros(3, bool),
                  "truncated": np.zeros(3, bool)}, lane=1)
    store.flush()
    out = export_minari(store, "expstore/lanes-v0", infos=False)
    want = kept[0][1:] + kept[1]
    assert out.episodes == len(want)
    assert_minari_episodes(minari.load_dataset("expstore/lanes-v0"), want, with_infos=False)


def pong_frames(n: int, seed: int = 0):
    """Real preprocessed Pong frames (84x84 gray) with episode ends, or a moving-sprite
    stand-in when ALE / OpenCV are not installed."""
    try:
        import ale_py
        from gymnasium.wrappers import AtariPreprocessing

        gym.register_envs(ale_py)
        env = AtariPreprocessing(gym.make("ALE/Pong-v5", frameskip=1), frame_skip=4,
                                 screen_size=84, noop_max=30)
    except Exception:  # noqa: BLE001 - no ROMs / cv2: synthetic frames
        env = None
    rng = np.random.default_rng(seed)
    frames, acts, rews, ends = [], [], [], []
    if env is not None:
        env.action_space.seed(seed)
        obs, _ = env.reset(seed=seed)
        frames.append(obs)
        for i in range(n - 1):
            a = int(env.action_space.sample())
            obs, r, term, trunc, _ = env.step(a)
            last = i == n - 2
            frames.append(obs), acts.append(a), rews.append(r)
            ends.append((term, trunc or (last and not term)))
            if (term or trunc) and not last:
                break  # one episode per call keeps the test short
        env.close()
    else:
        bg = np.full((84, 84), 87, np.uint8)
        for t in range(n):
            f = bg.copy()
            f[10 + t % 60: 18 + t % 60, 8:10] = 147
            f[40 + (3 * t) % 40: 42 + (3 * t) % 40, (5 * t) % 80: (5 * t) % 80 + 2] = 236
            frames.append(f)
            if t < n - 1:
                acts.append(int(rng.integers(6))), rews.append(0.0)
                ends.append((False, t == n - 2))
    T = len(acts)
    return dict(obs=np.stack(frames), actions=np.asarray(acts, np.int64),
                rewards=np.asarray(rews, np.float32),
                term=np.array([e[0] for e in ends]), trunc=np.array([e[1] for e in ends]),
                infos={}), T


def test_atari_export_lossless_and_10x_smaller_than_minari_jpeg(tmp_path, minari_root):
    eps = [pong_frames(700, seed=s)[0] for s in (0, 1)]
    obs_sp, act = spaces.Box(0, 255, (84, 84), np.uint8), spaces.Discrete(6)
    spec = es.Spec.from_spaces(obs_sp, act, frame_stack=4)
    assert spec.fields["obs"].stack == 4 and spec.fields["obs"].shape == (84, 84)
    rows = sum(len(e["rewards"]) + 1 for e in eps)
    store = es.create(tmp_path / "pong.zarr", spec, es.round_capacity(rows))
    for e in eps:
        store.extend({"obs": e["obs"][:-1], "next_obs": e["obs"][1:], "action": e["actions"],
                      "reward": e["rewards"], "terminated": e["term"], "truncated": e["trunc"]})
    store.flush()

    # default: one frame per observation, exact
    out = export_minari(store, "expstore/pong-v0", compare_jpeg=True)
    ds = minari.load_dataset("expstore/pong-v0")
    assert ds.observation_space == obs_sp
    assert_minari_episodes(ds, eps, with_infos=False)
    # stacked=True: what FrameStackObservation(padding_type="reset") returns
    export_minari(store, "expstore/pong-stacked-v0", stacked=True)
    dss = minari.load_dataset("expstore/pong-stacked-v0")
    assert dss.observation_space.shape == (4, 84, 84)
    for g, e in zip(dss.iterate_episodes(), eps, strict=True):
        f = e["obs"]
        want = np.stack([f[np.maximum(np.arange(len(f)) - 3 + j, 0)] for j in range(4)], 1)
        np.testing.assert_array_equal(g.observations, want)

    # Minari's own default output of the same episodes: JPEG, lossy
    jp = minari.create_dataset_from_buffers("minari/pong-jpeg-v0", buffers(eps),
                                            observation_space=obs_sp, action_space=act)
    assert jp.storage.metadata["jpeg_encoding"] is True
    lossy = np.concatenate([g.observations for g in jp.iterate_episodes()])
    exact = np.concatenate([e["obs"] for e in eps])
    assert lossy.shape == exact.shape and not np.array_equal(lossy, exact)
    ours = pathlib.Path(out.path) / "main_data.hdf5"
    theirs = minari_root / "minari/pong-jpeg-v0/data/main_data.hdf5"
    ratio = theirs.stat().st_size / ours.stat().st_size
    assert ratio >= 10, f"episode data: Minari JPEG {theirs.stat().st_size} B, ours " \
                        f"{ours.stat().st_size} B ({ratio:.1f}x)"
    # compare_jpeg reports Minari's JPEG payload of the same frames
    assert out.image_nbytes == exact.nbytes
    assert 0.8 < out.jpeg_nbytes / theirs.stat().st_size < 1.0

    # jpeg_encoding=True: Minari's own lossy writer, loadable, same pixels as Minari's
    export_minari(store, "expstore/pong-jpeg-v0", jpeg_encoding=True)
    ours_jpeg = np.concatenate([g.observations for g in
                                minari.load_dataset("expstore/pong-jpeg-v0").iterate_episodes()])
    np.testing.assert_array_equal(ours_jpeg, lossy)
    store.close()


# -- import --------------------------------------------------------------------------------
@pytest.mark.parametrize("data_format", FORMATS)
def test_import_dataset_written_by_minari(tmp_path, data_format):
    """create_dataset_from_buffers (Dict obs with an image, nested infos, seeds)."""
    rng = np.random.default_rng(5)
    obs_sp = spaces.Dict({"img": spaces.Box(0, 255, (40, 36), np.uint8),
                          "vec": spaces.Box(-2.0, 2.0, (3,), np.float32)})
    act = spaces.Box(-1.0, 1.0, (2,), np.float32)
    eps = make_episodes(obs_sp, act, [9, 4, 15], rng)
    for e in eps:
        e["rewards"] = e["rewards"].astype(np.float64)
    bufs = buffers(eps, seed=True)
    if data_format == "arrow":
        bufs = [EpisodeBuffer(observations=b.observations, actions=b.actions,
                              rewards=b.rewards, terminations=b.terminations,
                              truncations=b.truncations, seed=b.seed,
                              infos=lists_for_scalars(b.infos)) for b in bufs]
    minari.create_dataset_from_buffers("ext/dict-v1", bufs, observation_space=obs_sp,
                                       action_space=act, data_format=data_format,
                                       jpeg_encoding=False)
    store = import_minari("ext/dict-v1", tmp_path / "s.zarr")
    assert store.spec.fields["reward"].dtype == np.float64  # Minari's reward dtype kept
    assert set(store.spec.fields) >= {"obs.img", "obs.vec", "info.lives", "info.vel",
                                      "info.stats.ok"}
    assert store.episodes_written == 3 and len(store) == 9 + 4 + 15 + 3
    assert_store_holds(store, eps)
    store.close()
    # reopened from disk (committed), read-only
    with es.open(tmp_path / "s.zarr") as ro:
        assert_store_holds(ro, eps)


def test_import_jpeg_dataset_gets_minari_pixels(tmp_path):
    """A JPEG-encoded Minari dataset imports the pixels Minari decodes."""
    f, _ = pong_frames(120)
    obs_sp, act = spaces.Box(0, 255, (84, 84), np.uint8), spaces.Discrete(6)
    minari.create_dataset_from_buffers("ext/jpeg-v0", buffers([f]), observation_space=obs_sp,
                                       action_space=act)
    decoded = next(minari.load_dataset("ext/jpeg-v0").iterate_episodes()).observations
    assert not np.array_equal(decoded, f["obs"])
    store = import_minari("ext/jpeg-v0", tmp_path / "s.zarr")
    assert_store_holds(store, [{**f, "obs": decoded, "rewards": f["rewards"]}])


def test_import_datacollector(tmp_path):
    pytest.importorskip("jax", reason="minari's DataCollector needs jax (minari[create])")

    class Env(gym.Env):
        observation_space = spaces.Tuple((spaces.Box(-1.0, 1.0, (2,), np.float32),
                                          spaces.Discrete(3)))
        action_space = spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return self.observation_space.sample(), {"t": 0, "v": np.zeros(2, np.float32)}

        def step(self, a):
            self.t += 1
            info = {"t": self.t, "v": np.full(2, self.t, np.float32)}
            return self.observation_space.sample(), float(a), self.t >= 6, False, info

    env = minari.DataCollector(Env(), record_infos=True)
    env.reset(seed=3)
    for _ in range(15):  # 2 terminated episodes + one cut (DataCollector truncates it)
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            env.reset()
    env.create_dataset("ext/collector-v0")
    ds = minari.load_dataset("ext/collector-v0")
    eps = [dict(obs=e.observations, actions=e.actions, rewards=e.rewards,
                term=e.terminations, trunc=e.truncations, infos=e.infos)
           for e in ds.iterate_episodes()]
    assert len(eps) == 3 and eps[-1]["trunc"][-1]
    store = import_minari("ext/collector-v0", tmp_path / "s.zarr")
    assert_store_holds(store, eps)


def test_import_frame_stack(tmp_path):
    f, T = pong_frames(60)
    frames = f["obs"]
    stacks = np.stack([frames[np.maximum(np.arange(T + 1) - 3 + j, 0)] for j in range(4)], 1)
    obs_sp, act = spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6)
    ep = {**f, "obs": stacks}
    minari.create_dataset_from_buffers("ext/stacked-v0", buffers([ep]), observation_space=obs_sp,
                                       action_space=act)
    store = import_minari("ext/stacked-v0", tmp_path / "s.zarr", frame_stack=4)
    field = store.spec.fields["obs"]
    assert (field.shape, field.stack) == ((84, 84), 4)  # one frame per row
    np.testing.assert_array_equal(store.read("obs", np.arange(T + 1)), frames)
    tr = store.transitions(np.arange(T))
    np.testing.assert_array_equal(tr["obs"], stacks[:-1])
    np.testing.assert_array_equal(tr["next_obs"], stacks[1:])
    # and back: stacked=True gives the original dataset's observations and space
    export_minari(store, "expstore/restacked-v0", stacked=True)
    back = minari.load_dataset("expstore/restacked-v0")
    assert back.observation_space == obs_sp
    np.testing.assert_array_equal(next(back.iterate_episodes()).observations, stacks)
    store.close()

    bad = stacks.copy()
    bad[10, 1] = 0  # a stack that is not the previous one shifted by a frame
    minari.create_dataset_from_buffers("ext/badstack-v0", buffers([{**ep, "obs": bad}]),
                                       observation_space=obs_sp, action_space=act)
    with pytest.raises(es.ValidationError, match=r"episode 0.*step 10.*frame_stack=None"):
        import_minari("ext/badstack-v0", tmp_path / "bad.zarr", frame_stack=4)
    whole = import_minari("ext/badstack-v0", tmp_path / "whole.zarr")
    assert whole.spec.fields["obs"].shape == (4, 84, 84)
    np.testing.assert_array_equal(whole.read("obs", np.arange(T + 1)), bad)


@pytest.mark.parametrize("data_format", FORMATS)
def test_round_trip_import_export_import(tmp_path, data_format):
    rng = np.random.default_rng(9)
    obs_sp = OBS_SPACES["tuple"]
    act = spaces.MultiDiscrete([3, 4], start=[1, -2])
    eps = make_episodes(obs_sp, act, [5, 11, 3], rng, nested=data_format == "hdf5")
    for e in eps:
        e["rewards"] = e["rewards"].astype(np.float64)
    bufs = buffers(eps)
    if data_format == "arrow":
        bufs = [EpisodeBuffer(observations=b.observations, actions=b.actions,
                              rewards=b.rewards, terminations=b.terminations,
                              truncations=b.truncations, infos=lists_for_scalars(b.infos))
                for b in bufs]
    minari.create_dataset_from_buffers("ext/tuple-v0", bufs, observation_space=obs_sp,
                                       action_space=act, data_format=data_format, env=None)
    a = import_minari("ext/tuple-v0", tmp_path / "a.zarr")
    out = export_minari(a, "ext/tuple-v1", data_format=data_format)
    back = minari.load_dataset("ext/tuple-v1")
    assert back.observation_space == obs_sp  # the spaces the store remembered, bounds too
    assert back.action_space == act
    assert_minari_episodes(back, eps)
    b = import_minari(out.path, tmp_path / "b.zarr")  # by directory this time
    assert b.spec.same_as(a.spec)
    n = len(a)
    assert len(b) == n
    for name in a.spec.fields:
        np.testing.assert_array_equal(b.read(name, np.arange(n)), a.read(name, np.arange(n)),
                                      err_msg=name)
    np.testing.assert_array_equal(b.index.flags[:n], a.index.flags[:n])
    np.testing.assert_array_equal(b.index.episode_step[:n], a.index.episode_step[:n])


# -- bad input -----------------------------------------------------------------------------
def test_import_errors(tmp_path, minari_root):
    with pytest.raises(FileNotFoundError, match=r"'nope/missing-v0' not found.*metadata.json"):
        import_minari("nope/missing-v0", tmp_path / "x.zarr")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a Minari dataset directory"):
        import_minari(tmp_path / "empty", tmp_path / "x.zarr")
    assert not (tmp_path / "x.zarr").exists()

    rng = np.random.default_rng(2)
    box, act = spaces.Box(-1.0, 1.0, (2,), np.float32), spaces.Discrete(2)
    nested = spaces.Dict({"a": spaces.Dict({"b": box})})
    eps = make_episodes(nested, act, [3], rng, infos=False)
    minari.create_dataset_from_buffers("ext/nested-v0", buffers(eps), observation_space=nested,
                                       action_space=act)
    with pytest.raises(es.SpecError, match=r"observation space: Dict entry 'a' is a Dict"):
        import_minari("ext/nested-v0", tmp_path / "x.zarr")
    text = spaces.Text(5)
    minari.create_dataset_from_buffers(
        "ext/text-v0", [EpisodeBuffer(observations=["ab", "cd"], actions=np.zeros(1, np.int64),
                                      rewards=[0.0], terminations=[True], truncations=[False])],
        observation_space=text, action_space=act)
    with pytest.raises(es.SpecError, match="space Text is not supported"):
        import_minari("ext/text-v0", tmp_path / "x.zarr")
    assert not (tmp_path / "x.zarr").exists()

    # an episode that does not end with terminated/truncated
    eps = make_episodes(box, act, [4, 3], rng)
    eps[1]["term"][-1] = eps[1]["trunc"][-1] = False
    minari.create_dataset_from_buffers("ext/open-v0", buffers(eps), observation_space=box,
                                       action_space=act)
    with pytest.raises(es.ValidationError, match=r"episode 1: the last step is neither"):
        import_minari("ext/open-v0", tmp_path / "o.zarr")
    s = import_minari("ext/open-v0", tmp_path / "o2.zarr", truncate_unfinished=True)
    assert s.episodes_written == 2
    # a flag before the last step
    eps = make_episodes(box, act, [4], rng)
    eps[0]["term"][1] = True
    minari.create_dataset_from_buffers("ext/early-v0", buffers(eps), observation_space=box,
                                       action_space=act)
    with pytest.raises(es.ValidationError, match=r"episode 0: step 1 of 4 is terminated"):
        import_minari("ext/early-v0", tmp_path / "e.zarr")
    # infos with one value per step (not reset + steps)
    eps = make_episodes(box, act, [4], rng, nested=False)
    eps[0]["infos"] = {"x": np.arange(4)}
    minari.create_dataset_from_buffers("ext/infos-v0", buffers(eps), observation_space=box,
                                       action_space=act)
    with pytest.raises(es.ValidationError, match=r"info 'x': expected 5 values.*infos=False"):
        import_minari("ext/infos-v0", tmp_path / "i.zarr")
    s = import_minari("ext/infos-v0", tmp_path / "i2.zarr", infos=False)
    assert "info.x" not in s.spec.fields and s.episodes_written == 1
    # capacity too small, store exists
    with pytest.raises(ValueError, match=r"capacity: 4 rows < 5"):
        import_minari("ext/infos-v0", tmp_path / "c.zarr", capacity=4, shard_rows=1)
    with pytest.raises(FileExistsError):
        import_minari("ext/infos-v0", tmp_path / "i2.zarr", infos=False)


def test_export_errors(tmp_path, minari_root, monkeypatch):
    rng = np.random.default_rng(4)
    box, act = spaces.Box(-1.0, 1.0, (2,), np.float32), spaces.Discrete(2)
    eps = make_episodes(box, act, [3, 5], rng)
    store = write_store(tmp_path / "s.zarr", box, act, eps)
    for bad in ("no-version", "x/y", "a b-v0"):
        with pytest.raises(ValueError, match="expected '\\(namespace/\\)name-v<version>'"):
            export_minari(store, bad)
    with pytest.raises(ValueError, match="data_format"):
        export_minari(store, "expstore/x-v0", data_format="parquet")
    with pytest.raises(ValueError, match="jpeg_encoding=True is Minari's own"):
        export_minari(store, "expstore/x-v0", jpeg_encoding=True, compression="gzip")
    with pytest.raises(ValueError, match="compression: hdf5 supports"):
        export_minari(store, "expstore/x-v0", compression="zstd")
    if HAS_ARROW:
        with pytest.raises(es.SpecError, match=r"infos \['stats'\].*nested"):
            export_minari(store, "expstore/x-v0", data_format="arrow")
    # a failing write leaves no dataset and no temporary directory behind
    calls = []

    def boom(self, ep):
        calls.append(ep.id)
        raise OSError("disk full")

    with monkeypatch.context() as m:
        m.setattr(minari_write.Hdf5Writer, "write", boom)
        with pytest.raises(OSError, match="disk full"):
            export_minari(store, "expstore/x-v0")
    assert calls == [0]
    assert not (minari_root / "expstore" / "x-v0").exists()
    assert export_minari(store, "expstore/x-v0").episodes == 2
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export_minari(store, "expstore/x-v0")
    out = export_minari(store, "expstore/x-v0", overwrite=True, infos=False)
    ds = minari.load_dataset("expstore/x-v0")
    assert_minari_episodes(ds, eps, with_infos=False)
    assert next(ds.iterate_episodes()).infos == {}
    assert [p.name for p in pathlib.Path(out.path).parent.iterdir()] == ["data"]
    store.close()
    # a store with no complete episode
    spec = es.Spec.from_spaces(box, act)
    empty = es.create(tmp_path / "e.zarr", spec, 128, shard_rows=16)
    empty.extend({"obs": np.zeros((3, 2), np.float32), "action": np.zeros(3, np.int64),
                  "reward": np.zeros(3), "terminated": np.zeros(3, bool),
                  "truncated": np.zeros(3, bool)})
    with pytest.raises(ValueError, match="no complete episode"):
        export_minari(empty, "expstore/empty-v0")
    # by URL: opened read-only and closed again
    assert export_minari(str(tmp_path / "s.zarr"), "expstore/url-v0").episodes == 2


def test_env_spec_and_metadata(tmp_path):
    """The env_spec of an imported dataset comes back on export; env=/metadata= set them."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(8)
    eps = make_episodes(env.observation_space, env.action_space, [6, 4], rng, infos=False)
    minari.create_dataset_from_buffers("ext/cartpole-v0", buffers(eps), env="CartPole-v1",
                                       algorithm_name="random", author="someone")
    store = import_minari("ext/cartpole-v0", tmp_path / "s.zarr")
    export_minari(store, "expstore/cartpole-v0")
    ds = minari.load_dataset("expstore/cartpole-v0")
    assert ds.spec.env_spec.id == "CartPole-v1"
    assert ds.observation_space == env.observation_space  # bounds restored
    assert ds.recover_environment().observation_space == env.observation_space
    assert_minari_episodes(ds, eps, with_infos=False)

    plain = write_store(tmp_path / "p.zarr", env.observation_space, env.action_space, eps)
    export_minari(plain, "expstore/plain-v0",
                  metadata={"author": "me", "description": "made by a test"})
    meta = minari.load_dataset("expstore/plain-v0").storage.metadata
    assert meta["author"] == {"me"} and meta["description"] == "made by a test"
    assert "env_spec" not in meta
    export_minari(plain, "expstore/withenv-v0", env="CartPole-v1")
    assert minari.load_dataset("expstore/withenv-v0").spec.env_spec.id == "CartPole-v1"


@pytest.mark.parametrize("stacked", [False, True])
def test_frame_stack_survives_a_round_trip_and_open_steps_are_named(tmp_path, stacked):
    e, T = pong_frames(300, seed=3)
    spec = es.Spec.from_spaces(spaces.Box(0, 255, (84, 84), np.uint8), spaces.Discrete(6),
                               frame_stack=4)
    store = es.create(tmp_path / "p.zarr", spec, 1024)
    store.extend({"obs": e["obs"][:-1], "next_obs": e["obs"][1:], "action": e["actions"],
                  "reward": e["rewards"], "terminated": e["term"], "truncated": e["trunc"]})
    for t in range(5):  # an episode left open
        store.add(e["obs"][t], 0, 0.0, e["obs"][t + 1], False, False)
    store.flush()
    out = export_minari(store, "expstore/pong-rt-v0", stacked=stacked)
    text = str(out)
    assert text.startswith("minari export: ") and "MinariExport(" not in text
    assert "5 step(s) not in a complete episode left out" in text
    assert out.steps + 5 == store.num_transitions and out.rows == T + 1
    back = import_minari("expstore/pong-rt-v0", tmp_path / "b.zarr")
    assert back.spec.fields["obs"].stack == 4 and back.spec.fields["obs"].shape == (84, 84)
    b = back.sample(8)
    assert b["obs"].shape == (8, 4, 84, 84)
    ep = back.episode(0)
    np.testing.assert_array_equal(ep["obs"], store.episode(0)["obs"])
    back.close()
    plain = import_minari("expstore/pong-rt-v0", tmp_path / "c.zarr", frame_stack=None)
    assert plain.spec.fields["obs"].stack is None
    plain.close()
    store.close()
