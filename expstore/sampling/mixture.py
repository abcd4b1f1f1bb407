"""Batches mixed from several samplers or stores in fixed fractions.

E.g. a small buffer of recent experience next to a large long-term one, or online data
next to an offline dataset (RLPD: half and half). Each batch takes ``round(f_i * B)`` samples
from component ``i``; the rounding error is carried to the next batches, so over many
batches every component gets exactly its fraction. ``batch["source"]`` says which
component each sample came from; pass it back to ``update_priorities``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import ExpstoreError, NotEnoughData
from .base import Sampler, check_batch, read_fresh
from .plans import IN_PROCESS, MixturePlan, ReaderView
from .uniform import UniformSampler


class MixtureSampler:
    """Mix ``components``: a sequence of ``(sampler_or_store, fraction)`` pairs (fractions
    are normalized). A store stands for a :class:`UniformSampler` over it.

    ``strict=False`` gives the share of a component that cannot sample yet (e.g. an empty
    online buffer) to the others; ``strict=True`` raises :class:`NotEnoughData`.
    ``skip_corrupt=True``: samples whose reads touch a corrupt chunk are skipped, for every
    component (a component sampler's own ``skip_corrupt=True`` holds for it alone).
    """

    def __init__(self, components: Sequence[tuple[Any, float]], strict: bool = False,
                 seed: int | None = None, skip_corrupt: bool = False) -> None:
        if not components:
            raise ValueError("components: expected at least one (sampler, fraction) pair")
        samplers, fracs = [], []
        for i, item in enumerate(components):
            try:
                s, f = item
            except (TypeError, ValueError) as e:
                raise ValueError(f"components[{i}]: expected a (sampler, fraction) pair") from e
            if not isinstance(s, Sampler) and not hasattr(s, "plan"):
                s = UniformSampler(s, seed=None if seed is None else seed + i,
                                   skip_corrupt=skip_corrupt)
            if not (float(f) >= 0):
                raise ValueError(f"components[{i}]: fraction must be >= 0, got {f}")
            samplers.append(s)
            fracs.append(float(f))
        total = sum(fracs)
        if total <= 0:
            raise ValueError("components: fractions must not all be 0")
        self.samplers = samplers
        self.fractions = np.asarray(fracs) / total
        self.strict = strict
        self.skip_corrupt = bool(skip_corrupt)
        self._carry = np.zeros(len(samplers))

    def split(self, batch_size: int, active: np.ndarray | None = None) -> np.ndarray:
        """Samples per component for one batch (largest remainder + carried error)."""
        f = self.fractions if active is None else np.where(active, self.fractions, 0.0)
        f = f / f.sum()
        ideal = f * batch_size + np.where(f > 0, self._carry, 0.0)
        counts = np.maximum(np.floor(ideal), 0).astype(np.int64)
        short = batch_size - int(counts.sum())
        if short > 0:
            order = np.argsort(-(ideal - counts), kind="stable")
            order = order[f[order] > 0]
            counts[order[:short]] += 1
        elif short < 0:
            order = np.argsort(ideal - counts, kind="stable")
            for i in order:
                while short < 0 and counts[i] > 0:
                    counts[i] -= 1
                    short += 1
        self._carry = np.where(f > 0, ideal - counts, 0.0)
        return counts

    def plan(self, batch_size: int, batches: int = 1,
             view: ReaderView = IN_PROCESS) -> MixturePlan:
        """One batch: each component's share planned by that component."""
        b, batches = check_batch(batch_size, batches)
        if batches != 1:
            raise ValueError(f"batches: a mixture plan holds one batch, got {batches}")
        active = np.ones(len(self.samplers), bool)
        while True:
            counts = self.split(b, active)
            parts, failed = [], None
            for i, n in enumerate(counts):
                if n == 0:
                    continue
                try:
                    parts.append((i, self.samplers[i].plan(int(n), view=view)))
                except NotEnoughData as e:
                    if self.strict:
                        raise
                    failed, why = i, e
                    break
            if failed is None:
                return MixturePlan(parts)
            active[failed] = False
            if not (active & (self.fractions > 0)).any():
                raise NotEnoughData(f"no component of the mixture can sample yet (component "
                                    f"{failed}: {why})")

    def read(self, plan: MixturePlan) -> dict[str, np.ndarray]:
        """Read a mixture plan in this process (each part from its own store; a part every
        sample of which was overwritten before it was read is planned again by its
        component, after a refresh: ``base.read_fresh``)."""
        batches = []
        for i, p in plan.parts:
            sampler = self.samplers[i]
            skip = self.skip_corrupt or bool(getattr(sampler, "skip_corrupt", False))
            b = read_fresh(sampler.store, _first_then(p, sampler), skip,
                           lambda s=sampler: s.maybe_refresh(now=True))
            b["source"] = np.full(len(b["index"]), i, np.int64)
            batches.append(b)
        keys = set(batches[0])
        for (i, _), b in zip(plan.parts, batches):
            if set(b) != keys:
                raise ExpstoreError(f"mixture component {i} returns fields {sorted(b)}, "
                                    f"component {plan.parts[0][0]} returns {sorted(keys)}")
        return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}

    def sample(self, batch_size: int, view: ReaderView = IN_PROCESS) -> dict[str, np.ndarray]:
        return self.read(self.plan(batch_size, view=view))

    def update_priorities(self, index: Any, td_error: Any, step_id: Any = None,
                          source: Any = None) -> int:
        """Route ``td_error`` to the prioritized components by ``source``."""
        from ..index.priorities import to_numpy

        index = to_numpy(index, np.int64)
        td = to_numpy(td_error, np.float64)
        prio = [i for i, s in enumerate(self.samplers) if getattr(s, "prioritized", False)]
        if not prio:
            return 0
        if source is None:
            if len(self.samplers) > 1:
                raise ValueError("source: pass batch['source'] so priorities reach the "
                                 "component that sampled each row")
            source = np.zeros(len(index), np.int64)
        source = to_numpy(source, np.int64)
        sid = None if step_id is None else to_numpy(step_id, np.int64)
        done = 0
        for i in prio:
            sel = source == i
            if sel.any():
                done += self.samplers[i].update_priorities(
                    index[sel], td[sel], None if sid is None else sid[sel])
        return done


def _first_then(plan: Any, sampler: Any) -> Callable[[], Any]:
    """``plan`` on the first call, then fresh plans of as many samples by ``sampler``."""
    given = [plan]
    return lambda: given.pop() if given else sampler.plan(plan.batch_size)

