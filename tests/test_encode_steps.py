"""rows.encode_steps, and the write kernel's path to the same rows
(step_kernel_path.encode_steps), against the row model written out step by step (rows.py
docstring)."""

from __future__ import annotations

import numpy as np
import pytest

from expstore import step_kernel_path
from expstore.rows import FLAG_FIRST, FLAG_LAST, FLAG_TERMINATED, FLAG_TRUNCATED
from expstore.rows import encode_steps as encode_steps_numpy
from expstore.storage.native import write_kernel

ENCODERS = {"numpy": encode_steps_numpy, "kernel": step_kernel_path.encode_steps}


def rows_one_by_one(values, names, open_step, first_step, ends):
    """Each step's row, then a final row after each step of ``ends``: the rows.py model."""
    out = {n: [] for n in [*names, "_episode_step", "_flags"]}
    ep = open_step
    for t in range(len(values["reward"])):
        for n in names:
            out[n].append(values[n][t])
        flag = (FLAG_FIRST if ep == 0 else 0) | (FLAG_TERMINATED if values["terminated"][t]
                                                  else 0) | (
            FLAG_TRUNCATED if values["truncated"][t] else 0)
        out["_episode_step"].append(ep)
        out["_flags"].append(flag)
        ep += 1
        if ends[t]:
            for n in names:
                nxt = values.get("next_" + n)
                out[n].append(np.zeros_like(values[n][t]) if nxt is None else nxt[t])
            out["_episode_step"].append(ep)
            out["_flags"].append(FLAG_LAST | (FLAG_FIRST if ep == 0 else 0))
            ep = 0
    return out, ep


@pytest.mark.parametrize("path", ENCODERS)
@pytest.mark.parametrize("seed", range(4))
def test_encode_steps_matches_the_row_model(seed, path):
    if path == "kernel" and write_kernel() is None:
        pytest.skip("the write kernel was not built")
    encode_steps = ENCODERS[path]
    rng = np.random.default_rng(seed)
    names = ["obs", "action", "reward", "terminated", "truncated", "cost", "frame"]
    for _ in range(300):
        T = int(rng.integers(0, 10)) if rng.random() < 0.8 else int(rng.integers(10, 200))
        p = float(rng.choice([0.0, 0.15, 0.5]))  # 0.0: no final row (the values are the rows)
        term = rng.random(T) < p
        trunc = (rng.random(T) < p) & ~term
        vals = {"obs": rng.random((T, 3)).astype(np.float32),
                "next_obs": rng.random((T, 3)).astype(np.float32),
                "action": rng.integers(0, 5, T), "reward": rng.random(T).astype(np.float32),
                "terminated": term, "truncated": trunc, "cost": rng.random(T),
                # a non-contiguous view (a stacked field's newest frame)
                "frame": rng.integers(0, 255, (T, 4, 2, 3), dtype=np.uint8)[:, -1]}
        if rng.random() < 0.5:
            vals["next_cost"] = rng.random(T)
        ends = None if rng.random() < 0.5 else term | trunc | (rng.random(T) < 0.2)
        open_step, first = int(rng.integers(0, 3)), int(rng.integers(0, 100))
        rows, next_open, n_final = encode_steps(vals, names, open_step, first, ends)
        want, want_open = rows_one_by_one(vals, names, open_step, first,
                                          term | trunc if ends is None else ends)
        n = len(want["_flags"])
        assert (next_open, n_final) == (want_open, n - T)
        np.testing.assert_array_equal(rows["_step_id"], np.arange(first, first + n))
        for k, v in want.items():
            assert rows[k].dtype == (np.int32 if k == "_episode_step" else np.uint8
                                     if k == "_flags" else vals[k].dtype), k
            np.testing.assert_array_equal(rows[k], np.array(v).reshape(rows[k].shape), k)


def test_store_extend_takes_the_kernel_path_for_final_rows(tmp_path, monkeypatch):
    """A batch with an episode end is encoded by one ``step_rows`` call, and the store
    gives back the rows of the model."""
    import expstore as es
    from expstore.storage.native import kernels

    kernel = write_kernel()
    if kernel is None:
        pytest.skip("the write kernel was not built")
    calls = []

    class Spy:
        def __getattr__(self, name):
            return getattr(kernel, name)

        def step_rows(self, *args):
            calls.append(len(args[0]))
            return kernel.step_rows(*args)

    monkeypatch.setattr(kernels, "write", Spy())
    store = es.create(tmp_path / "s.zarr", es.Spec.create(obs=es.Field((3,), np.float32),
                                                       action=es.Field((), np.int64)),
                      capacity=1024, shard_rows=64)
    T = 10
    obs = np.arange(T * 3, dtype=np.float32).reshape(T, 3)
    term = np.zeros(T, bool)
    term[4] = True
    next_obs = np.concatenate([obs[1:], obs[-1:] + 1])
    next_obs[4] = obs[4] + 100  # the episode's final observation
    store.extend({"obs": obs, "next_obs": next_obs, "action": np.zeros(T, np.int64),
                  "reward": np.arange(T, dtype=np.float32), "terminated": term,
                  "truncated": np.zeros(T, bool)})
    store.flush()
    assert calls, "the kernel was not called"
    reopened = es.open(tmp_path / "s.zarr")
    got = {n: reopened.read(n, np.arange(T + 1))
           for n in ("obs", "reward", "_episode_step", "_flags")}
    store.close()
    reopened.close()
    np.testing.assert_array_equal(got["obs"][4], obs[4])
    np.testing.assert_array_equal(got["obs"][5], obs[4] + 100)  # the final row
    np.testing.assert_array_equal(got["obs"][6], obs[5])
    np.testing.assert_array_equal(got["reward"][[4, 5, 6]], [4, 0, 5])
    np.testing.assert_array_equal(got["_episode_step"], [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4])
    assert got["_flags"][5] == FLAG_LAST and got["_flags"][4] == FLAG_TERMINATED
    assert got["_flags"][6] == FLAG_FIRST


def test_step_rows_refuses_mismatched_buffers():
    kernel = write_kernel()
    if kernel is None:
        pytest.skip("the write kernel was not built")
    src = np.zeros((4, 2), np.float32)
    ends = np.array([False, True, False, False])
    with pytest.raises(ValueError, match="one size"):
        kernel.step_rows((src,), (None,), (np.zeros((4, 2), np.float32),), ends, ends, ends,
                         np.zeros(5, np.int32), np.zeros(5, np.uint8), 0)
    with pytest.raises(ValueError, match="one item per row"):
        kernel.step_rows((src,), (None,), (np.zeros((5, 2), np.float32),), ends, ends, ends,
                         np.zeros(4, np.int32), np.zeros(4, np.uint8), 0)
