"""What crosses from sampling to loading: read plans, plain data; and the reader's view.

A sampler turns a need into a plan from the in-RAM index only; ``loading.execute``
executes plans against a row source (a DataLoader worker's shard reader, or the store in
this process), dispatching on the plan's type. Plans hold numpy arrays and numbers, no
store and no methods that read, so they pickle cheaply to workers: data flows one way.

:class:`ReaderView` goes the other way, as an argument: how the process that will read a
plan sees the store (only flushed rows, a guard band before the writer, spare samples).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

_TRANSITION_ARRAYS = ("rows", "steps", "weight", "obs_rows", "obs_pad", "obs_steps",
                      "next_rows", "next_pad", "next_steps", "horizon")


@dataclass(frozen=True)
class ReaderView:
    """How the process that reads a plan sees the store; made once by its caller.

    ``committed_only``: plan only rows on storage (another process cannot read this
    process's staged rows). ``guard``: rows kept clear ahead of each lane's write cursor,
    which the writer may overwrite before a prefetched plan is read (the sampler's own
    ``guard`` still applies: the larger wins). ``spare``: extra samples per batch that
    replace samples overwritten before they were read.
    """

    committed_only: bool = False
    guard: int = 0
    spare: int = 0

    def __post_init__(self) -> None:
        for name in ("guard", "spare"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name}: expected an int >= 0 (rows), got {v!r}")


#: the view of the process that owns the store: staged rows included, no guard, no spares
IN_PROCESS = ReaderView()


@dataclass
class ReadPlan:
    """Rows to read for ``batches`` batches of transitions (every array has ``n`` rows:
    ``batches * (batch_size + spare)``)."""

    rows: np.ndarray  # (n,) anchor rows
    steps: np.ndarray  # (n,) anchor lane steps
    weight: np.ndarray  # (n,) float32 importance weights
    history: int  # K-1, the deepest frame stack - 1
    obs_rows: np.ndarray  # (n, K) rows of the stack ending at the anchor (clamped)
    obs_pad: np.ndarray  # (n, K) True where the stack runs before the episode start
    obs_steps: np.ndarray  # (n, K) lane steps expected at obs_rows
    next_rows: np.ndarray  # (n, K) stack ending at anchor + m
    next_pad: np.ndarray  # (n, K)
    next_steps: np.ndarray  # (n, K)
    horizon: np.ndarray  # (n,) m
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
        cat = {k: np.concatenate([getattr(p, k) for p in plans]) for k in _TRANSITION_ARRAYS}
        return cls(**cat, history=p0.history, n_step=p0.n_step, gamma=p0.gamma,
                   spare=p0.spare, batches=sum(p.batches for p in plans))


def merge_plans(plans: list[Any]) -> list[Any]:
    """``plans`` as one plan of several batches where they are all ``ReadPlan``s."""
    if len(plans) > 1 and all(type(p) is ReadPlan for p in plans):
        return [ReadPlan.concat(plans)]
    return plans


@dataclass
class SequencePlan:
    """Rows to read for ``B`` sequences of ``W = burn_in + length`` steps (+ ``spare``)."""

    rows: np.ndarray  # (B,) start rows (first step after burn-in)
    steps: np.ndarray  # (B,) lane steps of the start rows
    weight: np.ndarray  # (B,) float32 importance weights
    burn_in: int
    length: int
    history: int  # K-1
    win_rows: np.ndarray  # (B, W) row read for each position (clamped into the episode)
    win_steps: np.ndarray  # (B, W)
    mask: np.ndarray  # (B, W) position holds a row of the start row's episode
    is_first: np.ndarray  # (B, W)
    is_last: np.ndarray  # (B, W) the episode's final row
    stack_rows: np.ndarray  # (B, W, K) frame-stack rows per position
    stack_pad: np.ndarray  # (B, W, K)
    stack_steps: np.ndarray  # (B, W, K)
    spare: int = 0

    @property
    def batch_size(self) -> int:
        return len(self.rows) - self.spare


@dataclass
class HERPlan:
    """A transition plan plus, per sample, the row whose achieved goal becomes its goal."""

    base: ReadPlan
    goal_rows: np.ndarray  # (n,) rows to read the achieved goal from
    goal_steps: np.ndarray  # (n,)
    relabel: np.ndarray  # (n,) bool
    achieved: str  # obs field name of the achieved goal, e.g. "obs.achieved_goal"
    desired: str  # field name of the desired goal
    compute_reward: Callable[..., Any]

    @property
    def rows(self) -> np.ndarray:
        return self.base.rows

    @property
    def batch_size(self) -> int:
        return self.base.batch_size


@dataclass
class MixturePlan:
    """One plan per component that contributes to the batch: ``(component, plan)``."""

    parts: list[tuple[int, Any]]

    @property
    def batch_size(self) -> int:
        return sum(p.batch_size for _, p in self.parts)
