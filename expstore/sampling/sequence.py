"""Fixed-length sequences for recurrent agents (R2D2, Kapturowski et al. 2019).

A sequence starts at a row whose position in its episode is a multiple of ``period``
(``length - overlap``), like R2D2's stored sequences that overlap by half. Its window is
``burn_in`` rows before the start (to warm up the recurrent state) plus ``length`` rows:
``W = burn_in + length`` rows, all from the start row's episode and lane. Positions outside
the episode (before its first row, after its final row) are masked and zero-filled.

Rows are steps as in the store's row model: the episode's final row (``is_last``) is part of
the window and holds the final observation (its action and reward are zero). Frame-stacked
fields come as one stack per step, ``(B, W, k, *shape)``, which is what an R2D2 torso
consumes; each frame is read once per sample.

Sampling costs ``O(B * (period + W))`` index work per batch whatever the number of stored
rows: starts are drawn by rejection (uniform) or from the sum-tree (prioritized), and
validity looks at the ``W`` rows of each candidate only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import NotEnoughData
from ..index.priorities import PriorityIndex, to_numpy
from ..index.rows import RowIndex
from ..rows import FLAG_FIRST, FLAG_LAST, NO_ANCHOR
from .base import Sampler, check_batch, plan_valid
from .by_priority import BetaSchedule, PriorityDraw, ReadsPriorities
from .plans import IN_PROCESS, ReaderView, SequencePlan
from .uniform import uniform_rows
from .windows import stack_rows


def _forward(index: RowIndex, rows: np.ndarray, steps: np.ndarray, length: int,
             upper: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per start row: offset of the episode's last row inside ``length`` rows (or
    ``length - 1``) and whether all rows up to there are written (< ``upper``)."""
    L = index.lane_capacity
    lane = rows // L
    j = np.arange(length, dtype=np.int64)
    s = steps[:, None] + j[None, :]
    exists = s < upper[lane][:, None]
    f = index.flags[lane[:, None] * L + s % L]
    last = exists & ((f & FLAG_LAST) != 0)
    first = exists & ((f & FLAG_FIRST) != 0) & (j[None, :] > 0)
    # a final row ends the window after it; a first row (interrupted episode) before it
    stop = np.where(last, j[None, :], np.where(first, j[None, :] - 1, length))
    end = stop.min(axis=1)
    ended = end < length
    end = np.minimum(end, length - 1)
    complete = ended | exists[:, -1]
    return end, complete


def sequence_valid(index: RowIndex, rows: np.ndarray, burn_in: int, length: int,
                   history: int = 0, guard: int = 0, period: int = 1,
                   committed_only: bool = False) -> np.ndarray:
    """Which rows can start a sequence: a start position (multiple of ``period``), not a
    final row, every row of its window intact (burn-in and frame history back to the
    episode start, ``length`` rows forward or up to the episode's end) and out of the
    guard band."""
    rows = np.asarray(rows, np.int64)
    if not len(rows):
        return np.zeros(0, bool)
    steps = index.steps(rows)
    _, complete = _forward(index, rows, steps, length, index.upper_bound(committed_only))
    return _starts(index, rows, steps, complete, burn_in + history, guard, period)


def _starts(index: RowIndex, rows: np.ndarray, steps: np.ndarray, complete: np.ndarray,
            back: int, guard: int, period: int) -> np.ndarray:
    """:func:`sequence_valid` of ``rows`` at ``steps`` whose windows are ``complete``
    (``_forward``); ``back``: rows of burn-in and frame history before each start."""
    lane = rows // index.lane_capacity
    pos = index.episode_step[rows].astype(np.int64)
    ok = (steps >= 0) & ((index.flags[rows] & NO_ANCHOR) == 0) & (pos % period == 0)
    ok &= steps - np.minimum(pos, back) >= index.lower_bound(guard)[lane]
    return ok & complete


def make_sequence_plan(index: RowIndex, rows: np.ndarray, weight: np.ndarray | None,
                       burn_in: int, length: int, history: int = 0, spare: int = 0,
                       committed_only: bool = False) -> SequencePlan:
    """Plan for start rows already checked with :func:`sequence_valid`; ``ValueError``
    naming the rows that no longer start one (rows added since rewrote them)."""
    plan, ok = checked_sequence_plan(index, rows, weight, burn_in, length, history, spare,
                                     committed_only)
    if not ok.all():
        raise ValueError(f"rows {plan.rows[~ok][:8].tolist()} cannot start a sequence "
                         "(rows added since they were checked rewrote them)")
    return plan


