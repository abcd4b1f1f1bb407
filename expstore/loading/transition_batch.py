"""Execute a :class:`~expstore.sampling.plans.ReadPlan`: transitions, n-step rewards.

For anchor row ``t`` with look-ahead ``m``: ``obs`` is the frame stack ending at ``t``,
``next_obs`` the stack ending at ``t + m``, ``reward`` the discounted sum over the
horizon, ``discount`` ``gamma^m`` (zero where the episode terminated inside it). Frame
stacks stay :class:`~expstore.loading.columns.Gathered` until the batch's samples are
chosen, then are gathered once, straight into the batch's memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..sampling.plans import ReadPlan
from ..storage.format import Layout
from ..storage.native import copy_rows
from .columns import Allocator, Gathered, RowSource, choose, numpy_alloc, read_unique


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
    L = layout.lane_capacity
    n = plan.n_step
    j = np.arange(n, dtype=np.int64)
    lane, slot = np.divmod(plan.rows, L)
    rows = lane[:, None] * L + (slot[:, None] + j[None, :]) % L
    steps = plan.steps[:, None] + j[None, :]
    mask = j[None, :] < plan.horizon[:, None]
    rows = np.where(mask, rows, plan.rows[:, None])
    steps = np.where(mask, steps, plan.steps[:, None])
    r, good = read_unique(source, layout, "reward", rows, steps)
    ok &= good.all(axis=1)
    last = np.maximum(plan.horizon - 1, 0)
    take = np.arange(len(plan.rows))
    for name in ("terminated", "truncated"):
        v, g = read_unique(source, layout, name, rows[take, last], steps[take, last])
        ok &= g
        out[name] = v
    disc = plan.gamma ** j.astype(np.float64)
    out["reward"] = (r.astype(np.float64) * disc * mask).sum(axis=1).astype(r.dtype)
    out["horizon"] = plan.horizon.astype(np.int64)
    out["discount"] = np.where(out["terminated"], 0.0,
                               plan.gamma ** plan.horizon.astype(np.float64)).astype(np.float32)


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


#: id(spec) -> (spec, its hot-set batch shape or None): see :func:`_hot_fields`
_HOT_FIELDS: dict[int, tuple[Any, Any]] = {}


def _hot_fields(spec: Any) -> tuple[list, list] | None:
    """For a spec whose obs fields are not stacked: ``(obs, others)``, per obs field
    ``(name, obs key, next_obs key, shape, dtype)`` and per other field ``(name, shape,
    dtype)``, in the order :func:`read_columns` returns them; else None. Kept per spec."""
    hit = _HOT_FIELDS.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    names = spec.obs_names
    info = None
    if not any(spec.fields[n].stack for n in names):
        obs = [(n, "obs" + n[3:], "next_obs" + n[3:], spec.fields[n].shape,
                spec.fields[n].dtype) for n in names]
        others = [(n, f.shape, f.dtype) for n, f in spec.fields.items() if n not in names]
        info = (obs, others)
    if len(_HOT_FIELDS) > 64:
        _HOT_FIELDS.clear()
    _HOT_FIELDS[id(spec)] = (spec, info)
    return info


def _batch_specs(fields: tuple[list, list], B: int) -> dict[bool, dict]:
    """A hot-set batch's array specs for ``B`` samples: ``{True: without index, step_id and
    weight (taken from the plan), False: with them}``, kept per ``fields`` and ``B``."""
    cache = _BATCH_SPECS.setdefault(id(fields), (fields, {}))
    if cache[0] is not fields:
        _BATCH_SPECS.clear()
        cache = _BATCH_SPECS.setdefault(id(fields), (fields, {}))
    got = cache[1].get(B)
    if got is None:
        obs_fields, others = fields
        mine: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        for _, key_o, key_n, shape, dtype in obs_fields:
            mine[key_o] = mine[key_n] = ((B, *shape), dtype)
        for name, shape, dtype in others:
            mine[name] = ((B, *shape), dtype)
        full = {**mine, "index": ((B,), np.dtype(np.int64)),
                "step_id": ((B,), np.dtype(np.int64)), "weight": ((B,), np.dtype(np.float32))}
        got = cache[1][B] = {True: mine, False: full}
    return got


#: id(hot fields) -> (those fields, {batch size: specs}): see :func:`_batch_specs`
_BATCH_SPECS: dict[int, tuple[Any, dict]] = {}


def gather_from_hot_set(plan: ReadPlan, layout: Layout, source: RowSource,
                        alloc: Allocator) -> list[tuple[dict | None, int]] | None:
    """Every batch of a one-step plan without frame stacks (low-dim stores) in one call of
    the source's ``gather_held``: each field's values straight from the reader's hot set
    into the batch's arrays (obs and next_obs from the same field), no sample stale, so
    the first ``batch_size`` samples of each batch are taken, as :func:`finish_many` does.
    Fields whose hot set holds only part of their shards (or none: a store past its
    ``hot_bytes``) are read per batch instead, one ``read_fields`` call for all of them,
    straight into the same arrays (:func:`_read_rest`).
    ``None`` where that does not apply (n-step, frame stacks, frames, a row of a field
    the hot set holds whole that is neither held decoded yet nor staged, a row
    overwritten, no ``gather_held``): the caller reads the plan the general way."""
    gather = getattr(source, "gather_held", None)
    if gather is None or plan.n_step != 1 or plan.history != 0:
        return None
    fields = _hot_fields(layout.spec)
    if fields is None:
        return None
    obs_fields, others = fields
    per = len(plan.rows) // plan.batches
    B = per - plan.spare
    specs = _batch_specs(fields, B)
    # allocators that may be called again after a try that failed write in place; a
    # worker's shared slot is taken once: gathered into numpy first, then copied there.
    # In numpy, index, step_id and weight are the plan's own (a plan is read once)
    own = alloc is numpy_alloc
    direct = own or getattr(alloc, "retryable", False)
    batches = (alloc if direct else numpy_alloc)([specs[own]] * plan.batches)
    obs_rows, next_rows = plan.obs_rows.reshape(-1), plan.next_rows.reshape(-1)
    obs_steps, next_steps = plan.obs_steps.reshape(-1), plan.next_steps.reshape(-1)
    locs: list[tuple[np.ndarray, np.ndarray]] = []
    jobs: list[tuple[int, str, np.ndarray]] = []
    for i, batch in enumerate(batches):
        take = slice(i * per, i * per + B)
        locs += [(obs_rows[take], obs_steps[take]), (next_rows[take], next_steps[take]),
                 (plan.rows[take], plan.steps[take])]
        at = 3 * i
        for name, key_o, key_n, _, _ in obs_fields:
            jobs += [(at, name, batch[key_o]), (at + 1, name, batch[key_n])]
        jobs += [(at + 2, name, batch[name]) for name, _, _ in others]
        if own:
            batch["index"], batch["step_id"] = plan.rows[take], plan.steps[take]
            batch["weight"] = plan.weight[take]
        else:
            np.copyto(batch["index"], plan.rows[take])
            np.copyto(batch["step_id"], plan.steps[take])
            np.copyto(batch["weight"], plan.weight[take])
    split = _split_jobs(source, jobs)
    if split is None:
        return None
    held, rest = split
    if held and not gather(locs, held):
        return None
    if rest and not _read_rest(source, layout, locs, rest):
        return None
    if not direct:
        arrays = alloc([specs[False]] * plan.batches)
        for src, dst in zip(batches, arrays):
            for k, v in src.items():
                np.copyto(dst[k], v)
        batches = arrays
    return [(b, 0) for b in batches]


def _split_jobs(source: RowSource, jobs: list[tuple[int, str, np.ndarray]]
                ) -> tuple[list, list] | None:
    """``jobs`` as ``(held, rest)``: those of fields the source's hot set may hold whole
    (one ``gather_held`` call) and those of fields in multi-row chunks it holds only part
    of (:func:`_read_rest`); ``None`` where a field is neither (frames)."""
    whole = getattr(source, "held_whole", None)
    if whole is None:
        return jobs, []
    held, rest = [], []
    for job in jobs:
        kind = whole.get(job[1])
        if kind is None:
            return None
        (held if kind else rest).append(job)
    return held, rest


def _read_rest(source: RowSource, layout: Layout, locs: list[tuple[np.ndarray, np.ndarray]],
               jobs: list[tuple[int, str, np.ndarray]]) -> bool:
    """Each job ``(loc, name, out)``: field ``name`` at the rows and steps of
    ``locs[loc]`` into ``out``, the fields read at the same locs with one ``read_fields``
    call (a hot set's part served from RAM, the rest by the kernel). False where a row
    was overwritten (outputs partly written)."""
    outs: dict[str, list[tuple[int, np.ndarray]]] = {}
    for loc, name, out in jobs:
        outs.setdefault(name, []).append((loc, out))
    groups: dict[tuple[int, ...], list[str]] = {}
    for name, parts in outs.items():
        groups.setdefault(tuple(loc for loc, _ in parts), []).append(name)
    for at, names in groups.items():
        rows = np.concatenate([locs[i][0] for i in at])
        steps = np.concatenate([locs[i][1] for i in at])
        for name, (vals, ok) in read_at(source, layout, names, rows, steps).items():
            if not ok.all():
                return False
            start = 0
            for _, out in outs[name]:
                out[...] = vals[start : start + len(out)]
                start += len(out)
    return True
