"""Rows that writers in other processes of this machine staged and did not flush yet.

A local store's writers publish their staging in shared memory (``storage/write/staging.py``).
:class:`StagedRows` is a store's view of the lanes it does not write: ``refresh()`` reads
their committed rows from storage as before, then their staged rows' episode positions
and flags from shared memory into the index (not committed: ``index.committed`` stays at
the lane state's count), remembering the writer session they came from (``sessions``).
Reading such a row is the row source's business (``expstore/loading/store_rows.py``,
handed ``sessions`` and ``lanes``): it copies it from shared memory with the same step
check as a shard read; a row gone from there was committed meanwhile (it is then read
from storage) or its writer died (it is stale).

When the writer that staged rows this index knows is gone (killed before flushing them),
or another one replaced it, those rows never happened: the next ``refresh()`` drops them
(announced as dropped; the previous lap's rows in their slots are dropped too, their
metadata having been overwritten). Rows staged and committed since are re-read from
storage, so their flags are the final ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..format import LaneState, lost_ranges, read_metadata
from ..write import ENABLED, StagedLanes


def shared_root(backend: Any) -> str | None:
    """The root of a store whose staging can be shared on this machine, else ``None``."""
    root = getattr(backend, "root", None)
    return root if ENABLED and backend.is_local and root is not None else None


class StagedRows:
    """The staged rows of the lanes a store does not write (see the module docstring)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        root = shared_root(store.backend)
        self.lanes = StagedLanes(root, store.layout) if root is not None else None
        self.sessions: dict[int, int] = {}  # lane -> writer session of its staged rows

    @property
    def shared(self) -> bool:
        """Whether rows staged by writers of this machine can be seen here."""
        return self.lanes is not None

    def refresh_lane(self, st: LaneState, load: Callable[[LaneState], None]) -> None:
        """Bring lane ``st.lane`` up to ``st`` (``load`` reads committed rows) and to the
        rows its writer staged since."""
        idx = self.store.index
        lane = st.lane
        m = self.lanes.lane(lane, recheck=0) if self.lanes is not None else None
        committed, known = int(idx.committed[lane]), int(idx.count[lane])
        if known > committed:  # rows staged elsewhere, known here
            if known > st.count and (m is None or m.session != self.sessions.get(lane)):
                self._forget(lane, max(committed, st.count), known)
            settled = min(st.count, int(idx.count[lane]))
            if settled > committed:
                self._settle(lane, committed, settled)
        load(st)
        st = self.store._states[lane]
        if int(idx.count[lane]) >= st.count:
            idx.committed[lane] = max(int(idx.committed[lane]), st.count)
        if m is not None:
            self._load(lane, m)

    def _forget(self, lane: int, start: int, stop: int) -> None:
        """Rows ``start .. stop`` were staged by a writer that is gone: drop them."""
        idx = self.store.index
        L = idx.lane_capacity
        lo = max(start, int(idx.lower_bound()[lane]))
        if stop > lo:
            idx._emit("dropped", idx.lane_rows(lane, np.arange(lo, stop)))
        idx.count[lane] = start
        # their slots held rows of the previous lap, whose metadata is gone now
        idx.set_valid_from(lane, min(stop - L, start))
        self.sessions.pop(lane, None)

    def _settle(self, lane: int, start: int, stop: int) -> None:
        """Rows ``start .. stop``, known from staging, are committed: take their metadata
        from storage (flags of a lane's newest row may change while it is staged)."""
        store, idx = self.store, self.store.index
        start = max(start, int(idx.lower_bound()[lane]))
        if stop <= start:
            return
        steps = np.arange(start, stop)
        rows = idx.lane_rows(lane, steps)
        m = read_metadata(store.reader, store.layout, lane, rows, steps)  # bad chunk: rebuilt
        ok = m.ok & ~m.lost
        idx.episode_step[rows[ok]] = m.episode_step[ok]
        idx.flags[rows[ok]] = m.flags[ok]
        if m.lost.any():
            idx.mark_lost(lane, lost_ranges(steps, m.lost), start, stop)

    def _load(self, lane: int, m: Any) -> None:
        """Index the rows staged in ``m`` from the lane's committed count on."""
        idx = self.store.index
        S, L = self.store.layout.shard_rows, idx.lane_capacity
        start = int(idx.committed[lane])
        top = m.top(start)
        if top <= start:
            return
        # rows known already are not read again, except the newest: its flags may change
        # while it is the lane's newest row (a step that does not continue it closes it)
        old = int(idx.count[lane])
        first = max(start, old - 1) if self.sessions.get(lane) == m.session else start
        if top <= first:
            return
        steps = np.arange(first, top)
        ep, fl = np.empty(len(steps), np.int32), np.empty(len(steps), np.uint8)
        ok = m.read("_episode_step", steps, ep) & m.read("_flags", steps, fl)
        n = len(steps) if ok.all() else int(np.argmin(ok))
        if n == 0:
            return
        steps, ep, fl = steps[:n], ep[:n], fl[:n]
        known = steps < old  # seen before: their flags may have changed since
        rows = idx.lane_rows(lane, steps[known])
        idx.episode_step[rows], idx.flags[rows] = ep[known], fl[known]
        new = ~known
        if new.any():
            if int(steps[-1]) // S * S > old - 1:  # entering a shard drops its last lap
                idx.set_valid_from(lane, int(steps[-1]) // S * S + S - L)
            idx.put(lane, int(steps[new][0]), ep[new], fl[new], committed=False)
        self.sessions[lane] = m.session
