"""Uniform sampling over every intact row of every lane."""

from __future__ import annotations

import numpy as np

from .base import NotEnoughData, Sampler


def uniform_rows(sampler: Sampler, n: int) -> np.ndarray:
    """``n`` rows drawn uniformly over the intact rows of all lanes (outside the guard)."""
    idx = sampler.index
    present = idx.present(sampler.guard, sampler.committed_only)
    total = int(present.sum())
    if total == 0:
        raise NotEnoughData(f"the store holds no sampleable rows yet "
                            f"(rows={len(sampler.store)}, guard={sampler.guard})")
    k = sampler.rng.integers(0, total, size=n)
    bounds = np.cumsum(present)
    lane = np.searchsorted(bounds, k, side="right")
    offset = k - (bounds[lane] - present[lane])
    steps = idx.lower_bound(sampler.guard)[lane] + offset
    return lane * idx.lane_capacity + steps % idx.lane_capacity


class UniformSampler(Sampler):
    """Each intact transition equally likely; weights are all 1."""

    def draw(self, n: int) -> tuple[np.ndarray, None]:
        return uniform_rows(self, n), None
