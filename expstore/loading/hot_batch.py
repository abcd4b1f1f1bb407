"""A plan of a low-dim store (no frame stacks) read straight into its batches' arrays: the
fields its hot set holds whole in one kernel call (``gather_held``), the fields it holds
only part of with one ``read_fields`` call, n-step returns summed from rewards gathered the
same way. Each batch equals what :func:`~expstore.loading.transition_batch.read_columns`
and :func:`~expstore.loading.transition_batch.finish_many` (the general path) make of the
same plan; :func:`gather_from_hot_set` answers ``None`` where it cannot read the plan so.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..sampling.plans import ReadPlan
from ..storage.format import Layout
from .columns import Allocator, RowSource, numpy_alloc
from .transition_batch import horizon_rows, n_step_returns, read_at

#: fields an n-step plan reads at its horizon's last step (the flags) or over it (the
#: reward), in the order the general path puts them in a batch (after the other fields)
END_FIELDS = ("terminated", "truncated", "reward")

#: id(spec) -> (spec, its hot-set batch shape or None): see :func:`_hot_fields`
_HOT_FIELDS: dict[int, tuple[Any, Any]] = {}
#: id(hot fields) -> (those fields, {(batch size, n-step): specs}): see :func:`_batch_specs`
_BATCH_SPECS: dict[int, tuple[Any, dict]] = {}


def gather_from_hot_set(plan: ReadPlan, layout: Layout, source: RowSource,
                        alloc: Allocator) -> list[tuple[dict | None, int]] | None:
    """Every batch of a plan without frame stacks (low-dim stores), each field straight
    into the batch's arrays (obs and next_obs from the same field): the fields the
    source's hot set holds whole in one ``gather_held`` call, those it holds only part of
    (or none: a store past its ``hot_bytes``) in one ``read_fields`` call (:func:`_read_rest`).
    An n-step plan's rewards over each horizon are gathered the same way and summed, its
    done flags read at the horizon's last step. No sample is stale, so the first
    ``batch_size`` samples of each batch are taken, as ``finish_many`` does.
    Where a row of a field the hot set holds whole is neither held yet nor staged, those
    fields are read with the rest (which fills the hot set). ``None`` where that does not
    apply (frame stacks, frames, a row overwritten, no ``gather_held``): the caller reads
    the plan the general way."""
    gather = getattr(source, "gather_held", None)
    if gather is None or plan.history != 0:
        return None
    fields = _hot_fields(layout.spec)
    if fields is None:
        return None
    obs_fields, others = fields
    n_step = plan.n_step > 1
    per = len(plan.rows) // plan.batches
    B = per - plan.spare
    specs = _batch_specs(fields, B, n_step)
    # allocators that may be called again after a try that failed write in place; a
    # worker's shared slot is taken once: gathered into numpy first, then copied there.
    # In numpy, index, step_id and weight are the plan's own (a plan is read once)
    own = alloc is numpy_alloc
    direct = own or getattr(alloc, "retryable", False)
    batches = (alloc if direct else numpy_alloc)([specs[own]] * plan.batches)
    obs_rows, next_rows = plan.obs_rows.reshape(-1), plan.next_rows.reshape(-1)
    obs_steps, next_steps = plan.obs_steps.reshape(-1), plan.next_steps.reshape(-1)
    if n_step:
        h_rows, h_steps, h_mask, last = horizon_rows(plan, layout.lane_capacity)
        at_last = np.arange(len(plan.rows)), last
        last_rows, last_steps = h_rows[at_last], h_steps[at_last]
        rewards = np.empty(h_rows.shape, layout.fields["reward"].dtype)
    locs: list[tuple[np.ndarray, np.ndarray]] = []
    jobs: list[tuple[int, str, np.ndarray]] = []
    for i, batch in enumerate(batches):
        take = slice(i * per, i * per + B)
        at = len(locs)
        locs += [(obs_rows[take], obs_steps[take]), (next_rows[take], next_steps[take]),
                 (plan.rows[take], plan.steps[take])]
        for name, key_o, key_n, _, _ in obs_fields:
            jobs += [(at, name, batch[key_o]), (at + 1, name, batch[key_n])]
        jobs += [(at + 2, name, batch[name]) for name, _, _ in others
                 if not (n_step and name in END_FIELDS)]
        if n_step:
            locs += [(h_rows[take].reshape(-1), h_steps[take].reshape(-1)),
                     (last_rows[take], last_steps[take])]
            jobs += [(at + 3, "reward", rewards[take].reshape(-1)),
                     (at + 4, "terminated", batch["terminated"]),
                     (at + 4, "truncated", batch["truncated"])]
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
        rest = held + rest  # (a row not held yet: read with the rest, filling the hot set)
    if rest and not _read_rest(source, layout, locs, rest):
        return None
    if n_step:
        for i, batch in enumerate(batches):
            take = slice(i * per, i * per + B)
            got = n_step_returns(rewards[take], h_mask[take], plan.horizon[take],
                                 batch["terminated"], plan.gamma)
            for key, value in zip(("reward", "horizon", "discount"), got):
                batch[key][...] = value
    if not direct:
        arrays = alloc([specs[False]] * plan.batches)
        for src, dst in zip(batches, arrays):
            for k, v in src.items():
                np.copyto(dst[k], v)
        batches = arrays
    return [(b, 0) for b in batches]


def _hot_fields(spec: Any) -> tuple[list, list] | None:
    """For a spec whose obs fields are not stacked: ``(obs, others)``, per obs field
    ``(name, obs key, next_obs key, shape, dtype)`` and per other field ``(name, shape,
    dtype)``, in the order ``read_columns`` returns them; else None. Kept per spec."""
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


def _batch_specs(fields: tuple[list, list], B: int, n_step: bool) -> dict[bool, dict]:
    """A hot-set batch's array specs for ``B`` samples: ``{True: without index, step_id and
    weight (taken from the plan), False: with them}``, in the general path's key order (an
    n-step batch: the done flags, then reward, horizon and discount after the other
    fields), kept per ``fields``, ``B`` and ``n_step``."""
    cache = _BATCH_SPECS.setdefault(id(fields), (fields, {}))
    if cache[0] is not fields:
        _BATCH_SPECS.clear()
        cache = _BATCH_SPECS.setdefault(id(fields), (fields, {}))
    got = cache[1].get((B, n_step))
    if got is None:
        obs_fields, others = fields
        mine: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        for _, key_o, key_n, shape, dtype in obs_fields:
            mine[key_o] = mine[key_n] = ((B, *shape), dtype)
        last = END_FIELDS if n_step else ()
        rest = {name: ((B, *shape), dtype) for name, shape, dtype in others}
        mine.update((name, v) for name, v in rest.items() if name not in last)
        mine.update((name, rest[name]) for name in last)
        if n_step:
            mine["horizon"] = ((B,), np.dtype(np.int64))
            mine["discount"] = ((B,), np.dtype(np.float32))
        full = {**mine, "index": ((B,), np.dtype(np.int64)),
                "step_id": ((B,), np.dtype(np.int64)), "weight": ((B,), np.dtype(np.float32))}
        got = cache[1][(B, n_step)] = {True: mine, False: full}
    return got


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
