"""Uniform sampling over every intact row of every lane."""

from __future__ import annotations

import numpy as np

from .base import NotEnoughData, Sampler


class UniformSampler(Sampler):
    """Each intact transition equally likely; weights are all 1."""

    def draw(self, n: int) -> tuple[np.ndarray, None]:
        idx = self.index
        present = idx.present(self.guard, self.committed_only)
        total = int(present.sum())
        if total == 0:
            raise NotEnoughData(f"the store holds no sampleable rows yet "
                                f"(rows={len(self.store)}, guard={self.guard})")
        k = self.rng.integers(0, total, size=n)
        bounds = np.cumsum(present)
        lane = np.searchsorted(bounds, k, side="right")
        offset = k - (bounds[lane] - present[lane])
        steps = idx.lower_bound(self.guard)[lane] + offset
        return lane * idx.lane_capacity + steps % idx.lane_capacity, None
