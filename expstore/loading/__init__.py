"""Loading: execute read plans against storage and stream batches into PyTorch.

``assemble`` / ``assemble_batches`` (``execute.py``) turn any plan into batches of numpy
arrays, in DataLoader workers or in-process, reading rows from a row source:
``StoreRows`` (``store_rows.py``) merges staged rows (a writer's RAM, shared memory) with
shards by one rule for both; ``make_loader`` (``loader.py``, imports torch: loaded on
first use) wraps them in a ``torch.utils.data.DataLoader``.
"""

from typing import Any

from .columns import Gathered, RowSource, numpy_alloc
from .execute import ONE_BATCH_READERS, assemble, assemble_batches
from .store_rows import StagedSnapshot, StoreRows

_TORCH_NAMES = ("LoaderStats", "PlanGroups", "StoreDataset", "StoreLoader", "make_loader")

__all__ = [
    "ONE_BATCH_READERS",
    "Gathered",
    "RowSource",
    "StagedSnapshot",
    "StoreRows",
    "assemble",
    "assemble_batches",
    "numpy_alloc",
    *_TORCH_NAMES,
]


def __getattr__(name: str) -> Any:
    """The DataLoader side imports torch: it loads on first use."""
    if name in _TORCH_NAMES:
        from . import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'expstore.loading' has no attribute {name!r}")
