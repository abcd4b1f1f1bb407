"""Execute a read plan against a row source: the one place plans become batches.

Samplers produce plans as plain data (``sampling.plans``); this module dispatches on the
plan's type to the module that reads that batch shape. It runs in DataLoader workers
(against a ``ShardReader``, or a ``StoreRows`` where an item names staged rows) and in the
main process (``Store.read_plan``, against ``Store.source``, a ``StoreRows`` that also
serves rows still staged in RAM); ``store_rows.py`` says which row is read where.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import StaleBatchError
from ..sampling.plans import HERPlan, MixturePlan, ReadPlan, SequencePlan
from ..storage.format import Layout
from .columns import Allocator, RowSource, numpy_alloc
from .her_batch import assemble_her
from .hot_batch import gather_from_hot_set
from .sequence_batch import assemble_sequences
from .transition_batch import finish_many, read_columns

#: plan type -> ``read(plan, layout, source) -> (batch, stale)`` for one-batch plans
ONE_BATCH_READERS: dict[type, Callable[[Any, Layout, RowSource], tuple[dict, int]]] = {
    SequencePlan: assemble_sequences,
    HERPlan: assemble_her,
}


def assemble(plan: Any, layout: Layout, source: RowSource) -> tuple[dict, int]:
    """Batch dict of numpy arrays for a one-batch ``plan`` and the number of stale samples
    replaced; :class:`StaleBatchError` when every sample was overwritten."""
    if isinstance(plan, MixturePlan):
        raise TypeError("a MixturePlan reads several stores: read each part against its "
                        "own store (MixtureSampler.read)")
    ((batch, stale),) = assemble_batches(plan, layout, source)
    if batch is None:
        raise StaleBatchError("every sampled row was overwritten before it was read; "
                              "increase the sampler's guard band")
    return batch, stale


def assemble_batches(plan: Any, layout: Layout, source: RowSource,
                     alloc: Allocator = numpy_alloc) -> list[tuple[dict | None, int]]:
    """``(batch, stale)`` for each batch of ``plan``, all read together and written into
    the arrays of one ``alloc`` call (a DataLoader worker passes views of a shared-memory
    slot). A batch every sample of which was overwritten is ``None``.
    """
    if type(plan) is ReadPlan:
        hot = gather_from_hot_set(plan, layout, source, alloc)
        if hot is not None:
            return hot
        return finish_many(plan, *read_columns(plan, layout, source, lazy=True), alloc)
    read = ONE_BATCH_READERS.get(type(plan))
    if read is None:
        raise TypeError(f"no reader for plans of type {type(plan).__name__}; expected one "
                        f"of ReadPlan, {', '.join(t.__name__ for t in ONE_BATCH_READERS)}")
    try:
        batch, stale = read(plan, layout, source)
    except StaleBatchError:
        alloc([{}])
        return [(None, plan.batch_size)]
    (out,) = alloc([{k: (v.shape, v.dtype) for k, v in batch.items()}])
    for k, v in batch.items():
        out[k][...] = v
    return [(out, stale)]
