"""Row priorities for prioritized sampling, kept in step with the row index (all in RAM).

A :class:`PriorityIndex` holds one :class:`~expstore.index.sumtree.PriorityTree` leaf per
row of the store (``p = (|δ| + eps) ** alpha``; 0 = not sampleable). It listens to the
:class:`~expstore.index.rows.RowIndex`: rows that appear get the running maximum priority,
rows dropped by wrap-around get 0. ``update`` ignores rows that are gone or, given their
``step_id``, were overwritten since they were sampled.

Reading them: :meth:`PriorityIndex.get` (per row, or every row), :attr:`~PriorityIndex.total`,
:attr:`~PriorityIndex.max_priority` (the running maximum new rows get) and
:attr:`~PriorityIndex.min_priority`; all in sampling units ``p = (|δ| + eps) ** alpha``.
:meth:`PriorityIndex.set` sets them in those units (a test or a benchmark forcing a
distribution). The sum tree behind them is private.

Persistence is someone else's job: :meth:`PriorityIndex.payload` gives the state as plain
arrays and metadata, and a payload saved earlier (``saved=``) seeds a new index. Rows
written after that payload was taken get the maximum priority, rows dropped since get 0.
(The file format is ``expstore.storage.format.priority_file``; samplers save through the store.)
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import NotEnoughData
from ..rows import FLAG_FIRST, NO_ANCHOR
from .rows import RowIndex
from .sumtree import PriorityTree

_F32_MAX = float(np.finfo(np.float32).max)

Accept = Callable[[np.ndarray], np.ndarray]  # rows -> bool mask of rows that carry priority


def to_numpy(x: Any, dtype: Any = None) -> np.ndarray:
    """A numpy array from numpy/lists/torch tensors (any device)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


