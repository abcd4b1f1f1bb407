"""Execute a :class:`~expstore.sampling.plans.ReadPlan`: transitions, n-step rewards.

For anchor row ``t`` with look-ahead ``m``: ``obs`` is the frame stack ending at ``t``,
``next_obs`` the stack ending at ``t + m``, ``reward`` the discounted sum over the
horizon, ``discount`` ``gamma^m`` (zero where the episode terminated inside it). Frame
stacks stay :class:`~expstore.loading.columns.Gathered` until the batch's samples are
chosen, then are gathered once, straight into the batch's memory.
"""

from __future__ import annotations

import numpy as np

from ..sampling.plans import ReadPlan
from ..storage.format import Layout
from ..storage.native import copy_rows
from .columns import Allocator, Gathered, RowSource, choose, read_unique


def read_columns(plan: ReadPlan, layout: Layout, source: RowSource,
                 lazy: bool = False) -> tuple[dict[str, np.ndarray | Gathered], np.ndarray]:
    """Every column of every sample of ``plan`` (spares included) and which are intact.

    ``lazy``: observation columns come back as :class:`Gathered` (see :func:`_finish_many`).
    """
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
        obs, nxt, good = read_unique(source, layout, name, rows, steps, split=k, lazy=lazy)
        ok &= good.all(axis=1)
        if f.padding == "zero" and f.stack:
            if lazy:
                obs.zero, nxt.zero = plan.obs_pad[:, cols], plan.next_pad[:, cols]
            else:
                obs[plan.obs_pad[:, cols]] = 0
                nxt[plan.next_pad[:, cols]] = 0
        if not f.stack:
            if lazy:
                obs.index, nxt.index = obs.index[:, 0], nxt.index[:, 0]
            else:
                obs, nxt = obs[:, 0], nxt[:, 0]
        suffix = name[3:]
        out["obs" + suffix] = obs
        out["next_obs" + suffix] = nxt
    names = [n for n in spec.fields if n not in spec.obs_names
             and (plan.n_step == 1 or n not in ("reward", "terminated", "truncated"))]
    for name, (vals, good) in read_at(source, layout, names, plan.rows, plan.steps).items():
        ok &= good
        out[name] = vals
    if plan.n_step > 1:
        _rewards(plan, layout, source, out, ok)
    return out, ok


def read_at(source: RowSource, layout: Layout, names: list[str], rows: np.ndarray,
            steps: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Fields ``names`` at ``rows`` (one lane step each): ``{name: (values, ok)}``; one
    call where the source reads several fields at once (``read_fields``)."""
    many = getattr(source, "read_fields", None)
    if many is not None:
        return many(names, rows, steps)
    return {n: read_unique(source, layout, n, rows, steps) for n in names}


def _rewards(plan: ReadPlan, layout: Layout, source: RowSource, out: dict,
             ok: np.ndarray) -> None:
    """Reward (n-step discounted sum) and done flags of the last step in the horizon
    (``n_step > 1``; one step reads them at the anchors with the other fields)."""
    rows, steps, mask, last = horizon_rows(plan, layout.lane_capacity)
    r, good = read_unique(source, layout, "reward", rows, steps)
    ok &= good.all(axis=1)
    take = np.arange(len(plan.rows))
    for name in ("terminated", "truncated"):
        v, g = read_unique(source, layout, name, rows[take, last], steps[take, last])
        ok &= g
        out[name] = v
    out["reward"], out["horizon"], out["discount"] = n_step_returns(
        r, mask, plan.horizon, out["terminated"], plan.gamma)


def horizon_rows(plan: ReadPlan, lane_capacity: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows and lane steps whose rewards make each sample's n-step return, ``(n,
    n_step)`` each (past the horizon: the anchor again, masked out), the mask of those
    inside the horizon, and per sample the column of its last step (where its done flags
    are read)."""
    L = lane_capacity
    j = np.arange(plan.n_step, dtype=np.int64)
    lane, slot = np.divmod(plan.rows, L)
    rows = lane[:, None] * L + (slot[:, None] + j[None, :]) % L
    steps = plan.steps[:, None] + j[None, :]
    mask = j[None, :] < plan.horizon[:, None]
    rows = np.where(mask, rows, plan.rows[:, None])
    steps = np.where(mask, steps, plan.steps[:, None])
    return rows, steps, mask, np.maximum(plan.horizon - 1, 0)


def n_step_returns(rewards: np.ndarray, mask: np.ndarray, horizon: np.ndarray,
                   terminated: np.ndarray, gamma: float
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(reward, horizon, discount)`` of each sample: its rewards over the horizon
    (``rewards``, ``mask``: ``(n, n_step)`` from :func:`horizon_rows`) discounted by
    ``gamma`` and summed, in the reward's dtype; the horizon (steps, int64); and
    ``gamma ** horizon`` (float32; 0 where the episode terminated inside it)."""
    disc = gamma ** np.arange(rewards.shape[1], dtype=np.float64)
    reward = (rewards.astype(np.float64) * disc * mask).sum(axis=1).astype(rewards.dtype)
    discount = np.where(terminated, 0.0,
                        gamma ** horizon.astype(np.float64)).astype(np.float32)
    return reward, horizon.astype(np.int64), discount


def finish_many(plan: ReadPlan, out: dict, ok: np.ndarray,
                alloc: Allocator) -> list[tuple[dict | None, int]]:
    """Every batch of ``plan``: columns (frame stacks gathered here) written once into
    the arrays of one ``alloc`` call."""
    per = len(plan.rows) // plan.batches
    B = per - plan.spare
    out = {**out, "index": plan.rows, "step_id": plan.steps, "weight": plan.weight}
    specs = {k: ((B, *v.sample_shape), v.values.dtype) if isinstance(v, Gathered)
             else ((B, *v.shape[1:]), v.dtype) for k, v in out.items()}
    chosen = []
    for i in range(plan.batches):
        sel, stale = choose(ok[i * per : (i + 1) * per], B)
        chosen.append((None if sel is None else sel + i * per, stale))
    arrays = alloc([{} if sel is None else specs for sel, _ in chosen])
    results: list[tuple[dict | None, int]] = []
    for (sel, stale), batch in zip(chosen, arrays):
        if sel is None:
            results.append((None, stale))
            continue
        for k, v in out.items():
            if isinstance(v, Gathered):
                v.take(sel, batch[k])
            else:
                copy_rows(v, sel, batch[k])
        results.append((batch, stale))
    return results