def checked_sequence_plan(index: RowIndex, rows: np.ndarray, weight: np.ndarray | None,
                          burn_in: int, length: int, history: int = 0, spare: int = 0,
                          committed_only: bool = False, guard: int = 0, period: int = 1
                          ) -> tuple[SequencePlan, np.ndarray]:
    """:func:`make_sequence_plan` and, per sequence, whether its start row is
    :func:`sequence_valid` at the steps the plan names and no row the plan reads was
    rewritten while it was made (``RowIndex.current``): a sampler draws again the
    sequences that are not (another thread of the process may add rows meanwhile)."""
    rows = np.asarray(rows, np.int64)
    L = index.lane_capacity
    lane = rows // L
    steps = index.steps(rows)
    pos = index.episode_step[rows].astype(np.int64)
    end, complete = _forward(index, rows, steps, length, index.upper_bound(committed_only))
    p = np.arange(-burn_in, length, dtype=np.int64)  # offset of each position from start
    lo = -np.minimum(pos, burn_in)
    q = np.clip(p[None, :], lo[:, None], end[:, None])
    mask = q == p[None, :]
    win_steps = steps[:, None] + q
    win_rows = lane[:, None] * L + win_steps % L
    flags = index.flags[win_rows]
    is_first = mask & ((pos[:, None] + q) == 0)
    is_last = mask & ((flags & FLAG_LAST) != 0)
    B, W = win_rows.shape
    K = history + 1
    srows, spad, ssteps = stack_rows(index, win_rows.ravel(), win_steps.ravel(), K)
    w = np.ones(B, np.float32) if weight is None else np.asarray(weight, np.float32)
    ok = _starts(index, rows, steps, complete, burn_in + history, guard, period)
    ok &= index.current(srows.reshape(B, W * K), ssteps.reshape(B, W * K)).all(axis=1)
    return SequencePlan(rows, steps, w, burn_in, length, history, win_rows, win_steps, mask,
                        is_first, is_last, srows.reshape(B, W, K), spad.reshape(B, W, K),
                        ssteps.reshape(B, W, K), spare), ok


