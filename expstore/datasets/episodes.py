"""Lanes and episodes of a store as importers and exporters see them.

* :func:`lane_rows` — the intact rows of a lane in write order, with their metadata.
* :func:`store_episodes` — where the complete episodes of a store are.
* :func:`capacity_for` — store capacity for lanes of a given number of rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..rows import FLAG_FIRST, FLAG_LAST


@dataclass
class LaneRows:
    """Intact rows of one lane in write order (all arrays have one entry per row)."""

    lane: int
    steps: np.ndarray  # lane steps (int64)
    rows: np.ndarray  # global rows (int64)
    flags: np.ndarray  # uint8 FLAG_*
    episode_step: np.ndarray  # int32


def lane_rows(store: Any, lane: int) -> LaneRows:
    """The intact rows of ``lane`` (from the in-RAM index; oldest first)."""
    idx = store.index
    lo = int(idx.lower_bound()[lane])
    steps = np.arange(lo, int(idx.count[lane]), dtype=np.int64)
    rows = idx.lane_rows(lane, steps)
    return LaneRows(lane, steps, rows, idx.flags[rows].copy(), idx.episode_step[rows].copy())


def store_episodes(store: Any) -> list[tuple[int, int, int]]:
    """``(lane, first_step, T)`` of every complete episode held, lane by lane, oldest first."""
    idx = store.index
    lo = idx.lower_bound(0)
    out: list[tuple[int, int, int]] = []
    for lane in range(store.lanes):
        steps = np.arange(lo[lane], idx.count[lane])
        if not len(steps):
            continue
        fl = idx.flags[idx.lane_rows(lane, steps)]
        last = steps[(fl & FLAG_LAST) != 0]
        T = idx.episode_step[idx.lane_rows(lane, last)].astype(np.int64)
        first = last - T
        ok = (first >= lo[lane]) & (T >= 1)
        ok &= (idx.flags[idx.lane_rows(lane, np.maximum(first, 0))] & FLAG_FIRST) != 0
        out += [(lane, int(f), int(t)) for f, t in zip(first[ok], T[ok], strict=True)]
    return out


def capacity_for(rows_per_lane: int, lanes: int = 1, capacity: int | None = None) -> int:
    """Store capacity whose lanes each hold ``rows_per_lane`` rows (``create`` rounds it up
    to whole shards); a given ``capacity`` is checked to be large enough."""
    need = max(int(rows_per_lane), 1) * lanes
    if capacity is None:
        return need
    if capacity < need:
        raise ValueError(f"capacity: {capacity} rows cannot hold {lanes} lane(s) of "
                         f"{rows_per_lane} rows (need >= {need})")
    return int(capacity)


class ExportReader:
    """Reads fields of a store for an export, through a shard reader of its own with small
    caches (``cache_bytes``, default 8 MB), so an export's memory stays ~ one block of rows
    rather than the store's sampling caches (up to ~200 MB)."""

    def __init__(self, store: Any, cache_bytes: int = 8 << 20) -> None:
        from ..storage.read import ShardReader

        self.store = store
        self.reader = ShardReader(store.backend, store.layout, chunk_cache_bytes=cache_bytes,
                                  values_budget=cache_bytes)

    def read(self, name: str, rows: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Values of ``name`` at ``rows`` holding ``steps``; rows must be committed."""
        f = self.store.layout.fields[name]
        out = np.empty((len(rows), *f.shape), f.dtype)
        ok = self.reader.read(name, np.asarray(rows, np.int64), np.asarray(steps, np.int64),
                              out)
        if not ok.all():
            raise KeyError(f"{name}: rows {np.asarray(rows)[~ok][:8].tolist()} are not held")
        return out

    def close(self) -> None:
        self.reader.close()
