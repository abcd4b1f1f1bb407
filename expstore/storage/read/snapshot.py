"""Reading a lane's index snapshot blocks (``format/index_snapshot.py``) at open: which
steps of a load they give, and their metadata.

A block is used only where its header and payload check out (crc32c), it was written for
this store (``store_id``), lane and block with the layout's geometry, and only for the
steps the lane state still holds as the block has them (``valid_steps``). Everything else
(blocks missing, damaged, of another store or an older lap, the lane's tail since its last
whole block) is left to the metadata shards. Blocks are fetched in order, a few at a time
(concurrently on remote stores): a load holds at most :data:`FETCH_BLOCKS` blocks, one on
a local store.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ...errors import StoreCorruptError
from ..backends import Backend
from ..format import (
    LaneState,
    Layout,
    block_key,
    block_of,
    block_rows,
    decode_block,
    fits,
    valid_steps,
)

#: blocks fetched at once from a remote store (~320 KiB each; a local one: one at a time)
FETCH_BLOCKS = 16


class SnapshotRanges:
    """The snapshot's usable ranges of lane ``st.lane`` for a load of steps ``[start,
    st.count)``, in step order. Nothing is read where the store has no id, or the load is
    shorter than a block (a ``refresh()`` increment: the shards are read)."""

    def __init__(self, backend: Backend, layout: Layout, st: LaneState, start: int) -> None:
        self.backend = backend
        self.layout = layout
        self.lane = st.lane
        self.count, self.valid_from = st.count, st.valid_from
        self._segments: deque[tuple[int, int, int]] = deque()  # (block, start, stop)
        self._ready: deque[tuple[int, int, int, np.ndarray, np.ndarray]] = deque()
        self.used_rows = 0  # steps served from blocks
        lo = max(start, st.count - layout.lane_capacity, st.valid_from)
        if layout.store_id is None or st.count - lo < block_rows(layout):
            return
        c = lo
        while c < st.count:
            j, first, rows = block_of(layout, c)
            stop = min(first + rows, st.count)
            self._segments.append((j, c, stop))
            c = stop

    def at(self, step: int) -> tuple[int, np.ndarray, np.ndarray] | None:
        """``(stop, episode_step, flags)`` of steps ``[step, stop)`` when a block gives
        ``step``; else ``None``."""
        r = self._first_after(step)
        if r is None or r[0] > step:
            return None
        _, stop, j, ep, fl = r
        off = step % self.layout.lane_capacity - j * block_rows(self.layout)
        n = stop - step
        self.used_rows += n
        return stop, ep[off:off + n], fl[off:off + n]

    def next_start(self, step: int) -> int:
        """First step after ``step`` a block gives (the lane's count if none)."""
        r = self._first_after(step)
        return self.count if r is None else r[0]

    def _first_after(self, step: int) -> tuple[int, int, int, np.ndarray, np.ndarray] | None:
        ready = self._ready
        while True:
            while ready and ready[0][1] <= step:
                ready.popleft()
            if ready or not self._segments:
                return ready[0] if ready else None
            self._fetch()

    def _fetch(self) -> None:
        at_once = 1 if self.backend.is_local else FETCH_BLOCKS
        segs = [self._segments.popleft()
                for _ in range(min(at_once, len(self._segments)))]
        keys = [block_key(self.lane, j) for j, _, _ in segs]
        L = self.layout.lane_capacity
        for (j, c, stop), key, raw in zip(segs, keys, self.backend.get_many(keys),
                                          strict=True):
            if raw is None:
                continue
            try:
                head, ep, fl = decode_block(raw, f"{self.backend.url}/{key}")
            except StoreCorruptError:  # torn or damaged: the shards are read instead
                continue
            if not fits(head, self.layout, self.lane, j):
                continue
            a, b = valid_steps(head, self.count, self.valid_from, L)
            a, b = max(a, c), min(b, stop)
            if a < b:
                self._ready.append((a, b, j, ep, fl))
