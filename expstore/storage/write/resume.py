"""Reopening a lane for writing: a new :class:`LaneWriter` holding the rows of the lane's
open shard, the one its last flush left partly filled."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ...errors import StoreCorruptError
from ..format import LaneState, Layout, Quarantine
from .writer import LaneWriter


class RowReader(Protocol):
    """Reads committed rows from storage (a ``ShardReader``)."""

    def read(self, name: str, rows: np.ndarray, steps: np.ndarray,
             out: np.ndarray) -> np.ndarray: ...


def resume_writer(backend: Any, layout: Layout, state: LaneState, quarantine: Quarantine,
                  reader: Callable[[], RowReader], **options: Any) -> LaneWriter:
    """A writer of lane ``state.lane`` going on from its committed ``state``.

    When the lane's open shard is partly written, its committed rows are read back
    (``reader()``: this process's shard reader, asked for only then) into the writer's
    staging buffer, so the shard's next write holds them; rows ``quarantine`` marks lost
    are restored as zeros. ``backend``: the one the writer writes through (a
    ``LeasedBackend`` where the lane is leased); ``options``: ``LaneWriter``'s keywords.
    ``StoreCorruptError`` when the shard does not hold a row its state commits.
    """
    w = LaneWriter(backend, layout, LaneState(**vars(state)), **options)
    if not w.n:
        return w
    lane = state.lane
    steps = np.arange(w.first_step, w.count)
    keep = ~quarantine.mask(lane, steps)  # lost rows are restored as zeros
    rows = layout.lane_rows(lane, steps)
    read = reader().read
    data = {}
    for name, f in layout.fields.items():
        buf = np.zeros((len(rows), *f.shape), f.dtype)
        part = buf[keep]
        if not read(name, rows[keep], steps[keep], part).all():
            key = layout.shard_key(name, w.shard_index(w.first_step))
            raise StoreCorruptError(f"{backend.url}/{key}: partial shard does not hold "
                                    "its committed rows")
        buf[keep] = part
        data[name] = buf
    w.load_partial(data)
    return w
