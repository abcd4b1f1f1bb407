"""What every sampler shares: turning a need into valid anchor rows and a read plan.

A sampler reads only the in-RAM index. ``plan(batch_size)`` draws anchor rows (the
subclass's ``draw``), rejects rows that cannot serve the need (final rows, history or
horizon crossing an episode start, overwritten data, the guard band), and returns a
:class:`ReadPlan`. ``sample(batch_size)`` also reads it in this process. Used as a
DataLoader ``batch_sampler`` it yields plans forever (or ``num_batches`` of them).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import ExpstoreError
from .plan import ReadPlan, make_plan, merge_plans


class NotEnoughData(ExpstoreError):
    """The store holds too few rows that can serve the sampler's need."""


class Sampler:
    """Base class. ``n_step``/``gamma``: n-step returns; ``guard``: rows kept clear of the
    write cursor (set by ``make_loader`` from the prefetch depth); ``cer``: put the newest
    transition in every batch (combined experience replay); ``refresh_every``: seconds
    between re-reading lane states written by other processes (``None``: never)."""

    def __init__(self, store: Any, n_step: int = 1, gamma: float = 0.99, guard: int = 0,
                 cer: bool = False, seed: int | None = None,
                 refresh_every: float | None = None, batch_size: int | None = None,
                 num_batches: int | None = None) -> None:
        if n_step < 1:
            raise ValueError(f"n_step: expected >= 1, got {n_step}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma: expected 0..1, got {gamma}")
        self.store = store
        self.n_step = int(n_step)
        self.gamma = float(gamma)
        self.guard = int(guard)
        self.cer = bool(cer)
        self.rng = np.random.default_rng(seed)
        self.refresh_every = refresh_every
        self._last_refresh = time.monotonic()
        self.batch_size = batch_size
        self.num_batches = num_batches
        self.spare = 0
        #: sample only rows on storage (set by make_loader: workers cannot see staged rows)
        self.committed_only = False

    @property
    def index(self):
        return self.store.index

    @property
    def history(self) -> int:
        return self.store.history

    # -- to override -----------------------------------------------------------------------
    def draw(self, n: int) -> tuple[np.ndarray, np.ndarray | None]:
        """``n`` candidate rows and their weights (``None`` = all 1)."""
        raise NotImplementedError

    # -- shared ----------------------------------------------------------------------------
    def valid(self, rows: np.ndarray) -> np.ndarray:
        return self.index.valid(rows, self.history, self.n_step, self.guard,
                                self.committed_only)

    def maybe_refresh(self) -> None:
        if self.refresh_every is not None and \
                time.monotonic() - self._last_refresh >= self.refresh_every:
            self.store.refresh()
            self._last_refresh = time.monotonic()

    def sample_rows(self, batch_size: int, spare: int = 0,
                    batches: int = 1) -> tuple[np.ndarray, np.ndarray | None]:
        """Valid anchor rows (+ weights), by rejection: ``batches`` consecutive groups of
        ``batch_size`` rows and ``spare`` spares each (CER: see :meth:`with_newest`)."""
        self.maybe_refresh()
        n = batches * (batch_size + spare)
        rows_out: list[np.ndarray] = []
        w_out: list[np.ndarray] = []
        need = n
        for _ in range(64):
            rows, w = self.draw(max(need * 2, 16))
            ok = self.valid(rows)
            rows_out.append(rows[ok][:need])
            if w is not None:
                w_out.append(w[ok][:need])
            need -= len(rows_out[-1])
            if need <= 0:
                break
        if need > 0:
            raise NotEnoughData(
                f"only {n - need} of {n} sampled rows can start a "
                f"transition (history={self.history}, n_step={self.n_step}, "
                f"guard={self.guard}); store holds {len(self.store)} rows")
        rows = np.concatenate(rows_out)
        weights = np.concatenate(w_out) if w_out else None
        return self.with_newest(rows, weights, batch_size + spare, spare)

    def with_newest(self, rows: np.ndarray, weights: np.ndarray | None, per: int | None = None,
                    spare: int = 0) -> tuple[np.ndarray, np.ndarray | None]:
        """CER (``cer``): the newest transition (weight 1) becomes the last sample of each
        group of ``per`` rows (default: all of them) before its ``spare`` spares."""
        if self.cer:
            newest = self.newest_row()
            if newest is not None:
                per = per or len(rows)
                at = np.arange(per - spare - 1, len(rows), per)
                rows[at] = newest
                if weights is not None:
                    weights[at] = 1.0
        return rows, weights

    def newest_row(self) -> int | None:
        """The newest row that can start a transition in the most recently written lane."""
        idx = self.index
        lane = idx.last_lane
        count = int(idx.upper_bound(self.committed_only)[lane])
        for back in range(1, self.n_step + 3):
            step = count - back
            if step < 0:
                break
            row = idx.lane_rows(lane, np.array([step]))
            if self.valid(row)[0]:
                return int(row[0])
        return None

    def plan(self, batch_size: int | None = None, batches: int = 1) -> ReadPlan:
        """Read plan for ``batches`` batches (each + ``self.spare`` spare samples), drawn
        at once: the same as ``ReadPlan.concat`` of ``batches`` single plans."""
        b = batch_size or self.batch_size
        if not b:
            raise ValueError("batch_size: expected a positive int")
        if int(batches) < 1:
            raise ValueError(f"batches: expected a positive int, got {batches}")
        rows, w = self.sample_rows(b, self.spare, int(batches))
        return make_plan(self.index, rows, w, self.history, self.n_step, self.gamma,
                         spare=self.spare, committed_only=self.committed_only,
                         batches=int(batches))

    def plan_batches(self, k: int) -> list[Any]:
        """Plans of ``k`` batches for one DataLoader item: one plan drawn at once, or,
        where a subclass defines its own ``plan``, ``k`` of its plans (merged if they
        are ``ReadPlan``s)."""
        if type(self).plan is not Sampler.plan:
            return merge_plans([self.plan() for _ in range(k)])
        return [self.plan(batches=k)]

    def sample(self, batch_size: int | None = None) -> dict[str, np.ndarray]:
        """One batch read in this process: dict of numpy arrays incl. index and weight."""
        from ..loading.assemble import assemble

        batch, _ = assemble(self.plan(batch_size), self.store.layout, self.store._source)
        return batch

    def update_priorities(self, index: Any, priority: Any) -> None:
        """Uniform samplers ignore priorities."""

    # -- DataLoader batch_sampler protocol ------------------------------------------------
    def __iter__(self) -> Iterator[list[ReadPlan]]:
        n = 0
        while self.num_batches is None or n < self.num_batches:
            yield [self.plan()]
            n += 1

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("an endless sampler has no len(); pass num_batches")
        return self.num_batches
