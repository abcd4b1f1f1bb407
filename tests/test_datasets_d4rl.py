"""D4RL HDF5 files <-> expstore. Reference files are written here with h5py in D4RL's layout."""

from __future__ import annotations

import numpy as np
import pytest

import expstore as es
from expstore.datasets import export_d4rl, import_d4rl, lane_rows
from expstore.errors import DatasetFormatError

h5py = pytest.importorskip("h5py")

ENDS = {99: "terminal", 250: "timeout", 400: "terminal", 731: "timeout"}
N = 1000
HIDDEN_RESET = 600  # next_observations[600] != observations[601], no flag


def d4rl_arrays(seed: int = 0, n: int = N) -> dict[str, np.ndarray]:
    """Episodes of a random walk; each episode's true final obs differs from the next reset."""
    rng = np.random.default_rng(seed)
    obs = np.zeros((n, 5), np.float32)
    nxt = np.zeros((n, 5), np.float32)
    o = rng.normal(size=5).astype(np.float32)
    for i in range(n):
        obs[i] = o
        o = (o + rng.normal(size=5) * 0.1).astype(np.float32)
        nxt[i] = o
        if i in ENDS or i == HIDDEN_RESET:
            o = rng.normal(size=5).astype(np.float32)
    return {
        "observations": obs, "next_observations": nxt,
        "actions": rng.uniform(-1, 1, (n, 3)).astype(np.float32),
        "rewards": rng.normal(size=n).astype(np.float32),
        "terminals": np.isin(np.arange(n), [k for k, v in ENDS.items() if v == "terminal"]),
        "timeouts": np.isin(np.arange(n), [k for k, v in ENDS.items() if v == "timeout"]),
        "infos/qpos": rng.normal(size=(n, 2)),
        "infos/goal/xy": rng.normal(size=(n, 2)).astype(np.float32),
    }


def write_h5(path, arrays: dict[str, np.ndarray], drop: tuple[str, ...] = ()) -> None:
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            if k not in drop:
                f.create_dataset(k, data=v, chunks=True)
        f["metadata/algorithm"] = "SAC"
        f["metadata/policy/fc0/weight"] = np.ones((4, 4), np.float32)


def file_transitions(store: es.Store) -> dict[str, np.ndarray]:
    """Every transition of a one-lane store in row order (non-final rows with a next row)."""
    lr = lane_rows(store, 0)
    rows = lr.rows[store.index.valid(lr.rows, store.history, 1)]
    return store.transitions(rows)


def test_import_keeps_every_transition(tmp_path):
    a = d4rl_arrays()
    write_h5(tmp_path / "d.hdf5", a)
    summary = import_d4rl(tmp_path / "d.hdf5", tmp_path / "s.zarr", block_rows=128)
    assert any("cut" in n for n in summary.notes) and any("metadata" in n for n in summary.notes)
    store = es.open(tmp_path / "s.zarr")
    assert set(store.spec.fields) == {"obs", "action", "reward", "terminated", "truncated",
                                      "infos.qpos", "infos.goal.xy"}
    tr = file_transitions(store)
    assert len(tr["obs"]) == N  # every row of the file is a transition of the store
    np.testing.assert_array_equal(tr["obs"], a["observations"])
    np.testing.assert_array_equal(tr["next_obs"], a["next_observations"])
    np.testing.assert_array_equal(tr["action"], a["actions"])
    np.testing.assert_array_equal(tr["reward"], a["rewards"])
    np.testing.assert_array_equal(tr["infos.qpos"], a["infos/qpos"])
    np.testing.assert_array_equal(tr["terminated"], a["terminals"])
    trunc = a["timeouts"].copy()
    trunc[[HIDDEN_RESET, N - 1]] = True  # the hidden reset and the file's unfinished end
    np.testing.assert_array_equal(tr["truncated"], trunc)
    assert store.episodes_written == len(ENDS) + 2
    store.close()


