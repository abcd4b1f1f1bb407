"""Execute a :class:`~expstore.sampling.plan.ReadPlan` against storage: rows -> a batch.

Runs wherever the data is read (a DataLoader worker, or the main process). Every row is
read with the lane step the plan expects; a sample any of whose rows was overwritten
meanwhile is dropped and replaced by a spare sample of the plan (or, when spares run
out, by a copy of a delivered sample) and counted in ``stale``. Nothing stale is returned.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..errors import ExpstoreError
from ..sampling.plan import ReadPlan
from ..storage.layout import Layout


class RowSource(Protocol):
    def read(self, name: str, rows: np.ndarray, steps: np.ndarray,
             out: np.ndarray) -> np.ndarray: ...


class StaleBatchError(ExpstoreError):
    """Every sample of a batch was overwritten before it could be read."""


def _read_unique(source: RowSource, layout: Layout, name: str, rows: np.ndarray,
                 steps: np.ndarray, split: int | None = None):
    """Read each distinct row once; return values and ok, both aligned to ``rows``.

    Within one plan a row maps to one step (plans come from one index state). With
    ``split=k`` the values come back as two contiguous arrays: columns ``:k`` and ``k:``.
    """
    f = layout.fields[name]
    flat_r, flat_s = rows.ravel(), steps.ravel()
    uniq, first, inv = np.unique(flat_r, return_index=True, return_inverse=True)
    buf = np.empty((len(uniq), *f.shape), f.dtype)
    good = source.read(name, uniq, flat_s[first], buf)[inv].reshape(rows.shape)
    inv = inv.reshape(rows.shape)
    if split is None:
        return buf[inv], good
    return buf[inv[:, :split]], buf[inv[:, split:]], good


def assemble(plan: ReadPlan, layout: Layout, source: RowSource) -> tuple[dict, int]:
    """Batch dict of numpy arrays for ``plan`` and the number of stale samples replaced.

    Plans of other shapes (sequences, hindsight relabeling) carry their own ``assemble``
    method, which is called instead.
    """
    own = getattr(plan, "assemble", None)
    if own is not None:
        return own(layout, source)
    return _finish(plan, *read_columns(plan, layout, source))


def read_columns(plan: ReadPlan, layout: Layout,
                 source: RowSource) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every column of every sample of ``plan`` (spares included) and which are intact."""
    spec = layout.spec
    n_all = len(plan.rows)
    ok = np.ones(n_all, bool)
    out: dict[str, np.ndarray] = {}
    K = plan.history + 1
    for name in spec.obs_names:
        f = spec.fields[name]
        k = f.stack or 1
        cols = slice(K - k, K)
        rows = np.concatenate([plan.obs_rows[:, cols], plan.next_rows[:, cols]], axis=1)
        steps = np.concatenate([plan.obs_steps[:, cols], plan.next_steps[:, cols]], axis=1)
        obs, nxt, good = _read_unique(source, layout, name, rows, steps, split=k)
        ok &= good.all(axis=1)
        if f.padding == "zero" and f.stack:
            obs[plan.obs_pad[:, cols]] = 0
            nxt[plan.next_pad[:, cols]] = 0
        if not f.stack:
            obs, nxt = obs[:, 0], nxt[:, 0]
        suffix = name[3:]
        out["obs" + suffix] = obs
        out["next_obs" + suffix] = nxt
    anchors = plan.rows
    for name in spec.fields:
        if name in spec.obs_names or name in ("reward", "terminated", "truncated"):
            continue
        vals, good = _read_unique(source, layout, name, anchors, plan.steps)
        ok &= good
        out[name] = vals
    _rewards(plan, layout, source, out, ok)
    return out, ok


def _rewards(plan: ReadPlan, layout: Layout, source: RowSource, out: dict,
             ok: np.ndarray) -> None:
    """Reward (n-step discounted sum) and done flags of the last step in the horizon."""
    L = layout.lane_capacity
    n = plan.n_step
    j = np.arange(n, dtype=np.int64)
    lane, slot = np.divmod(plan.rows, L)
    rows = lane[:, None] * L + (slot[:, None] + j[None, :]) % L
    steps = plan.steps[:, None] + j[None, :]
    mask = j[None, :] < plan.horizon[:, None]
    rows = np.where(mask, rows, plan.rows[:, None])
    steps = np.where(mask, steps, plan.steps[:, None])
    r, good = _read_unique(source, layout, "reward", rows, steps)
    ok &= good.all(axis=1)
    last = np.maximum(plan.horizon - 1, 0)
    take = np.arange(len(plan.rows))
    for name in ("terminated", "truncated"):
        v, g = _read_unique(source, layout, name, rows[take, last], steps[take, last])
        ok &= g
        out[name] = v
    if n == 1:
        out["reward"] = r[:, 0]
        return
    disc = plan.gamma ** j.astype(np.float64)
    out["reward"] = (r.astype(np.float64) * disc * mask).sum(axis=1).astype(r.dtype)
    out["horizon"] = plan.horizon.astype(np.int64)
    out["discount"] = np.where(out["terminated"], 0.0,
                               plan.gamma ** plan.horizon.astype(np.float64)).astype(np.float32)


def _finish(plan: ReadPlan, out: dict, ok: np.ndarray) -> tuple[dict, int]:
    B = plan.batch_size
    good = np.flatnonzero(ok)
    stale = int((~ok[:B]).sum())
    if len(good) == 0:
        raise StaleBatchError("every sampled row was overwritten before it was read; "
                              "increase the sampler's guard band")
    chosen = good[:B]
    if len(chosen) < B:  # spares ran out: repeat delivered samples
        chosen = np.resize(chosen, B)
    sel = chosen if stale else slice(0, B)  # no stale sample: the first B, as views
    batch = {k: v[sel] for k, v in out.items()}
    batch["index"] = plan.rows[sel]
    batch["step_id"] = plan.steps[sel]
    batch["weight"] = plan.weight[sel]
    return batch, stale
