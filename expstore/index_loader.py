"""Lanes' committed rows, from storage into the in-RAM row index.

A store's :class:`IndexLoader` reads each lane's index snapshot blocks where they are
valid, and its metadata shards (``_episode_step``, ``_flags``) for the rest, up to a
committed lane state, and puts them into its :class:`RowIndex`, at open and on
``refresh()``. It is handed what it works with (the backend, the layout, the
index, this process's shard reader, the quarantine and lane states read at open) and
keeps the lane states the index reached (:attr:`IndexLoader.states`).

The lane's writer may lap a load (it drops a shard's previous lap, commits, then replaces
the shard): rows it drops meanwhile are skipped, never reported as damage; only a row
missed :data:`DAMAGE_READS` times under one unchanged lane state is
(:meth:`IndexLoader.read_block`). A bad metadata chunk is rebuilt from the rows around it
(``read_metadata``); rows nothing can rebuild, and quarantined rows, are marked lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from .errors import StoreCorruptError
from .index.rows import RowIndex
from .rows import FLAG_FIRST
from .storage.backends import Backend
from .storage.format import (
    LaneState,
    Layout,
    Quarantine,
    lost_ranges,
    read_metadata,
    read_quarantine,
    read_state,
)
from .storage.read import ShardReader, SnapshotRanges

#: seconds between re-reads of the quarantine on ``refresh()``
QUARANTINE_RELOAD = 5.0
#: rows of a lane indexed per block when a store is opened or refreshed (bounds the
#: temporary arrays of a load: about 40 bytes per row of a block)
LOAD_BLOCK_ROWS = 1 << 18
#: reads of a row that its lane state covers, under one state, before it counts as damage
DAMAGE_READS = 3


class IndexLoader:
    """Loads lanes' committed rows into ``index`` (see the module docstring).

    ``reader``: gives this process's shard reader (called at each read: a forked child
    gets its own). ``quarantine``: rows ``repair`` marked lost, as read at open (re-read
    by :meth:`reload_quarantine`). ``states``: every lane's state as read at open; entry
    ``lane`` becomes the state a load brought the lane up to.
    """

    def __init__(self, backend: Backend, layout: Layout, index: RowIndex,
                 reader: Callable[[], ShardReader], quarantine: Quarantine,
                 states: list[LaneState]) -> None:
        self.backend = backend
        self.layout = layout
        self.index = index
        self.reader = reader
        self.quarantine = quarantine
        self.quarantine_read = time.monotonic()  # when ``quarantine`` was read
        self.states = states
        self.snapshot_rows = 0  # rows loaded from index snapshot blocks so far

    def load_lane(self, st: LaneState) -> None:
        """Bring the index of one lane up to a committed state (reads metadata shards) and
        remember the state it reached (:attr:`states`).

        Steps the lane's index snapshot holds (``storage/read/snapshot.py``: blocks valid
        for this store, lane and lap) are copied from it; the rest is read from the
        metadata shards; quarantined rows are marked lost either way, so both give the
        same index. Streams: rows are read and indexed in blocks of
        :data:`LOAD_BLOCK_ROWS`, so the temporary arrays of a load stay a few MB whatever
        the lane's size (the index itself is 5 bytes per row). The lane's writer may lap
        this load: rows it drops meanwhile are skipped, never reported as damage
        (:meth:`read_block`).
        """
        idx = self.index
        lane = st.lane
        st = LaneState(**vars(st))  # (its valid_from rises if the writer drops rows)
        old_count = int(idx.count[lane])
        idx.set_valid_from(lane, st.valid_from)
        a = max(old_count, st.valid_from)
        quarantined = self.quarantine.lanes.get(lane, [])
        held = SnapshotRanges(self.backend, self.layout, st, a)
        while a < st.count:  # block ends aligned to LOAD_BLOCK_ROWS: no shard read twice
            got = held.at(a)
            if got is not None:  # steps [a, b) from the index snapshot
                b, ep, fl = got
                idx.put(lane, a, ep, fl)
                if quarantined:
                    idx.mark_lost(lane, quarantined, a, b)
                a = max(b, st.valid_from)
                continue
            b = min(st.count, held.next_start(a),
                    (a // LOAD_BLOCK_ROWS + 1) * LOAD_BLOCK_ROWS)
            ep, fl, lost = self.read_block(st, a, b)
            idx.set_valid_from(lane, st.valid_from)
            idx.put(lane, a, ep, fl)  # (rows below valid_from are not announced)
            damaged = lost_ranges(np.arange(a, b), lost)  # (quarantined ones included)
            if quarantined or damaged:
                idx.mark_lost(lane, quarantined + damaged, a, b)
            a = max(b, st.valid_from)  # blocks the writer dropped meanwhile: not read
        self.snapshot_rows += held.used_rows
        if int(idx.count[lane]) < st.count:  # the writer dropped every row left to read
            idx.count[lane] = idx.committed[lane] = st.count
        self.states[lane] = st

    def read_block(self, st: LaneState, start: int, stop: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Episode positions and flags of steps ``[start, stop)`` of lane ``st.lane``, and
        which of them are lost (quarantined, or metadata nothing could rebuild).

        A row its shard no longer holds was either dropped by the lane's writer since the
        state was read (the writer commits a state dropping a shard's previous lap before
        it replaces the shard, §4: a fresh read of the state then starts after the row,
        and ``st.valid_from`` is raised to it) or was being replaced while read. Rows the
        fresh state still covers are read again, as often as the writer moves on in
        between. A row still missed after :data:`DAMAGE_READS` reads under one state (the
        same generation: no writer moved) is damage (:class:`StoreCorruptError`, naming
        the shard).
        """
        lane = st.lane
        steps = np.arange(start, stop, dtype=np.int64)
        ep, fl, ok, lost = self._read_metadata(lane, steps, st.count)
        missing = np.flatnonzero(~ok)
        generation, unchanged = None, 0
        while len(missing):
            newer = read_state(self.backend, lane)
            st.valid_from = max(st.valid_from, min(newer.valid_from, st.count))
            missing = missing[steps[missing] >= st.valid_from]
            if not len(missing):
                break
            unchanged = unchanged + 1 if newer.generation == generation else 0
            if unchanged:
                time.sleep(0.01)  # (a shard being rewritten in place: give it a moment)
            if unchanged >= DAMAGE_READS - 1:
                bad = int(steps[missing[0]])
                shard = int(self.layout.lane_rows(lane, np.array([bad]))[0])
                raise StoreCorruptError(
                    f"{self.backend.url}/"
                    f"{self.layout.shard_key('_flags', shard // self.layout.shard_rows)}: "
                    f"lane {lane} state covers steps {st.valid_from}..{newer.count} but a "
                    f"shard does not hold step {bad}")
            generation = newer.generation
            span = slice(int(missing[0]), int(missing[-1]) + 1)  # (consecutive steps)
            e, f, again, gone = self._read_metadata(lane, steps[span], st.count)
            at = missing - span.start
            ep[missing], fl[missing], lost[missing] = e[at], f[at], gone[at]
            missing = missing[~again[at]]
        reader = self.reader()
        for name in ("_episode_step", "_flags"):  # read once: keep no decoded copy
            reader.drop_chunks(name)
        return ep, fl, lost

    def _read_metadata(self, lane: int, steps: np.ndarray, count: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``_episode_step`` and ``_flags`` of ``steps`` (consecutive) of ``lane``, which rows
        were read, and which rows are lost: a bad metadata chunk is rebuilt from the rows
        around it (``storage/format/metadata_rebuild.py``), and rows nothing can rebuild
        are lost. Quarantined rows are never read (lost, zeros). ``count``: the lane's
        count."""
        rows = self.layout.lane_rows(lane, steps)
        ep = np.zeros(len(rows), np.int32)
        fl = np.zeros(len(rows), np.uint8)
        lost = self.quarantine.mask(lane, steps)  # never read lost rows
        ok = lost.copy()
        keep = np.flatnonzero(~lost)
        if len(keep):
            bounds = (max(int(self.index.valid_from[lane]), count - self.layout.lane_capacity),
                      count)
            m = read_metadata(self.reader(), self.layout, lane, rows[keep], steps[keep],
                              bounds)
            ok[keep], ep[keep], fl[keep] = m.ok, m.episode_step, m.flags
            lost[keep] = m.lost
        return ep, fl, ok, lost

    def committed_rows(self, lane: int, start: int, stop: int
                       ) -> tuple[int, np.ndarray, np.ndarray]:
        """Episode positions and flags of steps ``[start, stop)`` of ``lane`` as stored,
        from the index (no read): for a resumed writer's open snapshot block. Empty where
        the index may differ from storage (the lane has quarantined or lost rows) or does
        not hold them all."""
        idx = self.index
        lo = int(idx.lower_bound()[lane])
        if (stop <= start or start < lo or stop > int(idx.committed[lane])
                or self.quarantine.lanes.get(lane) or idx.has_lost):
            return start, np.zeros(0, np.int32), np.zeros(0, np.uint8)
        rows = idx.lane_rows(lane, np.arange(start, stop))
        return start, idx.episode_step[rows], idx.flags[rows]

    def reload_quarantine(self) -> None:
        """Pick up what ``repair`` changed in the quarantine since it was last read, at most
        every :data:`QUARANTINE_RELOAD` seconds: rows it marked lost are marked lost in the
        index, and rows it released (``repair --release-intact``) are read again
        (:meth:`restore_released`)."""
        if time.monotonic() - self.quarantine_read < QUARANTINE_RELOAD:
            return
        q = read_quarantine(self.backend)
        self.quarantine_read = time.monotonic()
        if q.lanes == self.quarantine.lanes:
            return
        old, self.quarantine = self.quarantine, q
        for lane, ranges in q.lanes.items():
            self.index.mark_lost(lane, ranges, 0, int(self.index.count[lane]))
        for lane, ranges in old.lanes.items():
            released = Quarantine({lane: list(ranges)})
            for a, b in q.lanes.get(lane, []):
                released.release(lane, a, b)
            if released:
                self.restore_released(lane, released.lanes[lane])

    def restore_released(self, lane: int, released: list[tuple[int, int]]) -> None:
        """Read the committed rows of ``lane`` from the first of the ``released`` step
        ranges on again and give the index their stored metadata back: the released rows,
        and the rows after a released range whose episode positions the loss renumbered
        (up to the first block that holds the next episode start after the last range).
        Rows still quarantined or damaged stay lost. Rows this process staged and did not
        commit are not re-read: where a released range ends right before them, their
        episode keeps starting after it."""
        idx = self.index
        st = read_state(self.backend, lane)  # (its valid_from rises if the writer drops rows)
        stop = min(int(idx.committed[lane]), st.count)
        a = max(int(released[0][0]), int(idx.lower_bound()[lane]), st.valid_from)
        last = int(released[-1][1])
        quarantined = self.quarantine.lanes.get(lane, [])
        while a < stop:
            b = min(stop, (a // LOAD_BLOCK_ROWS + 1) * LOAD_BLOCK_ROWS)
            steps = np.arange(a, b)
            ep, fl, lost = self.read_block(st, a, b)
            idx.restore(lane, a, ep, fl, ~lost)
            damaged = lost_ranges(steps, lost & ~self.quarantine.mask(lane, steps))
            idx.mark_lost(lane, quarantined + damaged, a, b)
            starts = np.flatnonzero(fl & FLAG_FIRST) + a
            if b >= last and np.any(starts >= last):
                break  # (the episodes the ranges touched have ended)
            a = max(b, st.valid_from)
