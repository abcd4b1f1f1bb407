"""Reading the rows a plan names, the primitives every batch shape shares.

Runs wherever the data is read (a DataLoader worker, or the main process). Every row is
read with the lane step the plan expects, each distinct ``(row, step)`` once; a sample any
of whose rows was overwritten meanwhile is dropped and replaced by a spare sample of the
plan (or, when spares run out, by a copy of a delivered sample) and counted as stale.
Nothing stale is returned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..errors import StaleBatchError
from ..storage.format import Layout
from ..storage.native import copy_rows, unique_first
from . import scratch


class RowSource(Protocol):
    """Where rows come from (a ``ShardReader``, or a ``StoreRows``: staged rows merged in,
    ``store_rows.py``). A source may
    also offer ``read_held(name, rows, steps) -> (values, pos, ok) | None``: rows left
    where it holds them, valid until its next read of ``name``."""

    def read(self, name: str, rows: np.ndarray, steps: np.ndarray,
             out: np.ndarray) -> np.ndarray: ...


Specs = dict[str, tuple[tuple[int, ...], np.dtype]]  # field -> (shape, dtype) of a batch
#: ``alloc([specs of batch 0, specs of batch 1, ...]) -> [{field: empty array}, ...]``:
#: where batches are written, all of a plan's batches in one call
Allocator = Callable[[list[Specs]], list[dict[str, np.ndarray]]]


def numpy_alloc(specs: list[Specs]) -> list[dict[str, np.ndarray]]:
    """Batches' arrays; large ones in buffers that earlier batches no longer hold
    (``scratch.arrays``: fresh megabytes per batch cost page faults)."""
    return [scratch.arrays(d) for d in specs]


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


def read_unique(source: RowSource, layout: Layout, name: str, rows: np.ndarray,
                 steps: np.ndarray, split: int | None = None, lazy: bool = False):
    """Read each distinct row once; return values and ok, both aligned to ``rows``.

    "Distinct" is per (row, step): batches planned at different times, read together,
    may expect a row to hold different steps (the writer moved on in between). With
    ``split=k`` the values come back as two arrays: columns ``:k`` and ``k:``; with
    ``lazy`` as :class:`Gathered` columns (gathered when the batch is written).
    """
    f = layout.fields[name]
    flat_r, flat_s = rows.ravel(), steps.ravel()
    if split is None and not lazy and layout.chunk_rows(name) > 1:
        # values held many rows per chunk (scalars, small vectors) cost an array lookup
        # each: reading duplicates is cheaper than finding them
        vals = np.empty((len(flat_r), *f.shape), f.dtype)
        good = source.read(name, flat_r, flat_s, vals)
        return vals.reshape(*rows.shape, *f.shape), good.reshape(rows.shape)
    key = flat_s * layout.lanes + flat_r // layout.lane_capacity  # (lane, step) <-> (row, step)
    first, inv = unique_first(key)
    held = getattr(source, "read_held", None) if lazy else None
    got = held(name, flat_r[first], flat_s[first]) if held is not None else None
    if got is not None:  # frames left where the reader's cache holds them
        buf, pos, good = got
        good, inv = good[inv], pos[inv]
    else:  # (pooled: not taken again while a Gathered column or a view holds it)
        buf = scratch.empty((len(first), *f.shape), f.dtype)
        good = source.read(name, flat_r[first], flat_s[first], buf)[inv]
    good = good.reshape(rows.shape)
    inv = inv.reshape(rows.shape)
    if split is None:
        return (Gathered(buf, inv) if lazy else buf[inv]), good
    if lazy:
        return Gathered(buf, inv[:, :split]), Gathered(buf, inv[:, split:]), good
    return buf[inv[:, :split]], buf[inv[:, split:]], good


def choose(ok: np.ndarray, B: int) -> tuple[np.ndarray | None, int]:
    """The first ``B`` intact samples (spares stand in for stale ones) and the stale count."""
    good = np.flatnonzero(ok)
    stale = int((~ok[:B]).sum())
    if len(good) == 0:
        return None, stale
    chosen = good[:B]
    if len(chosen) < B:  # spares ran out: repeat delivered samples
        chosen = np.resize(chosen, B)
    return chosen, stale


def finish(plan: Any, out: dict, ok: np.ndarray) -> tuple[dict, int]:
    """One batch of numpy columns (views when nothing was stale) and its stale count."""
    sel, stale = choose(ok, plan.batch_size)
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
