"""rows.encode_steps against the row model written out step by step (rows.py docstring)."""

from __future__ import annotations

import numpy as np
import pytest

from expstore.rows import FLAG_FIRST, FLAG_LAST, FLAG_TERMINATED, FLAG_TRUNCATED, encode_steps


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


@pytest.mark.parametrize("seed", range(4))
def test_encode_steps_matches_the_row_model(seed):
    rng = np.random.default_rng(seed)
    names = ["obs", "action", "reward", "terminated", "truncated", "cost"]
    for _ in range(300):
        T = int(rng.integers(0, 10))
        p = float(rng.choice([0.0, 0.15, 0.5]))  # 0.0: no final row (the values are the rows)
        term = rng.random(T) < p
        trunc = (rng.random(T) < p) & ~term
        vals = {"obs": rng.random((T, 3)).astype(np.float32),
                "next_obs": rng.random((T, 3)).astype(np.float32),
                "action": rng.integers(0, 5, T), "reward": rng.random(T).astype(np.float32),
                "terminated": term, "truncated": trunc, "cost": rng.random(T)}
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
