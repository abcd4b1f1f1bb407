"""Which rows exist and what a need may start from — all in RAM, 5 bytes per row.

Per row: ``episode_step`` (int32, position in its episode) and ``flags`` (uint8, see
``expstore.rows.FLAG_*``). Per lane: ``count`` (rows visible to this process, = next step
id) and ``valid_from`` (oldest intact step). The step id of a row is derived, not stored:
it is the newest step ``< count`` that maps to the row's slot.

Samplers ask :meth:`RowIndex.valid` whether a batch of candidate rows can serve a need
(frame-stack history, n-step horizon) and reject the rest. Listeners (priority samplers)
hear about rows that appear and rows that are dropped.

Rows whose bytes are lost (``storage.format.quarantine``, marked by ``expstore repair``) get
``FLAG_BAD | FLAG_FIRST`` (RAM only) and the rows after them start a new episode, so no
window reaches them: forward scans stop at a first row, frame stacks and burn-ins stop at
an episode start, and no sampler takes a bad or final row as an anchor (``NO_ANCHOR``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..rows import FLAG_BAD, FLAG_FIRST, FLAG_LAST, NO_ANCHOR

try:  # the batch questions in one C loop each (``_rows.c``); else the numpy code below
    from . import _rows as native
except ImportError:  # pragma: no cover - exercised where no compiler was available
    native = None

_BITS = (int(NO_ANCHOR), int(FLAG_FIRST), int(FLAG_LAST))  # what ``_rows.c`` tests

Listener = Callable[[str, np.ndarray], None]  # ("added" | "dropped", global rows)


class RowIndex:
    """Per-row episode bookkeeping for ``lanes`` rings of ``lane_capacity`` rows."""

    def __init__(self, lanes: int, lane_capacity: int) -> None:
        self.lanes = lanes
        self.lane_capacity = lane_capacity
        self.capacity = lanes * lane_capacity
        self.episode_step = np.zeros(self.capacity, np.int32)
        self.flags = np.zeros(self.capacity, np.uint8)
        self.count = np.zeros(lanes, np.int64)
        self.committed = np.zeros(lanes, np.int64)  # rows on storage (<= count)
        self.valid_from = np.zeros(lanes, np.int64)
        self.last_lane = 0  # lane that received rows most recently (CER)
        self.has_lost = False  # some row was marked lost (FLAG_BAD) at some point
        self._lane_base = np.arange(lanes, dtype=np.int64) * lane_capacity  # lane's row 0
        self._listeners: list[Listener] = []

    @property
    def nbytes(self) -> int:
        """RAM held by the per-row arrays (bytes)."""
        return self.episode_step.nbytes + self.flags.nbytes

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _emit(self, kind: str, rows: np.ndarray) -> None:
        if len(rows):
            for fn in list(self._listeners):
                fn(kind, rows)

    # -- updates (from the writer or a refresh) --------------------------------------------
    def lane_rows(self, lane: int, steps: np.ndarray) -> np.ndarray:
        """Global rows of lane ``lane`` at ``steps``."""
        return lane * self.lane_capacity + np.asarray(steps, np.int64) % self.lane_capacity

    def set_valid_from(self, lane: int, valid_from: int) -> None:
        old = int(self.valid_from[lane])
        if valid_from > old:
            start = max(old, int(self.count[lane]) - self.lane_capacity)
            self.valid_from[lane] = valid_from
            stop = min(valid_from, int(self.count[lane]))
            if stop > start:
                self._emit("dropped", self.lane_rows(lane, np.arange(start, stop)))

    def mark_lost(self, lane: int, ranges: list[tuple[int, int]], start: int,
                  stop: int) -> None:
        """Apply lost step ``ranges`` of ``lane`` to its visible rows in ``[start, stop)``.

        Lost rows become ``FLAG_BAD | FLAG_FIRST`` (and are announced as dropped); a row
        after a lost one starts a new episode (positions renumbered from it). Idempotent.
        """
        start = max(int(start), int(self.lower_bound()[lane]))
        stop = min(int(stop), int(self.count[lane]))
        if not ranges or stop <= start:
            return
        steps = np.arange(start, stop, dtype=np.int64)
        rows = self.lane_rows(lane, steps)
        lost = np.zeros(len(steps), bool)
        prev = np.full(len(steps), -1, np.int64)  # newest lost step before each step
        for a, b in ranges:
            lost |= (steps >= a) & (steps < b)
            after = steps >= b
            prev[after] = np.maximum(prev[after], b - 1)
        ep = self.episode_step[rows].astype(np.int64)
        ep = np.where(prev >= 0, np.minimum(ep, steps - prev - 1), ep)
        ep[lost] = 0
        self.episode_step[rows] = ep
        fl = self.flags[rows] | np.where(ep == 0, FLAG_FIRST, 0).astype(np.uint8)
        fl[lost] = FLAG_BAD | FLAG_FIRST
        self.flags[rows] = fl
        self.has_lost = self.has_lost or bool(lost.any())
        self._emit("dropped", rows[lost])

    def put(self, lane: int, first_step: int, episode_step: np.ndarray,
            flags: np.ndarray, committed: bool = True) -> None:
        """Rows ``first_step ..`` of ``lane`` became visible with this metadata.

        ``committed=False``: the rows are staged in this process only (not on storage yet).
        """
        m = len(flags)
        if m == 0:
            return
        L = self.lane_capacity
        slot = first_step % L
        if slot + m <= L:  # one run of slots (opening a store: ~1 GB/s, no temporaries)
            at = slice(lane * L + slot, lane * L + slot + m)
            self.episode_step[at] = episode_step
            self.flags[at] = flags
        else:
            at = self.lane_rows(lane, np.arange(first_step, first_step + m))
            self.episode_step[at] = episode_step
            self.flags[at] = flags
        self.count[lane] = max(int(self.count[lane]), first_step + m)
        if committed:
            self.committed[lane] = self.count[lane]
        self.last_lane = lane
        if self._listeners:
            # rows a batch longer than the lane already overwrote (or dropped) are not added
            steps = np.arange(first_step, first_step + m)
            rows = self.lane_rows(lane, steps)
            alive = steps >= self.lower_bound()[lane]
            self._emit("added", rows[((flags & FLAG_LAST) == 0) & alive])

    def restore(self, lane: int, first_step: int, episode_step: np.ndarray,
                flags: np.ndarray, keep: np.ndarray) -> None:
        """Committed rows ``first_step ..`` of ``lane`` where ``keep`` get their stored
        metadata back (after ``expstore repair --release-intact`` released lost rows);
        rows that were lost are announced as added (final rows too, as ``put_row`` does:
        listeners skip them as anchors). Rows outside the lane's visible window are left
        alone."""
        steps = np.arange(first_step, first_step + len(flags), dtype=np.int64)
        keep = keep & (steps >= self.lower_bound()[lane]) & (steps < self.count[lane])
        rows = self.lane_rows(lane, steps[keep])
        was_lost = (self.flags[rows] & FLAG_BAD) != 0
        self.episode_step[rows] = episode_step[keep]
        self.flags[rows] = flags[keep]
        self._emit("added", rows[was_lost])

    def put_row(self, lane: int, step: int, episode_step: int, flags: int) -> None:
        """One staged row, ``put`` without arrays (the per-step path of ``Store.add``).

        A final row is announced too (listeners skip it as an anchor), so a listener waiting
        for a row's successor (``PriorityIndex(lag=1)``) learns the step before it has one.
        """
        row = lane * self.lane_capacity + step % self.lane_capacity
        self.episode_step[row] = episode_step
        self.flags[row] = flags
        if step >= self.count[lane]:
            self.count[lane] = step + 1
        self.last_lane = lane
        if self._listeners:
            self._emit("added", np.array([row], np.int64))

    def put_lanes(self, lanes: np.ndarray | None, steps: np.ndarray,
                  episode_step: np.ndarray, flags: np.ndarray) -> None:
        """One staged row in each of ``lanes`` (distinct; ``None``: every lane): step
        ``steps[i]`` of lane ``lanes[i]``; ``put_row`` for a vector env's step (final rows
        announced too)."""
        L = self.lane_capacity
        if lanes is None:
            rows = self._lane_base + steps % L
            np.maximum(self.count, steps + 1, out=self.count)
            self.last_lane = self.lanes - 1
        else:
            rows = lanes * L + steps % L
            self.count[lanes] = np.maximum(self.count[lanes], steps + 1)
            self.last_lane = int(lanes[-1])
        self.episode_step[rows] = episode_step
        self.flags[rows] = flags
        if self._listeners:  # (listeners hear one lane's rows at a time)
            for i in range(len(rows)):
                self._emit("added", rows[i:i + 1])

    # -- queries ---------------------------------------------------------------------------
    def steps(self, rows: np.ndarray) -> np.ndarray:
        """Step id of each row (``-1`` where the slot was never written)."""
        rows = np.asarray(rows, np.int64)
        L = self.lane_capacity
        if self.lanes == 1:  # the common case, without per-row lane lookups
            c = int(self.count[0])
            return np.where(rows < c, (c - 1) - ((c - 1 - rows) % L), -1)
        lane, slot = np.divmod(rows, L)
        c = self.count[lane]
        s = c - 1 - ((c - 1 - slot) % L)
        return np.where(c > slot, s, -1)

    def lower_bound(self, guard: int = 0) -> np.ndarray:
        """Per lane, the oldest step a sampled row may touch (``guard`` rows kept clear)."""
        return np.maximum(self.valid_from, self.count - self.lane_capacity + guard)

    def upper_bound(self, committed_only: bool = False) -> np.ndarray:
        """Per lane, one past the newest readable step (storage only, or incl. staged)."""
        return self.committed if committed_only else self.count

    def present(self, guard: int = 0, committed_only: bool = False) -> np.ndarray:
        """Rows per lane that are intact and outside the guard band."""
        return np.maximum(self.upper_bound(committed_only) - self.lower_bound(guard), 0)

    def held(self) -> np.ndarray:
        """Rows per lane that are held and intact: the lane's window less rows marked lost
        (``FLAG_BAD``: quarantined, or metadata nothing could rebuild)."""
        out = self.present()
        if not self.has_lost:
            return out
        lo = self.lower_bound()
        for lane in range(self.lanes):
            if out[lane]:
                rows = self.lane_rows(lane, np.arange(lo[lane], self.count[lane]))
                out[lane] -= np.count_nonzero(self.flags[rows] & FLAG_BAD)
        return out

    def valid(self, rows: np.ndarray, history: int = 0, horizon: int = 1,
              guard: int = 0, committed_only: bool = False) -> np.ndarray:
        """Which rows can start a transition with ``history`` past frames and ``horizon``.

        A row is valid when it is not a final row, the ``history`` rows before it (capped
        at its episode start) and the rows up to ``horizon`` steps ahead (capped at its
        episode's final row) are intact, in its lane and episode, and outside the guard.
        """
        rows = np.asarray(rows, np.int64)
        lower, upper = self.lower_bound(guard), self.upper_bound(committed_only)
        if native is not None and rows.size:
            ok = np.empty(rows.shape, bool)
            if native.valid(np.ascontiguousarray(rows).ravel(), self.count, lower, upper,
                            self.flags, self.episode_step, self.lane_capacity, int(history),
                            int(horizon), _BITS, ok.ravel()) is not None:
                return ok
        steps = self.steps(rows)
        ok = self._anchors(rows, steps, history, guard)
        ok &= self.horizon(rows, horizon, committed_only, steps)[1] > 0
        return ok

    def rows_at(self, draws: np.ndarray, guard: int = 0,
                committed_only: bool = False) -> np.ndarray:
        """The rows that uniform draws name: draw ``k`` (``0 <= k < present().sum()``) is
        the ``k``-th intact row outside the guard band, counting lane by lane."""
        present = self.present(guard, committed_only)
        bounds = np.cumsum(present)
        lane = np.searchsorted(bounds, draws, side="right")
        offset = draws - (bounds[lane] - present[lane])
        steps = self.lower_bound(guard)[lane] + offset
        return lane * self.lane_capacity + steps % self.lane_capacity

    def draw_valid(self, draws: np.ndarray, out: np.ndarray, filled: int, history: int = 0,
                   horizon: int = 1, guard: int = 0, committed_only: bool = False,
                   bounds: tuple[np.ndarray, np.ndarray] | None = None) -> int:
        """:meth:`rows_at` of uniform ``draws``, the :meth:`valid` ones appended to ``out``
        (int64) from position ``filled`` until it is full, in draw order; the new fill.
        ``bounds``: ``(lower_bound(guard), upper_bound(committed_only))``, where the
        caller has them."""
        draws = np.ascontiguousarray(draws, np.int64)
        if native is not None and out.dtype == np.int64 and out.flags.c_contiguous:
            lower, upper = bounds if bounds is not None else (
                self.lower_bound(guard), self.upper_bound(committed_only))
            return native.uniform(draws, self.count, lower, upper, self.flags,
                                  self.episode_step, self.lane_capacity, int(history),
                                  int(horizon), _BITS, out, int(filled))
        rows = self.rows_at(draws, guard, committed_only)
        got = rows[self.valid(rows, history, horizon, guard, committed_only)]
        got = got[:len(out) - filled]
        out[filled:filled + len(got)] = got
        return filled + len(got)

    def stack(self, rows: np.ndarray, steps: np.ndarray,
              k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Frame stacks of ``k`` rows ending at ``rows`` (at lane ``steps``), clamped at each
        row's episode start: ``(rows, pad, steps)``, each ``(n, k)``; ``pad`` marks the
        positions before the episode start (they repeat its first row)."""
        rows = np.asarray(rows, np.int64)
        if k == 1:  # no frame stack: the rows themselves
            return (rows[:, None], np.zeros((len(rows), 1), bool),
                    np.asarray(steps, np.int64)[:, None])
        back = np.arange(k - 1, -1, -1, dtype=np.int64)  # k-1 .. 0
        pos = self.episode_step[rows].astype(np.int64)
        pad = back[None, :] > pos[:, None]
        shift = np.minimum(back[None, :], pos[:, None])
        L = self.lane_capacity
        lane, slot = np.divmod(rows, L)
        out = lane[:, None] * L + (slot[:, None] - shift) % L
        return out, pad, np.asarray(steps, np.int64)[:, None] - shift

    def windows(self, rows: np.ndarray, k: int, n_step: int = 1, committed_only: bool = False,
                history: int = 0, guard: int = 0) -> tuple[np.ndarray, ...]:
        """What a read plan needs of anchor ``rows``: ``(steps, m, obs_rows, obs_pad,
        obs_steps, next_rows, next_pad, next_steps, ok)``: their steps, the :meth:`horizon`
        ``m`` (up to ``n_step``), the :meth:`stack` of ``k`` rows ending at each anchor and
        at ``m`` steps after it, and which anchors are :meth:`valid` (``history``,
        ``guard``) for those very steps.

        ``ok`` is what makes a plan safe beside another thread adding to the store: a row
        a sampler drew as valid may hold a later step by the time its plan is made (a
        final row, or one whose next step is not written yet). The kernel answers
        everything in one call under the GIL; the numpy path derives every answer from one
        reading of the counts and then checks that no named row was rewritten since."""
        rows = np.ascontiguousarray(rows, np.int64)
        n = len(rows)
        if native is not None and rows.ndim == 1:
            out = (np.empty(n, np.int64), np.empty(n, np.int64),
                   np.empty((n, k), np.int64), np.empty((n, k), bool),
                   np.empty((n, k), np.int64), np.empty((n, k), np.int64),
                   np.empty((n, k), bool), np.empty((n, k), np.int64), np.empty(n, bool))
            if native.windows(rows, self.count, self.upper_bound(committed_only), self.flags,
                              self.episode_step, self.lane_capacity, int(k), int(n_step),
                              _BITS, *out[:8], self.valid_from, int(guard), int(history),
                              out[8]) is not None:
                return out
        steps = self.steps(rows)
        ends, m = self.horizon(rows, n_step, committed_only, steps)
        ok = self._anchors(rows, steps, history, guard) & (m > 0)
        obs, nxt = self.stack(rows, steps, k), self.stack(ends, steps + m, k)
        for r, s in ((rows[:, None], steps[:, None]), obs[::2], nxt[::2]):
            ok &= self.current(r, s).all(axis=1)
        return (steps, m, *obs, *nxt, ok)

    def _anchors(self, rows: np.ndarray, steps: np.ndarray, history: int, guard: int
                 ) -> np.ndarray:
        """:meth:`valid` of ``rows`` at ``steps`` less the horizon: not a final or lost
        row, written, and ``history`` rows back (capped at the episode start) in bounds."""
        lower = self.lower_bound(guard)
        lo = lower[0] if self.lanes == 1 else lower[rows // self.lane_capacity]
        ok = ((self.flags[rows] & NO_ANCHOR) == 0) & (steps >= 0)
        if history:
            return ok & (steps - np.minimum(self.episode_step[rows], history) >= lo)
        return ok & (steps >= lo)

    def current(self, rows: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Which ``rows`` still hold ``steps`` (same shapes), intact: no add rewrote them
        since the steps were read. Steps only grow, so a row that holds its step now held
        it throughout, with the same metadata: a writer raises ``valid_from`` past a row's
        old step before it rewrites the row's metadata (what the bound check here
        rejects)."""
        rows = np.asarray(rows, np.int64)
        steps = np.asarray(steps, np.int64)
        lower = self.lower_bound()
        lo = lower[0] if self.lanes == 1 else lower[rows // self.lane_capacity]
        return (self.steps(rows) == steps) & (steps >= lo)

    def horizon(self, rows: np.ndarray, n: int, committed_only: bool = False,
                steps: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Look ``n`` steps ahead: ``(ends, m)`` with ``m`` steps (1..n) available.

        ``m`` stops early at the episode's final row; ``m == 0`` where row ``+1`` is
        missing or the episode was interrupted (a first row before any final row).
        ``ends`` is the global row ``m`` steps ahead. ``committed_only`` looks only at rows
        on storage (what another process can read). ``steps``: ``self.steps(rows)`` if
        the caller has them.
        """
        rows = np.asarray(rows, np.int64)
        L = self.lane_capacity
        steps = self.steps(rows) if steps is None else steps
        upper = self.upper_bound(committed_only)
        if self.lanes == 1:
            base, count = 0, upper[0]
        else:
            lane = rows // L
            base, count = lane * L, upper[lane]
        if n == 1:  # one step ahead: the next row exists and is of the same episode
            s = steps + 1
            f = self.flags[base + s % L]
            m = ((steps >= 0) & (s < count) & ((f & FLAG_FIRST) == 0)).view(np.int8)
            return base + (steps + m) % L, m.astype(np.int64)
        m = np.zeros(len(rows), np.int64)
        done = steps < 0
        for j in range(1, n + 1):
            s = steps + j
            f = self.flags[base + s % L]  # a slot not written up to s: masked just below
            bad = (s >= count) | ((f & FLAG_FIRST) != 0)
            bad &= ~done
            m[bad] = 0
            good = ~(done | bad)
            m[good] = j
            done |= bad | (good & ((f & FLAG_LAST) != 0))
        ends = base + (steps + m) % L
        return ends, m
