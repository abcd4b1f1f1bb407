"""Uniform sampling over every intact row of every lane."""

from __future__ import annotations

import numpy as np

from ..errors import NotEnoughData
from .base import Sampler
from .plans import IN_PROCESS, ReaderView


def uniform_draws(sampler: Sampler, n: int, view: ReaderView) -> np.ndarray:
    """``n`` uniform draws over the intact rows of all lanes that a reader with ``view``
    can read (outside the guard band): draw ``k`` names the ``k``-th such row
    (``RowIndex.rows_at``). Raises ``NotEnoughData`` when there is none."""
    guard = sampler.guard_for(view)
    total = int(sampler.index.present(guard, view.committed_only).sum())
    if total == 0:
        raise NotEnoughData(f"the store holds no sampleable rows yet "
                            f"(rows={len(sampler.store)}, guard={guard})")
    return sampler.rng.integers(0, total, size=n)


def uniform_rows(sampler: Sampler, n: int, view: ReaderView) -> np.ndarray:
    """``n`` rows drawn uniformly over the intact rows of all lanes that a reader with
    ``view`` can read (outside the guard band)."""
    return sampler.index.rows_at(uniform_draws(sampler, n, view), sampler.guard_for(view),
                                 view.committed_only)


class UniformSampler(Sampler):
    """Each intact transition equally likely; weights are all 1."""

    def draw(self, n: int, view: ReaderView) -> tuple[np.ndarray, None]:
        return uniform_rows(self, n, view), None

    def draw_valid(self, n: int, need: int, view: ReaderView) -> tuple[np.ndarray, None]:
        """``draw(n)`` and ``valid`` in one pass over the index (``RowIndex.draw_valid``):
        the same rows, from the same random numbers."""
        if type(self).valid is not Sampler.valid or type(self).draw is not UniformSampler.draw:
            return super().draw_valid(n, need, view)  # (a subclass's own rule)
        out = np.empty(need, np.int64)
        got = self.index.draw_valid(uniform_draws(self, n, view), out, 0, self.history,
                                    self.n_step, self.guard_for(view), view.committed_only)
        return out[:got], None

    def draw_rows(self, batch_size: int, batches: int = 1, view: ReaderView = IN_PROCESS
                  ) -> tuple[np.ndarray, None]:
        """:meth:`Sampler.draw_rows` in one pass over the index per round where nothing
        overrides the uniform draw (no CER): the same rows from the same random numbers,
        written into one array (``RowIndex.draw_valid``), the sampleable count read once."""
        cls = type(self)
        if self.cer or cls.draw_valid is not UniformSampler.draw_valid or \
                cls.valid is not Sampler.valid or cls.draw is not UniformSampler.draw:
            return super().draw_rows(batch_size, batches, view)
        n = batches * (batch_size + view.spare)
        guard, co = max(self.guard, view.guard), view.committed_only
        index = self.index
        bounds = index.lower_bound(guard), index.upper_bound(co)
        total = int(np.maximum(bounds[1] - bounds[0], 0).sum())  # (RowIndex.present)
        if total == 0:
            raise NotEnoughData(f"the store holds no sampleable rows yet "
                                f"(rows={len(self.store)}, guard={guard})")
        out = np.empty(n, np.int64)
        got, history, rng = 0, self.history, self.rng
        for _ in range(64):
            need = n - got
            got = index.draw_valid(rng.integers(0, total, size=max(need * 2, 16)), out, got,
                                   history, self.n_step, guard, co, bounds)
            if got >= n:
                return out, None
        raise NotEnoughData(
            f"only {got} of {n} sampled rows can start a transition (history={history}, "
            f"n_step={self.n_step}, guard={guard}); store holds {len(self.store)} rows")
