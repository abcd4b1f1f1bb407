"""A lane writer's side of the index snapshot (``format/index_snapshot.py``): the
metadata of the lane's open block, collected as its full shards are committed, and the
block's object, written once the commit covering its last shard is.

Written after the lane state commit, by whoever commits (the background thread for full
shards, ``flush`` for shards whose write had failed): a crash before the block is written
leaves it missing, never wrong, and opening reads those steps from the metadata shards. A
block write that fails is not an error of the commit (the steps are read from the shards).
"""

from __future__ import annotations

import numpy as np

from ...rows import FLAG_BAD
from ..backends import Backend
from ..format import Layout, block_key, block_of, block_rows, encode_block


class SnapshotBlocks:
    """Lane ``lane``'s open snapshot block: steps ``[first, first + filled)`` of it are
    collected (``first = -1``: none; the block is then skipped until its next lap)."""

    def __init__(self, layout: Layout, lane: int) -> None:
        if layout.store_id is None:
            raise ValueError("index snapshot blocks need a store id (Layout.store_id)")
        self.layout = layout
        self.lane = lane
        self.first = -1
        self.filled = 0
        self.rows = 0
        self.block = -1
        self._ep: np.ndarray | None = None  # (allocated on first use: 5 B per block row)
        self._fl: np.ndarray | None = None
        self.written = 0  # blocks written by this writer

    def wants(self, next_step: int) -> tuple[int, int]:
        """Steps ``[a, b)`` of the block holding ``next_step`` that come before it: what a
        resumed writer, whose first full shard starts at ``next_step``, must be given
        (:meth:`resume`) to write that block in this lap."""
        _, first, _ = block_of(self.layout, next_step)
        return first, next_step

    def resume(self, first_step: int, episode_step: np.ndarray, flags: np.ndarray) -> None:
        """The committed metadata of steps ``first_step ..`` of the open block (read at
        open), so that the block can be written when its last shard is committed."""
        if len(flags):
            self._take(first_step, episode_step, flags)

    def committed(self, backend: Backend, first_step: int, episode_step: np.ndarray,
                  flags: np.ndarray) -> None:
        """A full shard (steps ``first_step ..``) was committed: collect its metadata, and
        write the block when this completes it (errors: the block stays missing)."""
        if not self._take(first_step, episode_step, flags):
            return
        if self.filled < self.rows:
            return
        ep, fl = self._ep[:self.rows], self._fl[:self.rows]
        first, block = self.first, self.block
        self.first = -1
        if np.any(fl & FLAG_BAD):  # (RAM-only marks: never stored)
            return
        try:
            backend.put(block_key(self.lane, block),
                        encode_block(self.layout.store_id, self.lane, block, first, ep, fl))
            self.written += 1
        except Exception:  # noqa: BLE001 - an accelerator: a block not written is scanned
            pass

    def _take(self, first_step: int, episode_step: np.ndarray, flags: np.ndarray) -> bool:
        """Copy rows into the open block; ``False`` when they do not continue it (the
        block is dropped, or a new one opened where they start one)."""
        j, first, rows = block_of(self.layout, first_step)
        if first != self.first or first_step != first + self.filled:
            self.first = -1
            if first_step != first:
                return False
            self.first, self.block, self.rows, self.filled = first, j, rows, 0
            if self._ep is None:
                most = block_rows(self.layout)
                self._ep, self._fl = np.empty(most, np.int32), np.empty(most, np.uint8)
        n = len(flags)
        if self.filled + n > self.rows:
            self.first = -1
            return False
        self._ep[self.filled:self.filled + n] = episode_step
        self._fl[self.filled:self.filled + n] = flags
        self.filled += n
        return True
