"""From sampled anchor rows to a *read plan*: every row a batch touches, with its step.

A plan is computed in the main process from the in-RAM index only, and is small (a few
integers per sample), so it crosses to DataLoader workers cheaply. Workers execute it
against storage (``loading.assemble``) without needing the index: data flows one way.

For anchor row ``t`` with look-ahead ``m`` (1..n, shorter at an episode's final row):
``obs`` is the frame stack ending at ``t``; ``next_obs`` the stack ending at ``t + m``;
``reward`` = sum_j<m gamma^j r_{t+j}; ``discount`` = gamma^m, zero when the episode
terminated inside the horizon (a truncated episode bootstraps from its final row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..index.rows import RowIndex


@dataclass
class ReadPlan:
    """Rows to read for a batch of ``B`` transitions (all arrays have ``B`` rows)."""

    rows: np.ndarray  # (B,) anchor rows
    steps: np.ndarray  # (B,) anchor lane steps
    weight: np.ndarray  # (B,) float32 importance weights
    history: int  # K-1, the deepest frame stack - 1
    obs_rows: np.ndarray  # (B, K) rows of the stack ending at the anchor (clamped)
    obs_pad: np.ndarray  # (B, K) True where the stack runs before the episode start
    obs_steps: np.ndarray  # (B, K) lane steps expected at obs_rows
    next_rows: np.ndarray  # (B, K) stack ending at anchor + m
    next_pad: np.ndarray  # (B, K)
    next_steps: np.ndarray  # (B, K)
    horizon: np.ndarray  # (B,) m
    n_step: int
    gamma: float
    spare: int = 0  # trailing samples of each batch that only replace stale ones
    batches: int = 1  # consecutive batches of batch_size + spare samples each

    @property
    def batch_size(self) -> int:
        return len(self.rows) // self.batches - self.spare

    @classmethod
    def concat(cls, plans: list[ReadPlan]) -> ReadPlan:
        """One plan reading several batches at once (same sampler settings)."""
        if len(plans) == 1:
            return plans[0]
        p0 = plans[0]
        arrays = ("rows", "steps", "weight", "obs_rows", "obs_pad", "obs_steps", "next_rows",
                  "next_pad", "next_steps", "horizon")
        cat = {k: np.concatenate([getattr(p, k) for p in plans]) for k in arrays}
        return cls(**cat, history=p0.history, n_step=p0.n_step, gamma=p0.gamma,
                   spare=p0.spare, batches=sum(p.batches for p in plans))

    def take(self, sel: np.ndarray) -> ReadPlan:
        """Plan restricted to samples ``sel``."""
        return ReadPlan(self.rows[sel], self.steps[sel], self.weight[sel], self.history,
                        self.obs_rows[sel], self.obs_pad[sel], self.obs_steps[sel],
                        self.next_rows[sel], self.next_pad[sel], self.next_steps[sel],
                        self.horizon[sel], self.n_step, self.gamma, 0)


def merge_plans(plans: list[Any]) -> list[Any]:
    """``plans`` as one plan of several batches where they are all ``ReadPlan``s."""
    if len(plans) > 1 and all(type(p) is ReadPlan for p in plans):
        return [ReadPlan.concat(plans)]
    return plans


def stack_rows(index: RowIndex, rows: np.ndarray, steps: np.ndarray,
               k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows ``t-k+1 .. t`` of each row's episode, clamped at its first row; pad mask; steps."""
    rows = np.asarray(rows, np.int64)
    if k == 1:  # no frame stack: the rows themselves
        return rows[:, None], np.zeros((len(rows), 1), bool), np.asarray(steps, np.int64)[:, None]
    back = np.arange(k - 1, -1, -1, dtype=np.int64)  # k-1 .. 0
    pos = index.episode_step[rows].astype(np.int64)
    pad = back[None, :] > pos[:, None]
    shift = np.minimum(back[None, :], pos[:, None])
    lane, slot = np.divmod(rows, index.lane_capacity)
    out = lane[:, None] * index.lane_capacity + (slot[:, None] - shift) % index.lane_capacity
    return out, pad, np.asarray(steps, np.int64)[:, None] - shift


def make_plan(index: RowIndex, rows: np.ndarray, weight: np.ndarray | None = None,
              history: int = 0, n_step: int = 1, gamma: float = 0.99,
              spare: int = 0, committed_only: bool = False, batches: int = 1) -> ReadPlan:
    """Plan for anchors ``rows`` (already checked with ``index.valid``): ``batches``
    consecutive batches of ``len(rows) // batches`` samples (``spare`` of them spares)."""
    rows = np.asarray(rows, np.int64)
    steps = index.steps(rows)
    ends, m = index.horizon(rows, n_step, committed_only, steps)
    k = history + 1
    obs = stack_rows(index, rows, steps, k)
    nxt = stack_rows(index, ends, steps + m, k)
    w = np.ones(len(rows), np.float32) if weight is None else np.asarray(weight, np.float32)
    return ReadPlan(rows, steps, w, history, *obs, *nxt, m, n_step, float(gamma), spare,
                    batches)
