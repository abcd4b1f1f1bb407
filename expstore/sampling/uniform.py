"""Uniform sampling over every intact row of every lane."""

from __future__ import annotations

import numpy as np

from ..errors import NotEnoughData
from .base import Sampler
from .plans import ReaderView


def uniform_rows(sampler: Sampler, n: int, view: ReaderView) -> np.ndarray:
    """``n`` rows drawn uniformly over the intact rows of all lanes that a reader with
    ``view`` can read (outside the guard band)."""
    idx = sampler.index
    guard = sampler.guard_for(view)
    present = idx.present(guard, view.committed_only)
    total = int(present.sum())
    if total == 0:
        raise NotEnoughData(f"the store holds no sampleable rows yet "
                            f"(rows={len(sampler.store)}, guard={guard})")
    k = sampler.rng.integers(0, total, size=n)
    bounds = np.cumsum(present)
    lane = np.searchsorted(bounds, k, side="right")
    offset = k - (bounds[lane] - present[lane])
    steps = idx.lower_bound(guard)[lane] + offset
    return lane * idx.lane_capacity + steps % idx.lane_capacity


class UniformSampler(Sampler):
    """Each intact transition equally likely; weights are all 1."""

    def draw(self, n: int, view: ReaderView) -> tuple[np.ndarray, None]:
        return uniform_rows(self, n, view), None