class SequenceSampler(ReadsPriorities, Sampler):
    """Sequences of ``burn_in + length`` steps, uniform or prioritized (R2D2).

    ``overlap``: steps shared by consecutive sequences of an episode (R2D2: ``length // 2``)
    or ``period``: steps between sequence starts (``length - overlap``; 1 = every step).
    ``prioritized=True`` draws starts by priority; ``update_priorities(index, td_error)``
    takes per-step ``|δ|`` of shape ``(B, T)`` (with an optional ``mask``) and sets
    ``eta * max + (1 - eta) * mean`` over each sequence's unmasked steps, then
    ``(p + eps) ** alpha``. Batches: every field ``(B, W, ...)`` plus ``mask``,
    ``is_first``, ``is_last``, ``index``/``step_id`` (start row), ``weight``.
    """

    def __init__(self, store: Any, length: int, burn_in: int = 0, overlap: int | None = None,
                 period: int | None = None, prioritized: bool = False, eta: float = 0.9,
                 alpha: float = 0.9, beta: float = 0.6, eps: float = 1e-6,
                 beta_final: float = 1.0, beta_steps: int | None = None,
                 beta_schedule: Callable[[int], float] | None = None,
                 name: str = "sequence_priorities", persist: bool = True,
                 **kwargs: Any) -> None:
        if kwargs.get("n_step", 1) != 1:
            raise ValueError("n_step: sequences return every step; compute n-step targets "
                             "from the sequence (expected n_step=1)")
        super().__init__(store, **kwargs)
        if length < 1:
            raise ValueError(f"length: expected >= 1, got {length}")
        if burn_in < 0:
            raise ValueError(f"burn_in: expected >= 0, got {burn_in}")
        if overlap is not None and period is not None:
            raise ValueError("give overlap or period, not both")
        if overlap is not None:
            if not 0 <= overlap < length:
                raise ValueError(f"overlap: expected 0..{length - 1}, got {overlap}")
            period = length - overlap
        period = 1 if period is None else int(period)
        if period < 1:
            raise ValueError(f"period: expected >= 1, got {period}")
        if not 0.0 <= eta <= 1.0:
            raise ValueError(f"eta: expected 0..1, got {eta}")
        self.length = int(length)
        self.burn_in = int(burn_in)
        self.period = period
        self.eta = float(eta)
        self._accept_rate = 1.0 / period
        #: starts drawn by priority (``prioritized=True``), else ``None``: uniform starts
        self.by_priority: PriorityDraw | None = None
        if prioritized:
            self.by_priority = PriorityDraw(
                store, name, BetaSchedule(beta, beta_final, beta_steps, beta_schedule),
                persist, alpha=alpha, eps=eps, accept=self.is_start,
                kind=f"sequence/period={period}")

    @property
    def window(self) -> int:
        """Steps per sequence (burn-in included)."""
        return self.burn_in + self.length

    @property
    def prioritized(self) -> bool:
        return self.by_priority is not None

    @property
    def priorities(self) -> PriorityIndex | None:
        return None if self.by_priority is None else self.by_priority.priorities

    @property
    def batches_drawn(self) -> int:
        return 0 if self.by_priority is None else self.by_priority.batches_drawn

    @property
    def beta(self) -> float:
        return 0.0 if self.by_priority is None else self.by_priority.beta

    def is_start(self, rows: np.ndarray) -> np.ndarray:
        return self.index.episode_step[rows] % self.period == 0

    def valid(self, rows: np.ndarray, view: ReaderView = IN_PROCESS) -> np.ndarray:
        return sequence_valid(self.index, rows, self.burn_in, self.length, self.history,
                              self.guard_for(view), self.period, view.committed_only)

    def draw(self, n: int, view: ReaderView) -> tuple[np.ndarray, None]:
        """``n`` uniform start-position rows (rejection over uniform intact rows)."""
        idx = self.index
        out: list[np.ndarray] = []
        got = 0
        for _ in range(64):
            m = int(min(1.25 * (n - got) / max(self._accept_rate, 1e-3) + 64, 1 << 20))
            rows = uniform_rows(self, m, view)
            ok = self.is_start(rows) & ((idx.flags[rows] & NO_ANCHOR) == 0)
            self._accept_rate = 0.8 * self._accept_rate + 0.2 * max(ok.mean(), 1e-4)
            out.append(rows[ok])
            got += int(ok.sum())
            if got >= n:
                break
        rows = np.concatenate(out)
        if len(rows) == 0:
            raise NotEnoughData("no row of the store starts a sequence yet "
                                f"(period={self.period})")
        return np.resize(rows, n) if len(rows) < n else rows[:n], None

    def draw_rows(self, batch_size: int, batches: int = 1, view: ReaderView = IN_PROCESS
                  ) -> tuple[np.ndarray, np.ndarray | None]:
        if self.by_priority is None:
            return super().draw_rows(batch_size, batches, view)
        return self.by_priority.draw_batches(self, batch_size, batches, view, self._prune)

    def _prune(self, rows: np.ndarray) -> None:
        """Zero start rows whose window is complete yet invalid: they never become valid."""
        idx = self.index
        _, complete = _forward(idx, rows, idx.steps(rows), self.length, idx.count)
        rows = rows[complete]
        if len(rows) and self.priorities is not None:
            bad = ~sequence_valid(idx, rows, self.burn_in, self.length, self.history, 0,
                                  self.period)
            self.priorities.clear(rows[bad])

    def newest_row(self, view: ReaderView = IN_PROCESS) -> int | None:
        """Start row of the newest complete sequence in the most recently written lane."""
        idx = self.index
        lane = idx.last_lane
        count = int(idx.upper_bound(view.committed_only)[lane])
        span = self.length + self.period + 1
        steps = np.arange(count - 1, max(count - 1 - span, -1), -1, dtype=np.int64)
        steps = steps[steps >= idx.lower_bound(self.guard_for(view))[lane]]
        if not len(steps):
            return None
        rows = idx.lane_rows(lane, steps)
        ok = self.valid(rows, view)
        return int(rows[np.argmax(ok)]) if ok.any() else None

    def plan(self, batch_size: int, batches: int = 1,  # type: ignore[override]
             view: ReaderView = IN_PROCESS) -> SequencePlan:
        """Plan of ``batch_size`` sequences (+ ``view.spare`` spares); ``batches`` must be 1
        (the loader asks for one plan per batch from samplers with their own plan)."""
        batch_size, batches = check_batch(batch_size, batches)
        if batches != 1:
            raise ValueError(f"batches: a sequence plan holds one batch, got {batches}")
        rows, w = self.sample_rows(batch_size, 1, view)
        return plan_valid(self, rows, w, view, lambda r, wt: checked_sequence_plan(
            self.index, r, wt, self.burn_in, self.length, self.history, view.spare,
            view.committed_only, self.guard_for(view), self.period))

    def sequence_priority(self, td_error: Any, mask: Any = None) -> np.ndarray:
        """R2D2 sequence priority ``eta * max_t |δ_t| + (1 - eta) * mean_t |δ_t|``."""
        td = np.abs(to_numpy(td_error, np.float64))
        if td.ndim == 1:
            return td
        td = td.reshape(len(td), -1)
        m = np.ones(td.shape, bool) if mask is None else to_numpy(mask, bool).reshape(td.shape)
        n = m.sum(axis=1)
        mx = np.where(m, td, 0.0).max(axis=1)
        mean = np.where(m, td, 0.0).sum(axis=1) / np.maximum(n, 1)
        return np.where(n > 0, self.eta * mx + (1 - self.eta) * mean, np.nan)

    def update_priorities(self, index: Any, td_error: Any, step_id: Any = None,
                          mask: Any = None) -> int:
        """Set start-row priorities from per-step ``|δ|`` ``(B, T)`` (or per-sequence
        ``(B,)``); sequences whose mask is all False are skipped. Uniform: no-op."""
        if self.by_priority is None:
            return 0
        p = self.sequence_priority(td_error, mask)
        keep = ~np.isnan(p)
        rows = to_numpy(index, np.int64).ravel()
        if len(rows) != len(p):
            raise ValueError(f"td_error: expected {len(rows)} sequences, got {len(p)}")
        sid = None if step_id is None else to_numpy(step_id, np.int64).ravel()[keep]
        return self.by_priority.update(rows[keep], p[keep], sid)

    def close(self) -> None:
        if self.by_priority is not None:
            self.by_priority.detach()
