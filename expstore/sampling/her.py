"""Hindsight experience replay (Andrychowicz et al. 2017) for goal-conditioned fields.

A fraction ``k / (k + 1)`` of each batch gets a new desired goal: the achieved goal of a
row of the same episode chosen by ``strategy`` (as in Stable-Baselines3's
``HerReplayBuffer``):

- ``"future"``: a row after the transition, up to the episode's final row;
- ``"final"``: the episode's final row (its final observation);
- ``"episode"``: any row of the episode after its first (still intact).

The new goal replaces ``desired`` in ``obs`` and ``next_obs`` and the reward becomes
``compute_reward(next achieved goal, new goal, info)`` (vectorized, Gymnasium-Robotics
signature; ``info`` is a dict of the batch's user fields). Goal rows are chosen here from
the index; the reader fetches them with the batch and relabels (so ``compute_reward``
must be picklable to run in DataLoader workers). Only transitions of finished episodes
(final row visible) are relabeled; ``batch["relabeled"]`` says which were.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..index.rows import RowIndex
from ..rows import FLAG_FIRST, FLAG_LAST
from .base import Sampler, read_fresh
from .plans import IN_PROCESS, HERPlan, ReaderView
from .uniform import UniformSampler

STRATEGIES = ("future", "final", "episode")


def episode_end(index: RowIndex, rows: np.ndarray, upper: np.ndarray | None = None,
                block: int = 64) -> np.ndarray:
    """Lane step of the final row of each row's episode; ``-1`` while it is not written
    yet (below ``upper``) or the episode was interrupted. Scans ``block`` rows at a time:
    ``O(episode length)`` per row."""
    rows = np.asarray(rows, np.int64)
    L = index.lane_capacity
    lane = rows // L
    steps = index.steps(rows)
    upper = (index.count if upper is None else upper)[lane]
    end = np.full(len(rows), -1, np.int64)
    todo = np.flatnonzero(steps >= 0)
    j = np.arange(block, dtype=np.int64)
    start = 0
    while len(todo):
        s = steps[todo, None] + start + j[None, :]
        exists = s < upper[todo, None]
        f = index.flags[lane[todo, None] * L + s % L]
        last = exists & ((f & FLAG_LAST) != 0)
        broken = (~exists) | ((f & FLAG_FIRST) != 0) & ((start + j)[None, :] > 0)
        hit_last = last.any(axis=1)
        first_last = np.argmax(last, axis=1)
        first_broken = np.where(broken.any(axis=1), np.argmax(broken, axis=1), block)
        found = hit_last & (first_last < first_broken)
        end[todo[found]] = s[found, first_last[found]]
        done = found | (first_broken < block)
        todo = todo[~done]
        start += block
    return end


class HERSampler:
    """Relabels goals of transitions drawn by ``sampler`` (or uniformly from a store).

    ``compute_reward(achieved_goal, desired_goal, info) -> reward`` (batched, numpy);
    ``k``: relabeled samples per original one (ratio ``k / (k + 1)``); ``achieved`` /
    ``desired``: field names (default ``obs.achieved_goal`` / ``obs.desired_goal``).
    Usable with ``make_loader`` like any sampler. ``skip_corrupt=True``: samples whose
    reads touch a corrupt chunk are skipped (as for any sampler; default: the wrapped
    sampler's setting).
    """

    def __init__(self, sampler: Any, compute_reward: Callable[..., Any],
                 strategy: str = "future", k: float = 4,
                 achieved: str = "obs.achieved_goal", desired: str = "obs.desired_goal",
                 seed: int | None = None, skip_corrupt: bool = False) -> None:
        if not isinstance(sampler, Sampler):
            sampler = UniformSampler(sampler, seed=seed, skip_corrupt=skip_corrupt)
        self.skip_corrupt = bool(skip_corrupt) or bool(getattr(sampler, "skip_corrupt", False))
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy: expected one of {STRATEGIES}, got {strategy!r}")
        if not k >= 0:
            raise ValueError(f"k: expected >= 0 relabeled samples per original, got {k}")
        if not callable(compute_reward):
            raise TypeError("compute_reward: expected a callable "
                            "(achieved_goal, desired_goal, info) -> reward")
        if sampler.n_step != 1:
            raise ValueError(f"n_step: HER relabels one-step rewards (expected n_step=1, "
                             f"got {sampler.n_step})")
        spec = sampler.store.spec
        if achieved not in spec.obs_names:
            raise ValueError(f"achieved: {achieved!r} is not an observation field of the "
                             f"store (observation fields: {spec.obs_names})")
        if desired not in spec.fields:
            raise ValueError(f"desired: {desired!r} is not a field of the store "
                             f"(fields: {list(spec.fields)})")
        for name in (achieved, desired):
            if spec.fields[name].stack:
                raise ValueError(f"{name}: goal fields must not be frame-stacked")
        if spec.fields[achieved].shape != spec.fields[desired].shape:
            raise ValueError(f"{achieved} has shape {spec.fields[achieved].shape} but "
                             f"{desired} has {spec.fields[desired].shape}")
        self.sampler = sampler
        self.compute_reward = compute_reward
        self.strategy = strategy
        self.k = float(k)
        self.achieved = achieved
        self.desired = desired
        self.rng = np.random.default_rng(seed)

    # -- facade of the wrapped sampler ----------------------------------------------------
    @property
    def store(self) -> Any:
        return self.sampler.store

    @property
    def index(self) -> RowIndex:
        return self.sampler.index

    @property
    def history(self) -> int:
        return self.sampler.history

    @property
    def n_step(self) -> int:
        return self.sampler.n_step

    @property
    def gamma(self) -> float:
        return self.sampler.gamma

    @property
    def guard(self) -> int:
        return self.sampler.guard

    @property
    def prioritized(self) -> bool:
        return bool(getattr(self.sampler, "prioritized", False))

    @property
    def ratio(self) -> float:
        """Fraction of each batch that is relabeled."""
        return self.k / (self.k + 1.0)

    # -- planning -------------------------------------------------------------------------
    def plan(self, batch_size: int, batches: int = 1,
             view: ReaderView = IN_PROCESS) -> HERPlan:
        """The wrapped sampler's plan of one batch, with goal rows chosen per sample."""
        if batches != 1:
            raise ValueError(f"batches: a HER plan holds one batch, got {batches}")
        base = self.sampler.plan(batch_size, view=view)
        idx = self.index
        n = len(base.rows)
        B = base.batch_size
        relabel = np.zeros(n, bool)
        n_rel = int(round(B * self.ratio))
        relabel[self.rng.permutation(B)[:n_rel]] = True
        relabel[B:] = self.rng.random(n - B) < self.ratio
        end = episode_end(idx, base.rows, idx.upper_bound(view.committed_only))
        relabel &= end >= 0
        steps = base.steps
        if self.strategy == "final":
            goal = end
        else:
            if self.strategy == "future":
                lo = steps + 1
            else:
                lane = base.rows // idx.lane_capacity
                ep_start = steps - idx.episode_step[base.rows]
                guard = self.sampler.guard_for(view)
                lo = np.maximum(ep_start + 1, idx.lower_bound(guard)[lane])
            hi = np.maximum(end, lo)
            goal = lo + np.floor(self.rng.random(n) * (hi - lo + 1)).astype(np.int64)
            goal = np.minimum(goal, hi)
        goal = np.where(relabel, goal, steps)
        lane = base.rows // idx.lane_capacity
        goal_rows = lane * idx.lane_capacity + goal % idx.lane_capacity
        return HERPlan(base, goal_rows, goal, relabel, self.achieved, self.desired,
                       self.compute_reward)

    def plan_batches(self, k: int, batch_size: int,
                     view: ReaderView = IN_PROCESS) -> list[HERPlan]:
        return [self.plan(batch_size, view=view) for _ in range(k)]

    def sample(self, batch_size: int, view: ReaderView = IN_PROCESS) -> dict[str, np.ndarray]:
        """One relabeled batch read in this process (drawn again where every sample was
        overwritten before it was read: ``base.read_fresh``)."""
        return read_fresh(self.store, lambda: self.plan(batch_size, view=view),
                          self.skip_corrupt, lambda: self.maybe_refresh(now=True))

    def maybe_refresh(self, now: bool = False) -> None:
        """The wrapped sampler's refresh (other processes' rows): what ``make_loader`` calls
        before it plans again a batch every sample of which was overwritten in flight."""
        self.sampler.maybe_refresh(now=now)

    def update_priorities(self, *args: Any, **kwargs: Any) -> Any:
        return self.sampler.update_priorities(*args, **kwargs)