def test_round_trip(tmp_path):
    a = d4rl_arrays(seed=1)
    a["timeouts"][-1] = True
    write_h5(tmp_path / "d.hdf5", a)
    import_d4rl(tmp_path / "d.hdf5", tmp_path / "s1.zarr", block_rows=100)
    out = export_d4rl(tmp_path / "s1.zarr", tmp_path / "e.hdf5", block_rows=77)
    assert out.steps == N
    with h5py.File(tmp_path / "e.hdf5") as f:
        for k, v in a.items():
            want = v.copy()
            if k == "timeouts":
                want[HIDDEN_RESET] = True
            np.testing.assert_array_equal(f[k][()], want, err_msg=k)
    import_d4rl(tmp_path / "e.hdf5", tmp_path / "s2.zarr")
    s1, s2 = es.open(tmp_path / "s1.zarr"), es.open(tmp_path / "s2.zarr")
    r1, r2 = lane_rows(s1, 0), lane_rows(s2, 0)
    np.testing.assert_array_equal(r1.flags, r2.flags)
    np.testing.assert_array_equal(r1.episode_step, r2.episode_step)
    for name in s1.spec.fields:
        np.testing.assert_array_equal(s1.read(name, r1.rows, r1.steps),
                                      s2.read(name, r2.rows, r2.steps), err_msg=name)
    s1.close()
    s2.close()


def test_without_next_observations(tmp_path):
    """Like d4rl.qlearning_dataset: a timeout step has no next obs and is dropped."""
    a = d4rl_arrays(seed=2)
    write_h5(tmp_path / "d.hdf5", a, drop=("next_observations",))
    summary = import_d4rl(tmp_path / "d.hdf5", tmp_path / "s.zarr")
    timeouts = [k for k, v in ENDS.items() if v == "timeout"]
    assert summary.steps == N - len(timeouts) - 1  # timeout steps and the unfinished last one
    store = es.open(tmp_path / "s.zarr")
    tr = file_transitions(store)
    keep = np.ones(N, bool)
    keep[timeouts + [N - 1]] = False
    np.testing.assert_array_equal(tr["obs"], a["observations"][keep])
    np.testing.assert_array_equal(tr["action"], a["actions"][keep])
    # the next obs inside episodes is the next row's obs; a timeout's predecessor gets
    # the dropped row's obs and bootstraps (truncated); terminals end with zeros
    nxt = np.concatenate([a["observations"][1:], np.zeros((1, 5), np.float32)])[keep]
    term = a["terminals"][keep]
    np.testing.assert_array_equal(tr["next_obs"][~term], nxt[~term])
    assert not tr["next_obs"][term].any()
    trunc = np.zeros(N, bool)
    trunc[[t - 1 for t in timeouts] + [N - 2]] = True
    np.testing.assert_array_equal(tr["truncated"], trunc[keep])
    store.close()


def test_export_of_open_episode_marks_a_timeout(tmp_path):
    spec = es.Spec.create(obs=es.Field((2,), np.float32), action=es.Field((), np.int64))
    with es.create(tmp_path / "s.zarr", spec, capacity=256) as st:
        for t in range(5):
            st.add(np.full(2, t, np.float32), t, 1.0, np.full(2, t + 1, np.float32), t == 2,
                   False)
    out = export_d4rl(tmp_path / "s.zarr", tmp_path / "e.hdf5")
    with h5py.File(tmp_path / "e.hdf5") as f:
        np.testing.assert_array_equal(f["observations"][:, 0], [0, 1, 2, 3])
        np.testing.assert_array_equal(f["next_observations"][:, 0], [1, 2, 3, 4])
        np.testing.assert_array_equal(f["terminals"][()], [0, 0, 1, 0])
        np.testing.assert_array_equal(f["timeouts"][()], [0, 0, 0, 1])
    assert out.steps == 4 and out.episodes == 1


def test_bad_files(tmp_path):
    a = d4rl_arrays(seed=3)
    write_h5(tmp_path / "noact.hdf5", a, drop=("actions",))
    with pytest.raises(DatasetFormatError, match=r"noact\.hdf5: missing dataset 'actions'"):
        import_d4rl(tmp_path / "noact.hdf5", tmp_path / "s.zarr")
    b = dict(a, rewards=a["rewards"][:-3])
    write_h5(tmp_path / "short.hdf5", b)
    with pytest.raises(DatasetFormatError, match=r"short\.hdf5.*997"):
        import_d4rl(tmp_path / "short.hdf5", tmp_path / "s.zarr")
    c = dict(a, terminals=np.full(N, 2, np.int8))
    write_h5(tmp_path / "flags.hdf5", c)
    with pytest.raises(DatasetFormatError, match=r"flags\.hdf5/terminals: expected 1000 "):
        import_d4rl(tmp_path / "flags.hdf5", tmp_path / "s.zarr")
    (tmp_path / "junk.hdf5").write_bytes(b"not hdf5 at all")
    with pytest.raises(DatasetFormatError, match=r"junk\.hdf5: not a readable HDF5"):
        import_d4rl(tmp_path / "junk.hdf5", tmp_path / "s.zarr")
    assert not (tmp_path / "s.zarr").exists()