class PriorityIndex:
    """Priorities of the rows of ``index`` for one sampler.

    ``accept(rows)`` says which non-final rows carry a priority (all of them for
    transitions; sequence starts for sequences); ``kind`` names that rule in the payload
    so a sampler with another rule does not take it. ``lag``: a row gets its priority only
    once ``lag`` rows follow it (a transition's next row), so the newest row of a lane,
    which cannot be sampled yet, does not draw samples that would be rejected. ``saved``:
    a :meth:`payload` taken earlier (of an index of the same geometry) to start from.

    :attr:`max_priority` is the running maximum priority (sampling units), which rows get
    when they appear; it never decreases.
    """

    def __init__(self, index: RowIndex, alpha: float = 0.6, eps: float = 1e-6,
                 accept: Accept | None = None, kind: str = "transition", lag: int = 0,
                 saved: Mapping[str, Any] | None = None) -> None:
        if not alpha >= 0.0:
            raise ValueError(f"alpha: expected >= 0, got {alpha}")
        if not eps >= 0.0:
            raise ValueError(f"eps: expected >= 0, got {eps}")
        self.index = index
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.kind = kind
        self.accept = accept
        self.lag = int(lag)
        self.max_priority = 1.0  # running max of leaves, in p**alpha units
        self.dirty = True  # changed since the last payload was saved
        self._tree = self._fill(self._restore(saved) if saved is not None else None)
        self._pending: list[np.ndarray] = []  # rows added since, awaiting max priority
        ref = weakref.ref(self)

        def listener(kind: str, rows: np.ndarray) -> None:
            me = ref()
            if me is None:
                index.unsubscribe(listener)
            else:
                me._on_rows(kind, rows)

        self._listener = listener
        index.subscribe(listener)

    # -- membership ------------------------------------------------------------------------
    def _accepted(self, rows: np.ndarray) -> np.ndarray:
        ok = (self.index.flags[rows] & NO_ANCHOR) == 0  # final and lost rows: never
        if self.accept is not None:
            ok &= self.accept(rows)
        return ok

    @property
    def _tree_now(self) -> PriorityTree:
        """The sum/min tree, with every row added so far at the maximum priority."""
        if self._pending:
            rows = np.concatenate(self._pending)
            self._pending.clear()
            self._tree.update(rows, self.max_priority)
        return self._tree

    def _on_rows(self, kind: str, rows: np.ndarray) -> None:
        # Added rows are queued and enter the tree in one update before its next use: one
        # tree update per batch instead of one per env step.
        if kind == "added":
            if self.lag:
                rows = self._ready(rows)
            rows = rows[self._accepted(rows)]
            if len(rows):
                self._pending.append(rows)
        elif kind == "dropped":
            self._tree_now.clear(rows)
        self.dirty = True

    def _ready(self, rows: np.ndarray) -> np.ndarray:
        """Of rows just added (one lane's, in step order), those with ``lag`` rows written
        after them, plus the rows before them that waited for their successors (if of the
        same episode)."""
        idx = self.index
        L = idx.lane_capacity
        lane = int(rows[0]) // L
        count = int(idx.count[lane])
        steps = idx.steps(rows)
        ready = rows[steps + self.lag < count]
        first = int(steps[0])  # (a final row not announced may come just before it)
        lo = max(first - self.lag - 1, int(idx.lower_bound(0)[lane]))
        if lo >= first:
            return ready
        if self.lag == 1:  # the common case, per env step: plain Python on two rows
            flags, leaves = idx.flags, self._tree
            prev = [lane * L + t % L for t in range(lo, first)
                    if not flags[lane * L + (t + 1) % L] & FLAG_FIRST]
            prev = np.array(prev, np.int64)
            prev = prev[leaves.get(prev) == 0] if len(prev) else prev
        else:
            prev = idx.lane_rows(lane, np.arange(lo, first))
            # (a row still waiting has priority 0 and is never queued)
            prev = prev[(self._tree.get(prev) == 0) & (idx.horizon(prev, self.lag)[1] > 0)]
        return np.concatenate([ready, prev]) if len(prev) else ready

    def live_rows(self, lane: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows of ``lane`` that are intact now, and their steps (oldest first)."""
        idx = self.index
        steps = np.arange(int(idx.lower_bound(0)[lane]), int(idx.count[lane]), dtype=np.int64)
        return idx.lane_rows(lane, steps), steps

    def _fill(self, saved: dict[str, Any] | None) -> PriorityTree:
        """A tree with a leaf for every intact row: the saved priority where still valid,
        else the maximum."""
        leaves = np.zeros(self.index.capacity, np.float32)
        if saved is not None:
            self.max_priority = float(saved["max_priority"])
        L = self.index.lane_capacity
        for lane in range(self.index.lanes):
            rows, steps = self.live_rows(lane)
            if not len(rows):
                continue
            acc = self._accepted(rows) & (steps + self.lag < self.index.count[lane])
            val = np.full(len(rows), self.max_priority, np.float32)
            if saved is not None:
                s_count = int(saved["count"][lane])
                s_lo = max(int(saved["valid_from"][lane]), s_count - L)
                old = saved["leaves"][rows]
                same = (steps >= s_lo) & (steps < s_count) & (old > 0)
                val[same] = old[same]
            leaves[rows] = np.where(acc, val, 0)
        return PriorityTree.from_leaves(leaves)

    # -- reading ---------------------------------------------------------------------------
    def get(self, rows: Any = None) -> np.ndarray:
        """Priorities of ``rows`` (store rows; ``None``: every row, ``capacity`` values) as
        float64 in sampling units; 0 where a row is not drawn (final, lost or dropped rows,
        rows never written, a lane's newest row until its next one arrives). Raises
        ``ValueError`` for rows outside ``0..capacity-1``."""
        tree = self._tree_now
        if rows is None:
            return tree.state().astype(np.float64)
        return tree.get(to_numpy(rows, np.int64).ravel()).astype(np.float64)

    @property
    def total(self) -> float:
        """Sum of every row's priority (sampling units): a row is drawn with probability
        ``get(row) / total``."""
        return self._tree_now.total

    @property
    def min_priority(self) -> float:
        """Smallest priority of a row that is drawn (sampling units; ``inf`` when none is):
        importance weights are ``(get(row) / min_priority) ** -beta``."""
        return self._tree_now.min

    def set(self, rows: Any, priority: Any) -> int:
        """Set priorities of ``rows`` in sampling units (no ``eps``/``alpha`` applied; one
        value or one per row, finite and >= 0); rows not drawn now (see :meth:`get`) are
        skipped. Returns how many were set. (:meth:`update` takes ``|td_error|``.)"""
        rows = to_numpy(rows, np.int64).ravel()
        p = np.broadcast_to(to_numpy(priority, np.float64), rows.shape).astype(np.float64)
        if not np.isfinite(p).all() or (p < 0).any():
            bad = p[~np.isfinite(p) | (p < 0)][0]
            raise ValueError(f"priority: expected finite values >= 0, got {bad}")
        keep = self._tree_now.get(rows) > 0
        n = int(keep.sum())
        if n:
            p = np.minimum(p[keep], _F32_MAX)
            self._tree.update(rows[keep], p)
            self.max_priority = max(self.max_priority, float(p.max()))
            self.dirty = True
        return n

    # -- updates ---------------------------------------------------------------------------
    def priority(self, td_error: Any) -> np.ndarray:
        """``(|td_error| + eps) ** alpha`` as float64 (raises on NaN/inf)."""
        td = np.abs(to_numpy(td_error, np.float64)).ravel()
        if not np.isfinite(td.sum()):  # one reduction: a NaN or inf makes the sum one
            bad = td[~np.isfinite(td)][0]
            raise ValueError(f"td_error: expected finite values, got {bad}")
        return (td + self.eps) ** self.alpha

    def update(self, rows: Any, td_error: Any, step_id: Any = None) -> int:
        """Set priorities of ``rows`` from ``|td_error|``; returns how many were applied.

        Rows no longer held (dropped, final, never written) are skipped, and so are rows
        whose current step differs from ``step_id`` (overwritten since they were sampled).
        """
        rows = to_numpy(rows, np.int64).ravel()
        p = self.priority(td_error)
        if p.size != rows.size:
            raise ValueError(f"td_error: expected {rows.size} values (one per index), "
                             f"got {p.size}")
        keep = self._tree_now.get(rows) > 0  # (raises on rows out of range)
        if step_id is not None:
            sid = to_numpy(step_id, np.int64).ravel()
            if sid.size != rows.size:
                raise ValueError(f"step_id: expected {rows.size} values, got {sid.size}")
            keep &= self.index.steps(rows) == sid
        n = int(keep.sum())
        if n:
            if n < rows.size:
                rows, p = rows[keep], p[keep]
            top = float(p.max())
            if top > _F32_MAX:
                np.minimum(p, _F32_MAX, out=p)
                top = _F32_MAX
            self._tree_now.update(rows, p)
            self.max_priority = max(self.max_priority, top)
            self.dirty = True
        return n

    def clear(self, rows: np.ndarray) -> None:
        """Take ``rows`` out of sampling (they can never serve the sampler's need)."""
        if len(rows):
            self._tree_now.clear(rows)
            self.dirty = True

    # -- sampling --------------------------------------------------------------------------
    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` rows, stratified proportional to priority."""
        try:
            return self._tree_now.sample(n, rng)
        except ValueError as e:  # an empty tree
            raise NotEnoughData("no row has a priority yet (the store holds no sampleable "
                                "rows)") from e

    def weights(self, rows: np.ndarray, beta: float | np.ndarray) -> np.ndarray:
        """Importance weights ``(N P(i))^-beta / max_w = (p_i / p_min)^-beta`` (float32;
        ``beta``: one exponent, or one per row)."""
        p = self._tree_now.get(rows)
        w = (p / self._tree_now.min) ** (-beta)
        return w.astype(np.float32)

    # -- persistence -----------------------------------------------------------------------
    def payload(self) -> dict[str, Any]:
        """The state to persist: ``leaves`` (float32, one per row: ``4 * capacity`` bytes)
        and the metadata needed to take it back (``kind``, ``alpha``, ``eps``,
        ``max_priority``, the index's ``capacity``, ``lanes``, ``count``, ``valid_from``)."""
        idx = self.index
        return {
            "kind": self.kind, "alpha": self.alpha, "eps": self.eps,
            "max_priority": self.max_priority, "capacity": int(idx.capacity),
            "lanes": int(idx.lanes), "count": idx.count.copy(),
            "valid_from": idx.valid_from.copy(), "leaves": self._tree_now.state(),
        }

    def _restore(self, saved: Mapping[str, Any]) -> dict[str, Any] | None:
        """``saved`` with leaves and max priority in this index's ``alpha``; ``None`` (with
        a warning) when it was saved for another ``kind``."""
        where = saved.get("source", "saved priorities")
        if saved.get("kind") != self.kind:
            warnings.warn(f"{where}: saved priorities are for {saved.get('kind')!r} sampling, "
                          f"this sampler needs {self.kind!r}; starting from max priority",
                          stacklevel=4)
            return None
        leaves = np.asarray(saved["leaves"], np.float32)
        if leaves.shape != (self.index.capacity,):
            raise ValueError(f"{where}: holds {leaves.size} priorities, expected "
                             f"{self.index.capacity}")
        old_alpha = float(saved["alpha"])
        max_p = float(saved["max_priority"])
        if old_alpha != self.alpha:  # convert p**old_alpha to p**alpha
            if old_alpha > 0:
                r = self.alpha / old_alpha
                leaves = (leaves.astype(np.float64) ** r).astype(np.float32)
                max_p = max_p ** r
            else:
                leaves = np.zeros_like(leaves)  # alpha 0 kept no information: all max
                max_p = 1.0
        return {**saved, "leaves": leaves, "max_priority": max_p}

    def detach(self) -> None:
        """Stop listening to the index."""
        self.index.unsubscribe(self._listener)

    @property
    def nbytes(self) -> int:
        return int(self._tree.nbytes)
