"""Prioritized experience replay (Schaul et al. 2016), proportional variant.

``P(i) = p_i / sum_k p_k`` with ``p_i = (|δ_i| + eps) ** alpha``; new rows enter with the
largest priority seen so far. Batches are drawn stratified (one draw per ``1/B`` slice of
the priority mass) and come with importance weights ``w_i = (N P(i))^-beta / max_j w_j``,
which equals ``(p_i / p_min)^-beta``. ``beta`` follows a :class:`BetaSchedule`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .base import NotEnoughData, Sampler
from .priorities import BetaSchedule, PriorityIndex


def draw_valid(sampler: Any, prio: PriorityIndex, need: int,
               prune: Callable[[np.ndarray], None] | None = None) -> np.ndarray:
    """``need`` rows drawn by priority that pass ``sampler.valid`` (by rejection)."""
    out: list[np.ndarray] = []
    want = need
    for _ in range(64):
        rows = prio.draw(want, sampler.rng)
        ok = sampler.valid(rows)
        got = int(ok.sum())
        if got == want and not out:
            return rows  # the common case: every row drawn is sampleable
        if got < len(rows) and prune is not None:
            prune(rows[~ok])
        out.append(rows[ok])
        want -= got
        if want <= 0:
            break
    if want > 0:
        raise NotEnoughData(f"only {need - want} of {need} rows drawn by priority can be "
                            f"sampled (history={sampler.history}, guard={sampler.guard}); "
                            f"store holds {len(sampler.store)} rows")
    rows = np.concatenate(out)
    if len(out) > 1:  # keep sample order independent of the stratum a row came from
        rows = sampler.rng.permutation(rows)
    return rows


def draw_batches(sampler: Any, prio: PriorityIndex, batch_size: int, spare: int,
                 batches: int, prune: Callable[[np.ndarray], None] | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``batches`` groups of ``batch_size + spare`` rows, each group stratified on its own
    and weighted with the beta of its batch (``sampler.batches_drawn`` counts them)."""
    per = batch_size + spare
    rows = np.concatenate([draw_valid(sampler, prio, per, prune) for _ in range(batches)])
    betas = [sampler.beta_schedule(sampler.batches_drawn + i) for i in range(batches)]
    weights = prio.weights(rows, np.repeat(np.asarray(betas, np.float64), per))
    sampler.batches_drawn += batches
    return sampler.with_newest(rows, weights, per, spare)


class PrioritizedSampler(Sampler):
    """Proportional prioritized sampling over every intact transition of the store.

    ``alpha``: priority exponent; ``beta``: importance-sampling exponent at the start,
    annealed linearly to ``beta_final`` over ``beta_steps`` batches (or set by
    ``beta_schedule(batches_drawn)``); ``eps``: added to ``|δ|``. ``name``: key of the
    priorities saved with the store (``_index/<name>.bin``); ``persist=False`` keeps them
    in RAM only. Other arguments as for :class:`~expstore.sampling.base.Sampler`
    (``n_step``, ``gamma``, ``cer``, ``guard``, ``seed``...).

    Call ``update_priorities(batch["index"], td_error, batch["step_id"])`` after each
    learning step.
    """

    prioritized = True

    def __init__(self, store: Any, alpha: float = 0.6, beta: float = 0.4, eps: float = 1e-6,
                 beta_final: float = 1.0, beta_steps: int | None = None,
                 beta_schedule: Callable[[int], float] | None = None,
                 name: str = "priorities", persist: bool = True, **kwargs: Any) -> None:
        super().__init__(store, **kwargs)
        self._history = store.history  # fixed by the store's spec; read on every batch
        self.beta_schedule = BetaSchedule(beta, beta_final, beta_steps, beta_schedule)
        self.priorities = PriorityIndex(store, alpha, eps, name=name, persist=persist, lag=1)
        self.batches_drawn = 0

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
        return self.beta_schedule(self.batches_drawn)

    def draw(self, n: int) -> tuple[np.ndarray, np.ndarray]:
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

    def sample_rows(self, batch_size: int, spare: int = 0,
                    batches: int = 1) -> tuple[np.ndarray, np.ndarray]:
        self.maybe_refresh()
        return draw_batches(self, self.priorities, batch_size, spare, batches, self._prune)

    def update_priorities(self, index: Any, td_error: Any, step_id: Any = None) -> int:
        """Priorities ``(|td_error| + eps) ** alpha`` for rows ``index``; returns rows set.

        Pass ``step_id=batch["step_id"]`` so rows overwritten since sampling are skipped.
        """
        return self.priorities.update(index, td_error, step_id)

    def save_priorities(self) -> None:
        """Write the priorities under the store root now (also done on ``store.flush()``)."""
        self.priorities.save(force=True)

    def close(self) -> None:
        """Stop tracking the store (listeners and flush hook)."""
        self.priorities.detach()
