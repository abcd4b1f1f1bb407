"""What every sampler shares: turning a need into valid anchor rows and a read plan.

A sampler reads only the in-RAM index. ``plan(batch_size, batches, view)`` draws anchor
rows (the subclass's ``draw``), rejects rows that cannot serve the need (final rows,
history or horizon crossing an episode start, overwritten data, the guard band) and
returns a :class:`~expstore.sampling.plans.ReadPlan`: plain data. Everything a plan
depends on is an argument (the :class:`ReaderView` says how its reader sees the store);
nothing outside the sampler configures it by setting attributes. ``sample(batch_size)``
is a convenience: its plan, read in this process by the store (``store.read_plan``, the
store's row source); data flows one way, index -> sampler -> plan -> rows -> batch
(``Store.sample`` plans with its own sampler and reads the plan itself).

A sampler on a read-only store (``es.open(url)``, mode ``"r"``: a learner whose actors write
in other processes) re-reads the lanes every :data:`AUTO_REFRESH` seconds unless told
otherwise (``refresh_every``); a sampler on a store this process writes never refreshes
unless asked. When too few rows can be sampled, :class:`NotEnoughData` says how many rows
each lane holds and, where other processes write, how this sampler picks their rows up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

import numpy as np

from ..errors import NotEnoughData, StaleBatchError
from .plans import IN_PROCESS, ReaderView, ReadPlan, merge_plans
from .windows import checked_plan

#: seconds between refreshes of a sampler on a read-only store (``refresh_every="auto"``)
AUTO_REFRESH = 1.0


def auto_refresh_every(store: Any, refresh_every: float | str | None) -> float | None:
    """``refresh_every`` as seconds or ``None`` (never): ``"auto"`` is :data:`AUTO_REFRESH`
    for a read-only store (mode ``"r"``, no lane written through it), else ``None``."""
    if refresh_every == "auto":
        read_only = getattr(store, "mode", None) == "r" and not getattr(store, "writers", None)
        return AUTO_REFRESH if read_only and hasattr(store, "refresh") else None
    if refresh_every is None:
        return None
    if isinstance(refresh_every, (bool, str)) or not isinstance(refresh_every, (int, float)) \
            or not refresh_every >= 0:
        raise ValueError(f"refresh_every: expected seconds >= 0, None (never) or 'auto', got "
                         f"{refresh_every!r}")
    return float(refresh_every)


class Sampler:
    """Base class. ``n_step``/``gamma``: n-step returns; ``guard``: rows kept clear of the
    write cursor (a reader's view may ask for more); ``cer``: put the newest transition in
    every batch (combined experience replay); ``refresh_every``: seconds between
    re-reading lane states written by other processes (``store.refresh()``, before a batch
    is drawn; ``0``: before every batch; ``None``: never; ``"auto"``, the default:
    :data:`AUTO_REFRESH` s on a read-only store, never on a store this process writes);
    ``skip_corrupt=True``: a chunk that fails its checks does not end training: the
    samples whose reads touch it are skipped (:meth:`sample` and ``make_loader``; see
    ``loading/skip_corrupt.py``)."""

    def __init__(self, store: Any, n_step: int = 1, gamma: float = 0.99, guard: int = 0,
                 cer: bool = False, seed: int | None = None,
                 refresh_every: float | str | None = "auto",
                 skip_corrupt: bool = False) -> None:
        if n_step < 1:
            raise ValueError(f"n_step: expected >= 1, got {n_step}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma: expected 0..1, got {gamma}")
        if int(guard) < 0:
            raise ValueError(f"guard: expected >= 0 rows, got {guard}")
        self.store = store
        self.n_step = int(n_step)
        self.gamma = float(gamma)
        self.guard = int(guard)
        self.cer = bool(cer)
        self.rng = np.random.default_rng(seed)
        self.refresh_every = auto_refresh_every(store, refresh_every)
        self.skip_corrupt = bool(skip_corrupt)
        self._last_refresh = time.monotonic()

    @property
    def index(self):
        return self.store.index

    @property
    def history(self) -> int:
        return self.store.history

    def guard_for(self, view: ReaderView) -> int:
        """Rows kept clear of the write cursor for a reader with ``view``."""
        return max(self.guard, view.guard)

    # -- to override -----------------------------------------------------------------------
    def draw(self, n: int, view: ReaderView) -> tuple[np.ndarray, np.ndarray | None]:
        """``n`` candidate rows and their weights (``None`` = all 1)."""
        raise NotImplementedError

    def draw_valid(self, n: int, need: int, view: ReaderView
                   ) -> tuple[np.ndarray, np.ndarray | None]:
        """Of ``n`` drawn rows, the first ``need`` that pass :meth:`valid` (and weights)."""
        rows, w = self.draw(n, view)
        ok = self.valid(rows, view)
        return rows[ok][:need], None if w is None else w[ok][:need]

    # -- shared ----------------------------------------------------------------------------
    def valid(self, rows: np.ndarray, view: ReaderView = IN_PROCESS) -> np.ndarray:
        """Which ``rows`` can start this sampler's need, as a reader with ``view`` sees them."""
        return self.index.valid(rows, self.history, self.n_step, self.guard_for(view),
                                view.committed_only)

    def maybe_refresh(self, now: bool = False) -> None:
        """``store.refresh()`` when ``refresh_every`` seconds passed since the store last
        read its lane states (by anyone: samplers of one store share the refreshes);
        ``now``: at once, whatever ``refresh_every`` says (the plans this sampler drew
        were all overwritten before they were read: its view of the store is stale)."""
        if not now:
            if self.refresh_every is None:
                return
            last = getattr(self.store, "refreshed_at", None)
            if time.monotonic() - (self._last_refresh if last is None else last) \
                    < self.refresh_every:
                return
        self.store.refresh()
        self._last_refresh = time.monotonic()

    def data_hint(self) -> str:
        """What a :class:`NotEnoughData` adds: rows held per lane and, where other
        processes write lanes of the store, how this sampler sees their rows."""
        idx = self.index
        held = [int(c - v) for c, v in zip(idx.count, idx.lower_bound(0))]
        text = "rows held per lane: " + ", ".join(f"{n:,}" for n in held)
        store = self.store
        written_here = getattr(store, "writers", None) or {}
        if not hasattr(store, "refresh") or len(written_here) == len(held):
            return text
        if self.refresh_every is None:
            return (text + "; rows other processes write appear only after store.refresh(): "
                    "call it, or pass refresh_every=SECONDS to the sampler")
        return (text + f"; this sampler re-reads the lanes other processes write every "
                f"{self.refresh_every:g} s (store.refresh()): their rows appear once they "
                "flush (on this host: once added, where they stage in shared memory)")

    def sample_rows(self, batch_size: int, batches: int = 1, view: ReaderView = IN_PROCESS
                    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Valid anchor rows (+ weights): ``batches`` consecutive groups of ``batch_size``
        rows and ``view.spare`` spares each (refreshing first when ``refresh_every`` says
        so); :class:`NotEnoughData` ends with :meth:`data_hint`."""
        self.maybe_refresh()
        try:
            return self.draw_rows(batch_size, batches, view)
        except NotEnoughData as e:
            if "rows held per lane" in str(e):
                raise
            raise NotEnoughData(f"{e}; {self.data_hint()}") from None

    def draw_rows(self, batch_size: int, batches: int = 1, view: ReaderView = IN_PROCESS
                  ) -> tuple[np.ndarray, np.ndarray | None]:
        """:meth:`sample_rows` without the refresh: by rejection (CER: see
        :meth:`with_newest`); subclasses drawing otherwise override this."""
        spare = view.spare
        n = batches * (batch_size + spare)
        rows_out: list[np.ndarray] = []
        w_out: list[np.ndarray] = []
        need = n
        for _ in range(64):
            rows, w = self.draw_valid(max(need * 2, 16), need, view)
            rows_out.append(rows)
            if w is not None:
                w_out.append(w)
            need -= len(rows)
            if need <= 0:
                break
        if need > 0:
            raise NotEnoughData(
                f"only {n - need} of {n} sampled rows can start a "
                f"transition (history={self.history}, n_step={self.n_step}, "
                f"guard={self.guard_for(view)}); store holds {len(self.store)} rows")
        rows = rows_out[0] if len(rows_out) == 1 else np.concatenate(rows_out)
        weights = None if not w_out else w_out[0] if len(w_out) == 1 else np.concatenate(w_out)
        return self.with_newest(rows, weights, batch_size + spare, view)

    def with_newest(self, rows: np.ndarray, weights: np.ndarray | None, per: int,
                    view: ReaderView) -> tuple[np.ndarray, np.ndarray | None]:
        """CER (``cer``): the newest transition (weight 1) becomes the last sample of each
        group of ``per`` rows, before the group's ``view.spare`` spares."""
        if self.cer:
            newest = self.newest_row(view)
            if newest is not None:
                at = np.arange(per - view.spare - 1, len(rows), per)
                rows[at] = newest
                if weights is not None:
                    weights[at] = 1.0
        return rows, weights

    def newest_row(self, view: ReaderView = IN_PROCESS) -> int | None:
        """The newest row that can start a transition in the most recently written lane."""
        idx = self.index
        lane = idx.last_lane
        count = int(idx.upper_bound(view.committed_only)[lane])
        for back in range(1, self.n_step + 3):
            step = count - back
            if step < 0:
                break
            row = idx.lane_rows(lane, np.array([step]))
            if self.valid(row, view)[0]:
                return int(row[0])
        return None

    def plan(self, batch_size: int, batches: int = 1,
             view: ReaderView = IN_PROCESS) -> ReadPlan:
        """Read plan for ``batches`` batches of ``batch_size`` samples (+ ``view.spare``
        spares each), drawn at once: the same as ``ReadPlan.concat`` of single plans."""
        batch_size, batches = check_batch(batch_size, batches)
        rows, w = self.sample_rows(batch_size, batches, view)
        return plan_valid(self, rows, w, view, lambda r, wt: checked_plan(
            self.index, r, wt, self.history, self.n_step, self.gamma, view.spare,
            view.committed_only, batches, self.guard_for(view)))

    def plan_batches(self, k: int, batch_size: int, view: ReaderView = IN_PROCESS
                     ) -> list[Any]:
        """Plans of ``k`` batches for one DataLoader item: one plan drawn at once, or,
        where a subclass defines its own ``plan``, ``k`` of its plans (merged if they
        are ``ReadPlan``s)."""
        if type(self).plan is not Sampler.plan:
            return merge_plans([self.plan(batch_size, view=view) for _ in range(k)])
        return [self.plan(batch_size, k, view)]

    def sample(self, batch_size: int, view: ReaderView = IN_PROCESS) -> dict[str, np.ndarray]:
        """One batch read in this process: dict of numpy arrays incl. index and weight
        (:meth:`plan`, read by ``store.read_plan``; a plan every sample of which was
        overwritten before it was read is drawn again: :func:`read_fresh`)."""
        return read_fresh(self.store, lambda: self.plan(batch_size, view=view),
                          self.skip_corrupt, lambda: self.maybe_refresh(now=True))

    def update_priorities(self, index: Any, td_error: Any, step_id: Any = None) -> int:
        """Uniform samplers ignore priorities: 0 rows set (the prioritized samplers'
        arguments, so one training loop serves every sampler)."""
        return 0


#: rounds of drawing again the samples another thread's adds made invalid before
#: :func:`plan_valid` gives up
REDRAWS = 64


def plan_valid(sampler: Sampler, rows: np.ndarray, weights: np.ndarray | None,
               view: ReaderView, build: Callable[[np.ndarray, np.ndarray | None],
                                                 tuple[Any, np.ndarray]]) -> Any:
    """``build(rows, weights)``'s plan (a ``ReadPlan`` or ``SequencePlan``) once every
    sample of it is valid at the steps it names: the samples ``build`` says are not
    (``(plan, ok)``) are drawn again and planned in their places.

    A sampler's draw and its plan read the index at two moments (the draw's random
    numbers release the GIL), and another thread of the process adding to the store
    between them may make a drawn row hold a later step: a final row, or one whose next
    step is not written yet. Without other threads every sample is valid at once."""
    plan, ok = build(rows, weights)
    for _ in range(REDRAWS):
        if np.count_nonzero(ok) == len(ok):  # (a quarter of ``ok.all()``'s cost)
            return plan
        bad = np.flatnonzero(~ok)
        more, more_w = sampler.draw_rows(len(bad), 1, replace(view, spare=0))
        part, part_ok = build(more[: len(bad)], None if more_w is None else more_w[: len(bad)])
        n = len(ok)
        for f in fields(plan):  # (every per-sample array: the samples' rows in the plan)
            v = getattr(plan, f.name)
            if isinstance(v, np.ndarray) and v.shape[:1] == (n,):
                v[bad] = getattr(part, f.name)
        ok[bad] = part_ok
    raise StaleBatchError(f"{REDRAWS} rounds of drawing again the samples that rows added "
                          "meanwhile rewrote did not give a valid batch: another thread "
                          "adds to the store faster than this sampler can plan")


#: plans :func:`read_fresh` (and ``make_loader``) draw before they give up
STALE_REPLANS = 8


def read_fresh(store: Any, plan: Callable[[], Any], skip_corrupt: bool,
               refresh: Callable[[], None]) -> dict[str, np.ndarray]:
    """``store.read_plan(plan())``; where every sample of the plan was overwritten before
    it was read (other processes' writers lapped their rings since this process last
    read their lane states), ``refresh()`` and a fresh plan, up to :data:`STALE_REPLANS`
    plans, then :class:`StaleBatchError`. (Some samples overwritten: spares or repeats
    of the intact ones stand in, as before.)"""
    for _ in range(STALE_REPLANS):
        try:
            return store.read_plan(plan(), skip_corrupt=skip_corrupt)
        except StaleBatchError:
            refresh()
    raise StaleBatchError(f"{STALE_REPLANS} fresh batches in a row were overwritten before "
                          "they could be read; the writers outrun this reader's refreshes")


def check_batch(batch_size: Any, batches: Any = 1) -> tuple[int, int]:
    """``batch_size`` and ``batches`` as positive ints, or a ValueError naming the bad one."""
    for name, v in (("batch_size", batch_size), ("batches", batches)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name}: expected a positive int, got {v!r}")
    return int(batch_size), int(batches)
