"""Drawing by priority, a part any sampler can hold: priorities kept with the store, the
importance-sampling schedule, and the count of batches drawn.

Priorities (:class:`~expstore.index.priorities.PriorityIndex`) persist with the store
(:class:`StoredPriorities`): saved as one object ``_index/<name>.bin`` on every
``store.flush()`` (so on ``close()``), loaded back by a sampler made on a reopened store.
Rows written after the save get the maximum priority, rows dropped since get 0.

:class:`PriorityDraw` draws each batch stratified over the priority mass (one draw per
``1/B`` slice) with importance weights ``w_i = (N P(i))^-beta / max_j w_j``, ``beta``
from a :class:`BetaSchedule`; :class:`~expstore.sampling.prioritized.PrioritizedSampler`
(transitions) and :class:`~expstore.sampling.sequence.SequenceSampler` (sequence starts)
hold one, and read priorities through :class:`ReadsPriorities`: ``sampler.priority(rows)``,
``sampler.total_priority``, ``sampler.max_priority``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import NotEnoughData
from ..index.priorities import PriorityIndex
from .plans import ReaderView

Prune = Callable[[np.ndarray], None]  # rows drawn that can never become valid -> zeroed


class BetaSchedule:
    """Importance-sampling exponent per batch: constant ``beta``, linear from ``beta`` to
    ``beta_final`` over ``beta_steps`` batches, or ``schedule(batches_drawn) -> beta``."""

    def __init__(self, beta: float = 0.4, beta_final: float = 1.0, beta_steps: int | None = None,
                 schedule: Callable[[int], float] | None = None) -> None:
        for name, v in (("beta", beta), ("beta_final", beta_final)):
            if not 0.0 <= float(v) <= 1.0:
                raise ValueError(f"{name}: expected 0..1, got {v}")
        if beta_steps is not None and int(beta_steps) < 1:
            raise ValueError(f"beta_steps: expected >= 1, got {beta_steps}")
        self.beta0 = float(beta)
        self.beta_final = float(beta_final)
        self.beta_steps = beta_steps
        self.schedule = schedule

    def __call__(self, n: int) -> float:
        if self.schedule is not None:
            b = float(self.schedule(n))
            if not 0.0 <= b <= 1.0:
                raise ValueError(f"beta schedule returned {b} at batch {n}; expected 0..1")
            return b
        if self.beta_steps is None:
            return self.beta0
        frac = min(1.0, n / self.beta_steps)
        return self.beta0 + frac * (self.beta_final - self.beta0)


class StoredPriorities:
    """A sampler's :class:`PriorityIndex`, kept with its store under ``name``.

    With ``persist``: made from the payload saved earlier (``store.load_priorities``, unless
    ``load=False``) and saved on every ``store.flush()`` (so on ``close()``) of a writable
    store when it changed. Other keyword arguments go to :class:`PriorityIndex`.
    """

    def __init__(self, store: Any, name: str, persist: bool = True, load: bool = True,
                 **kwargs: Any) -> None:
        self.store = store
        self.name = name
        saved = (store.load_priorities(name)
                 if persist and load and hasattr(store, "load_priorities") else None)
        self.priorities = PriorityIndex(store.index, saved=saved, **kwargs)
        self._hook: Callable[[], None] | None = None
        if persist and hasattr(store, "add_flush_hook"):
            ref = weakref.ref(self.priorities)

            def hook() -> None:
                prio = ref()
                if prio is None:
                    store.remove_flush_hook(hook)
                elif store.mode != "r":
                    _save(store, name, prio, force=False)

            self._hook = hook
            store.add_flush_hook(hook)

    def save(self, force: bool = False) -> bool:
        """Write the priorities with the store (``_index/<name>.bin``, one object of
        ``4 * capacity`` bytes before compression, replaced atomically); ``False`` if
        nothing changed since the last save and not ``force``."""
        return _save(self.store, self.name, self.priorities, force)

    def detach(self) -> None:
        """Stop listening to the index and to flushes."""
        self.priorities.detach()
        if self._hook is not None:
            self.store.remove_flush_hook(self._hook)
            self._hook = None


def _save(store: Any, name: str, prio: PriorityIndex, force: bool) -> bool:
    if not (prio.dirty or force):
        return False
    store.save_priorities(name, prio.payload())
    prio.dirty = False
    return True


class ReadsPriorities:
    """Priorities a prioritized sampler draws by, read publicly (sampling units
    ``(|δ| + eps) ** alpha``; the full API is its :class:`PriorityIndex`,
    ``sampler.priorities``)."""

    def _held(self) -> PriorityIndex:
        prio = getattr(self, "priorities", None)  # (each sampler defines it)
        if prio is None:
            raise ValueError(f"{type(self).__name__}: this sampler does not draw by priority "
                             "(pass prioritized=True)")
        return prio

    def priority(self, rows: Any) -> np.ndarray:
        """Priorities of ``rows`` (float64; 0 for rows not drawn: see
        :meth:`PriorityIndex.get`)."""
        return self._held().get(rows)

    @property
    def total_priority(self) -> float:
        """Sum of all rows' priorities: row ``i`` is drawn with probability
        ``priority(i) / total_priority``."""
        return self._held().total

    @property
    def max_priority(self) -> float:
        """The running maximum priority, which new rows get (never decreases)."""
        return self._held().max_priority


class PriorityDraw:
    """Anchor rows drawn by priority for ``sampler``'s need, with importance weights.

    ``name``/``persist``/``load``: see :class:`StoredPriorities`; other keyword arguments
    (``alpha``, ``eps``, ``accept``, ``kind``, ``lag``) go to the :class:`PriorityIndex`.
    """

    def __init__(self, store: Any, name: str, beta_schedule: BetaSchedule,
                 persist: bool = True, load: bool = True, **index_kwargs: Any) -> None:
        self.stored = StoredPriorities(store, name, persist, load, **index_kwargs)
        self.priorities = self.stored.priorities
        self.beta_schedule = beta_schedule
        self.batches_drawn = 0

    @property
    def beta(self) -> float:
        """The importance-sampling exponent the next batch will use."""
        return self.beta_schedule(self.batches_drawn)

    def draw_batches(self, sampler: Any, batch_size: int, batches: int, view: ReaderView,
                     prune: Prune | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``batches`` groups of ``batch_size + view.spare`` rows valid for ``sampler``,
        each group stratified on its own and weighted with the beta of its batch."""
        per = batch_size + view.spare
        rows = np.concatenate([self.draw_valid(sampler, per, view, prune)
                               for _ in range(batches)])
        betas = [self.beta_schedule(self.batches_drawn + i) for i in range(batches)]
        weights = self.priorities.weights(rows, np.repeat(np.asarray(betas, np.float64), per))
        self.batches_drawn += batches
        return sampler.with_newest(rows, weights, per, view)

    def draw_valid(self, sampler: Any, need: int, view: ReaderView,
                   prune: Prune | None = None) -> np.ndarray:
        """``need`` rows drawn by priority that pass ``sampler.valid`` (by rejection)."""
        out: list[np.ndarray] = []
        want = need
        for _ in range(64):
            rows = self.priorities.draw(want, sampler.rng)
            ok = sampler.valid(rows, view)
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
                                f"sampled (history={sampler.history}, "
                                f"guard={sampler.guard_for(view)}); "
                                f"store holds {len(sampler.store)} rows")
        rows = np.concatenate(out)
        if len(out) > 1:  # keep sample order independent of the stratum a row came from
            rows = sampler.rng.permutation(rows)
        return rows

    def update(self, rows: Any, priority: Any, step_id: Any = None) -> int:
        """Set priorities of ``rows`` (see :meth:`PriorityIndex.update`); rows set."""
        return self.priorities.update(rows, priority, step_id)

    def save(self, force: bool = False) -> bool:
        return self.stored.save(force)

    def detach(self) -> None:
        self.stored.detach()
