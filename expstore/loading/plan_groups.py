"""The loader's ``batch_sampler``: plans drawn in the main process, grouped into
DataLoader items (:class:`PlanGroups`), each a :class:`PlanItem`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..sampling.plans import ReaderView, ReadPlan, merge_plans
from .store_rows import StagedSnapshot


class PlanItem(list):
    """One DataLoader item: plans, and (``staged``) per lane the writer session whose staged
    rows they may name and the committed count when they were drawn (``None``: plans of
    committed rows only)."""

    staged: StagedSnapshot | None = None


class PlanGroups:
    """The loader's ``batch_sampler``: ``group`` plans of ``batch_size`` from ``sampler``
    per DataLoader item (a worker reads several batches in one call and sends them in one
    message), drawn for a reader with ``view``; ``num_batches`` in all (``None``: endless).
    """

    def __init__(self, sampler: Any, batch_size: int, view: ReaderView, group: int = 1,
                 num_batches: int | None = None, staged: Any = None) -> None:
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.view = view
        self.group = max(1, int(group))
        self.num_batches = num_batches
        self.staged = staged  # () -> StagedSnapshot when plans may name staged rows

    def plan(self) -> Any:
        """One batch's plan."""
        return self.sampler.plan(self.batch_size, view=self.view)

    def item(self, plans: list[Any]) -> PlanItem:
        """``plans`` as one DataLoader item (with what a worker needs to read them)."""
        item = PlanItem(plans)
        if self.staged is not None:
            item.staged = self.staged()
        return item

    def __iter__(self) -> Iterator[list[ReadPlan]]:
        total, done = self.num_batches, 0
        while total is None or done < total:
            k = self.group if total is None else min(self.group, total - done)
            plan_batches = getattr(self.sampler, "plan_batches", None)
            yield self.item(plan_batches(k, self.batch_size, self.view)
                            if plan_batches is not None
                            else merge_plans([self.plan() for _ in range(k)]))
            done += k

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("an endless loader has no len(); pass num_batches")
        return -(-self.num_batches // self.group)
