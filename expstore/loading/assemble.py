"""Execute a :class:`~expstore.sampling.plan.ReadPlan` against storage: rows -> a batch.

Runs wherever the data is read (a DataLoader worker, or the main process). Every row is
read with the lane step the plan expects; a sample any of whose rows was overwritten
meanwhile is dropped and replaced by a spare sample of the plan (or, when spares run
out, by a copy of a delivered sample) and counted in ``stale``. Nothing stale is returned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..errors import ExpstoreError
from ..sampling.plan import ReadPlan
from ..storage.kernels import copy_rows
from ..storage.layout import Layout


class RowSource(Protocol):
    """Where rows come from (a ``ShardReader``, or a store's own source). A source may
    also offer ``read_held(name, rows, steps) -> (values, pos, ok) | None``: rows left
    where it holds them, valid until its next read of ``name``."""

    def read(self, name: str, rows: np.ndarray, steps: np.ndarray,
             out: np.ndarray) -> np.ndarray: ...


class StaleBatchError(ExpstoreError):
    """Every sample of a batch was overwritten before it could be read."""


Specs = dict[str, tuple[tuple[int, ...], np.dtype]]  # field -> (shape, dtype) of a batch
#: ``alloc([specs of batch 0, specs of batch 1, ...]) -> [{field: empty array}, ...]``:
#: where batches are written, all of a plan's batches in one call
Allocator = Callable[[list[Specs]], list[dict[str, np.ndarray]]]


def numpy_alloc(specs: list[Specs]) -> list[dict[str, np.ndarray]]:
    return [{k: np.empty(shape, dtype) for k, (shape, dtype) in d.items()} for d in specs]


@dataclass
class Gathered:
    """A column left as ``values[index]`` until the batch's samples are chosen, so frame
    stacks are gathered once, straight into the batch's memory. ``zero``: positions
    (same shape as ``index``) to zero-fill (padding before an episode's start)."""

    values: np.ndarray  # (U, *shape) distinct rows
    index: np.ndarray  # (N, ...) positions in values per sample
    zero: np.ndarray | None = None

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.index.shape[1:]) + tuple(self.values.shape[1:])

    def take(self, sel: np.ndarray | slice, out: np.ndarray) -> None:
        rows = self.index[sel].ravel()
        copy_rows(self.values, rows, out.reshape(len(rows), *self.values.shape[1:]))
        if self.zero is not None:
            zero = self.zero[sel]
            if zero.any():
                out[zero] = 0


def _read_unique(source: RowSource, layout: Layout, name: str, rows: np.ndarray,
                 steps: np.ndarray, split: int | None = None, lazy: bool = False):
    """Read each distinct row once; return values and ok, both aligned to ``rows``.

    "Distinct" is per (row, step): batches planned at different times, read together,
    may expect a row to hold different steps (the writer moved on in between). With
    ``split=k`` the values come back as two arrays: columns ``:k`` and ``k:``; with
    ``lazy`` as :class:`Gathered` columns (gathered when the batch is written).
    """
    f = layout.fields[name]
    flat_r, flat_s = rows.ravel(), steps.ravel()
    key = flat_s * layout.lanes + flat_r // layout.lane_capacity  # (lane, step) <-> (row, step)
    uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
    held = getattr(source, "read_held", None) if lazy else None
    got = held(name, flat_r[first], flat_s[first]) if held is not None else None
    if got is not None:  # frames left where the reader's cache holds them
        buf, pos, good = got
        good, inv = good[inv], pos[inv]
    else:
        buf = np.empty((len(uniq), *f.shape), f.dtype)
        good = source.read(name, flat_r[first], flat_s[first], buf)[inv]
    good = good.reshape(rows.shape)
    inv = inv.reshape(rows.shape)
    if split is None:
        return (Gathered(buf, inv) if lazy else buf[inv]), good
    if lazy:
        return Gathered(buf, inv[:, :split]), Gathered(buf, inv[:, split:]), good
    return buf[inv[:, :split]], buf[inv[:, split:]], good


def assemble(plan: ReadPlan, layout: Layout, source: RowSource) -> tuple[dict, int]:
    """Batch dict of numpy arrays for ``plan`` and the number of stale samples replaced.

    Plans of other shapes (sequences, hindsight relabeling) carry their own ``assemble``
    method, which is called instead.
    """
    own = getattr(plan, "assemble", None)
    if own is not None:
        return own(layout, source)
    ((batch, stale),) = assemble_batches(plan, layout, source)
    if batch is None:
        raise StaleBatchError("every sampled row was overwritten before it was read; "
                              "increase the sampler's guard band")
    return batch, stale


def assemble_batches(plan: ReadPlan, layout: Layout, source: RowSource,
                     alloc: Allocator = numpy_alloc) -> list[tuple[dict | None, int]]:
    """``(batch, stale)`` for each of ``plan.batches`` batches, all read together and
    written into the arrays of one ``alloc`` call (a DataLoader worker passes views of a
    shared-memory slot). A batch every sample of which was overwritten is ``None``.
    """
    own = getattr(plan, "assemble", None)
    if own is None:
        return _finish_many(plan, *read_columns(plan, layout, source, lazy=True), alloc)
    try:
        batch, stale = own(layout, source)
    except StaleBatchError:
        alloc([{}])
        return [(None, plan.batch_size)]
    (out,) = alloc([{k: (v.shape, v.dtype) for k, v in batch.items()}])
    for k, v in batch.items():
        out[k][...] = v
    return [(out, stale)]


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
        obs, nxt, good = _read_unique(source, layout, name, rows, steps, split=k, lazy=lazy)
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


def _choose(ok: np.ndarray, B: int) -> tuple[np.ndarray | None, int]:
    """The first ``B`` intact samples (spares stand in for stale ones) and the stale count."""
    good = np.flatnonzero(ok)
    stale = int((~ok[:B]).sum())
    if len(good) == 0:
        return None, stale
    chosen = good[:B]
    if len(chosen) < B:  # spares ran out: repeat delivered samples
        chosen = np.resize(chosen, B)
    return chosen, stale


def _finish(plan: ReadPlan, out: dict, ok: np.ndarray) -> tuple[dict, int]:
    """One batch of numpy columns (views when nothing was stale) and its stale count."""
    sel, stale = _choose(ok, plan.batch_size)
    if sel is None:
        raise StaleBatchError("every sampled row was overwritten before it was read; "
                              "increase the sampler's guard band")
    if not stale:
        sel = slice(0, plan.batch_size)
    batch = {k: v[sel] for k, v in out.items()}
    batch["index"] = plan.rows[sel]
    batch["step_id"] = plan.steps[sel]
    batch["weight"] = plan.weight[sel]
    return batch, stale


def _finish_many(plan: ReadPlan, out: dict, ok: np.ndarray,
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
        sel, stale = _choose(ok[i * per : (i + 1) * per], B)
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
