"""Prioritized experience replay (Schaul et al. 2016), proportional variant.

``P(i) = p_i / sum_k p_k`` with ``p_i = (|δ_i| + eps) ** alpha``; new rows enter with the
largest priority seen so far. Batches are drawn stratified (one draw per ``1/B`` slice of
the priority mass) and come with importance weights ``w_i = (N P(i))^-beta / max_j w_j``,
which equals ``(p_i / p_min)^-beta``. ``beta`` follows a :class:`BetaSchedule`. The
drawing, weighting and persistence are a :class:`~expstore.sampling.by_priority.PriorityDraw`
this sampler holds (``by_priority``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..index.priorities import PriorityIndex
from .base import Sampler
from .by_priority import BetaSchedule, PriorityDraw, ReadsPriorities
from .plans import IN_PROCESS, ReaderView


class PrioritizedSampler(ReadsPriorities, Sampler):
    """Proportional prioritized sampling over every intact transition of the store.

    ``alpha``: priority exponent; ``beta``: importance-sampling exponent at the start,
    annealed linearly to ``beta_final`` over ``beta_steps`` batches (or set by
    ``beta_schedule(batches_drawn)``); ``eps``: added to ``|δ|``. ``name``: key of the
    priorities saved with the store (``_index/<name>.bin``); ``persist=False`` keeps them
    in RAM only. Other arguments as for :class:`~expstore.sampling.base.Sampler`
    (``n_step``, ``gamma``, ``cer``, ``guard``, ``seed``...).

    Call ``update_priorities(batch["index"], td_error, batch["step_id"])`` after each
    learning step; read them back with ``priority(rows)``, ``total_priority`` and
    ``max_priority`` (:class:`~expstore.sampling.by_priority.ReadsPriorities`).
    """

    prioritized = True

    def __init__(self, store: Any, alpha: float = 0.6, beta: float = 0.4, eps: float = 1e-6,
                 beta_final: float = 1.0, beta_steps: int | None = None,
                 beta_schedule: Callable[[int], float] | None = None,
                 name: str = "priorities", persist: bool = True, **kwargs: Any) -> None:
        super().__init__(store, **kwargs)
        self._history = store.history  # fixed by the store's spec; read on every batch
        self.by_priority = PriorityDraw(
            store, name, BetaSchedule(beta, beta_final, beta_steps, beta_schedule), persist,
            alpha=alpha, eps=eps, lag=1)

    @property
    def priorities(self) -> PriorityIndex:
        return self.by_priority.priorities

    @property
    def beta_schedule(self) -> BetaSchedule:
        return self.by_priority.beta_schedule

    @beta_schedule.setter
    def beta_schedule(self, schedule: BetaSchedule) -> None:
        self.by_priority.beta_schedule = schedule

    @property
    def batches_drawn(self) -> int:
        return self.by_priority.batches_drawn

    @property
    def history(self) -> int:
        return self._history

    @property
    def alpha(self) -> float:
        return self.priorities.alpha

    @property
    def eps(self) -> float:
        return self.priorities.eps

    @property
    def beta(self) -> float:
        """The importance-sampling exponent the next batch will use."""
        return self.by_priority.beta

    def draw(self, n: int, view: ReaderView) -> tuple[np.ndarray, np.ndarray]:
        rows = self.priorities.draw(n, self.rng)
        return rows, self.priorities.weights(rows, self.beta)

    def _prune(self, rows: np.ndarray) -> None:
        """Zero rows that can never become valid (history or horizon permanently broken)."""
        idx = self.index
        lane = rows // idx.lane_capacity
        settled = idx.steps(rows) + self.n_step < idx.count[lane]
        rows = rows[settled]
        if len(rows):
            self.priorities.clear(rows[~idx.valid(rows, self.history, self.n_step, 0)])

    def draw_rows(self, batch_size: int, batches: int = 1, view: ReaderView = IN_PROCESS
                  ) -> tuple[np.ndarray, np.ndarray]:
        return self.by_priority.draw_batches(self, batch_size, batches, view, self._prune)

    def update_priorities(self, index: Any, td_error: Any, step_id: Any = None) -> int:
        """Priorities ``(|td_error| + eps) ** alpha`` for rows ``index``; returns rows set.

        Pass ``step_id=batch["step_id"]`` so rows overwritten since sampling are skipped.
        """
        return self.by_priority.update(index, td_error, step_id)

    def save_priorities(self) -> None:
        """Write the priorities under the store root now (also done on ``store.flush()``)."""
        self.by_priority.save(force=True)

    def close(self) -> None:
        """Stop tracking the store (listeners and flush hook)."""
        self.by_priority.detach()
