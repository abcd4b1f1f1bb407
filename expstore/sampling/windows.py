"""Windows of anchor rows, from the index: frame stacks and n-step horizons -> a ReadPlan.

A plan is computed in the main process from the in-RAM index only, and is small (a few
integers per sample), so it crosses to DataLoader workers cheaply. Workers execute it
against storage (``loading.execute``) without needing the index: data flows one way.

For anchor row ``t`` with look-ahead ``m`` (1..n, shorter at an episode's final row):
``obs`` is the frame stack ending at ``t``; ``next_obs`` the stack ending at ``t + m``;
``reward`` = sum_j<m gamma^j r_{t+j}; ``discount`` = gamma^m, zero when the episode
terminated inside the horizon (a truncated episode bootstraps from its final row).
"""

from __future__ import annotations

import numpy as np

from ..index.rows import RowIndex
from .plans import ReadPlan


def stack_rows(index: RowIndex, rows: np.ndarray, steps: np.ndarray,
               k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows ``t-k+1 .. t`` of each row's episode, clamped at its first row; pad mask; steps
    (``RowIndex.stack``)."""
    return index.stack(rows, steps, k)


def make_plan(index: RowIndex, rows: np.ndarray, weight: np.ndarray | None = None,
              history: int = 0, n_step: int = 1, gamma: float = 0.99,
              spare: int = 0, committed_only: bool = False, batches: int = 1,
              guard: int = 0) -> ReadPlan:
    """Plan for anchors ``rows`` (already checked with ``index.valid``): ``batches``
    consecutive batches of ``len(rows) // batches`` samples (``spare`` of them spares).
    Raises ``ValueError`` naming the rows that no longer start a transition (another
    thread added rows since they were checked: see :func:`checked_plan`)."""
    plan, ok = checked_plan(index, rows, weight, history, n_step, gamma, spare,
                            committed_only, batches, guard)
    if not ok.all():
        raise ValueError(f"rows {plan.rows[~ok][:8].tolist()} cannot start a transition "
                         "(rows added since they were checked rewrote them)")
    return plan


def checked_plan(index: RowIndex, rows: np.ndarray, weight: np.ndarray | None = None,
                 history: int = 0, n_step: int = 1, gamma: float = 0.99,
                 spare: int = 0, committed_only: bool = False, batches: int = 1,
                 guard: int = 0) -> tuple[ReadPlan, np.ndarray]:
    """:func:`make_plan` and, per sample, whether its anchor still starts a transition
    (``index.valid`` with ``history``, ``n_step``, ``guard``) at the steps the plan names,
    judged with them (``RowIndex.windows``): a sampler draws again the samples that do not."""
    rows = np.asarray(rows, np.int64)
    steps, m, *windows, ok = index.windows(rows, history + 1, n_step, committed_only,
                                           history, guard)
    w = np.ones(len(rows), np.float32) if weight is None else np.asarray(weight, np.float32)
    return ReadPlan(rows, steps, w, history, *windows, m, n_step, float(gamma), spare,
                    batches), ok