def atari_store(url, steps: int = 1200, stack: int = 4, padding: str = "zero") -> es.Store:
    """Low-entropy 84x84 frames (like Atari screens), episodes of 250 steps, one left open."""
    spec = es.Spec.create(obs=es.Field((84, 84), np.uint8, stack=stack, padding=padding),
                          action=es.Field((), np.int64))
    st = es.create(url, spec, capacity=4096)
    def frame(t: int) -> np.ndarray:
        f = np.zeros((84, 84), np.uint8)
        f[t % 84, :] = 200
        f[:, (7 * t) % 84] = 90
        return f

    for t in range(steps):
        st.add(frame(t), t % 6, 1.0, frame(t + 1), terminated=t % 250 == 249, truncated=False)
    st.flush()
    return st


def test_export_is_compressed_keeps_stack_and_says_what_it_left_out(tmp_path):
    st = atari_store(tmp_path / "s.zarr")
    want = st.num_transitions
    st.close()
    out = export_d4rl(tmp_path / "s.zarr", tmp_path / "a.hdf5")
    raw = export_d4rl(tmp_path / "s.zarr", tmp_path / "raw.hdf5", compression=None)
    assert raw.steps == want - 1
    size, raw_size = (tmp_path / "a.hdf5").stat().st_size, (tmp_path / "raw.hdf5").stat().st_size
    assert size * 10 < raw_size and out.bytes_out == size
    # the open episode's newest step has no next observation: left out, and said so
    assert out.steps == want - 1
    assert any("1 step(s) of open episodes left out" in n for n in out.notes), out.notes
    assert "1 step(s) of open episodes left out" in str(out)
    with h5py.File(tmp_path / "a.hdf5") as f:
        assert f["observations"].compression == "gzip"
    back = import_d4rl(tmp_path / "a.hdf5", tmp_path / "b.zarr")
    assert any("stack=4 restored" in n for n in back.notes)
    b = es.open(tmp_path / "b.zarr")
    assert b.spec.fields["obs"].stack == 4 and b.spec.fields["obs"].padding == "zero"
    batch = b.sample(16)
    assert batch["obs"].shape == (16, 4, 84, 84) and batch["next_obs"].shape == (16, 4, 84, 84)
    assert b.num_episodes == 5  # 4 finished + the open one, ended as a timeout
    b.close()
    single = import_d4rl(tmp_path / "a.hdf5", tmp_path / "c.zarr", stack=None)
    assert not single.notes or all("stack" not in n for n in single.notes)
    with es.open(tmp_path / "c.zarr") as c:
        assert c.spec.fields["obs"].stack is None and c.sample(2)["obs"].shape == (2, 84, 84)


def test_import_stack_option_without_expstore_attributes(tmp_path):
    a = d4rl_arrays()
    write_h5(tmp_path / "d.hdf5", a)
    import_d4rl(tmp_path / "d.hdf5", tmp_path / "s.zarr", stack=3, padding="reset")
    with es.open(tmp_path / "s.zarr") as st:
        assert st.spec.fields["obs"].stack == 3 and st.sample(4)["obs"].shape == (4, 3, 5)
    with pytest.raises(ValueError, match="stack: expected 'auto', None or an int >= 1"):
        import_d4rl(tmp_path / "d.hdf5", tmp_path / "t.zarr", stack=0)


def test_export_refuses_to_replace_a_file_without_overwrite(tmp_path):
    atari_store(tmp_path / "s.zarr", steps=300).close()
    (tmp_path / "a.hdf5").write_bytes(b"keep me")
    with pytest.raises(FileExistsError, match="overwrite=True, or --overwrite"):
        export_d4rl(tmp_path / "s.zarr", tmp_path / "a.hdf5")
    assert (tmp_path / "a.hdf5").read_bytes() == b"keep me"
    export_d4rl(tmp_path / "s.zarr", tmp_path / "a.hdf5", overwrite=True)
    assert h5py.is_hdf5(tmp_path / "a.hdf5")
