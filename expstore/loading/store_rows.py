"""A store's rows as one reading process sees them: the one rule for where a planned row is.

A plan names rows and the lane step expected at each. Per lane, rows below the lane's
committed count are on shards (read through the shard reader, which checks the step).
Rows at or above it are staged:

- in the RAM of a writer of this process (``LaneWriter.staged``, rows ``committed.count
  .. count``; above ``count``: on shards, where the step check finds what is there);
- else in the shared-memory staging of a writer of this machine (``StagedLanes``), read
  only from the writer *session* that staged the rows the plan was drawn from, with the
  same step check as a shard read. A row gone from there was committed meanwhile (its
  writer says so: read from shards) or its writer died or was replaced (stale: not
  ``ok``, the plan's spares stand in);
- else (no staging known for the lane) on shards.

:class:`StoreRows` applies that rule for every reader: ``Store.source`` (``Store.read``,
``Store.read_plan``, ``Store.sample``: its writers' RAM, the sessions ``refresh()`` found)
and a DataLoader worker (``StoreDataset``: the :class:`StagedSnapshot` pickled with each
item, every writer's rows in shared memory). :func:`staged_snapshot` turns the first view
into the second.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

import numpy as np


class StagedSnapshot(NamedTuple):
    """Per lane, what a reader in another process of this machine needs to read plans
    drawn now: ``sessions``, the writer session whose shared staging holds the lane's rows
    from ``committed`` on (0: none), and ``committed``, the lane's committed count (rows
    below it are on shards)."""

    sessions: np.ndarray  # int64 per lane
    committed: np.ndarray  # int64 per lane, lane steps


class StagingWriter(Protocol):
    """What :class:`StoreRows` needs of a writer of this process (a ``LaneWriter``)."""

    count: int  # rows staged so far (lane steps)
    committed: Any  # ``.count``: rows committed (lane steps)
    session: int  # its shared staging (0: none)

    def staged(self, name: str, steps: np.ndarray, out: np.ndarray) -> np.ndarray: ...

    def staged_rows(self, name: str) -> tuple[np.ndarray, int] | None: ...

    def staging_token(self) -> tuple[Any, int]: ...


def staged_snapshot(lanes: int, committed: np.ndarray, sessions: Mapping[int, int],
                    writers: Mapping[int, StagingWriter]) -> StagedSnapshot:
    """The :class:`StagedSnapshot` of a process that knows the staged rows of ``sessions``
    (lane -> session, other processes' writers) and writes ``writers``' lanes (their rows
    are read from their shared staging elsewhere); ``committed``: the index's counts."""
    out = np.zeros(lanes, np.int64)
    for lane, session in sessions.items():
        out[lane] = session
    for lane, w in writers.items():
        out[lane] = w.session
    return StagedSnapshot(out, committed.copy())


class StoreRows:
    """A row source (``read``, ``read_fields``, ``read_held``) merging staged and committed
    rows by the module's rule.

    ``reader``: the shard reader; ``lane_capacity``: rows per lane; ``committed``: per lane
    the committed count (lane steps; read when a read runs, so a live array follows it);
    ``sessions``: lane -> writer session whose shared staging this process may read
    (``shared``: those stagings, a ``StagedLanes``); ``writers``: lane -> this process's
    writer (its committed count stands in for ``committed`` there).
    """

    def __init__(self, reader: Any, lane_capacity: int, committed: np.ndarray,
                 sessions: Mapping[int, int] | None = None, shared: Any = None,
                 writers: Mapping[int, StagingWriter] | None = None) -> None:
        self.reader = reader
        self.lane_capacity = int(lane_capacity)
        self.committed = committed
        self.sessions: Mapping[int, int] = sessions if shared is not None and sessions \
            is not None else {}
        self.shared = shared
        self.writers: Mapping[int, StagingWriter] = {} if writers is None else writers

    @classmethod
    def in_worker(cls, reader: Any, shared: Any, lane_capacity: int,
                  snapshot: tuple[np.ndarray, np.ndarray]) -> StoreRows:
        """The rows of plans drawn with ``snapshot`` (a :class:`StagedSnapshot`), read in
        another process of the writers' machine (a DataLoader worker)."""
        sessions, committed = snapshot
        live = {int(lane): int(sessions[lane]) for lane in np.flatnonzero(sessions)}
        return cls(reader, lane_capacity, committed, live, shared)

    @property
    def stats(self) -> Any:
        """The shard reader's counters (staged rows are not counted)."""
        return self.reader.stats

    def staged_mask(self, rows: np.ndarray, steps: np.ndarray) -> np.ndarray | None:
        """Which of ``rows`` (at lane ``steps``) are at or above their lane's committed
        count; ``None`` when none is, or no staging is known."""
        if not self.writers and not self.sessions:
            return None
        return self._staged_mask(rows, steps, self._committed())

    def _committed(self) -> np.ndarray:
        """Per lane, the committed count (this process's writers' own for their lanes)."""
        committed = self.committed
        if self.writers:
            committed = committed.copy()
            for lane, w in self.writers.items():
                committed[lane] = w.committed.count
        return committed

    def _staged_mask(self, rows: np.ndarray, steps: np.ndarray, committed: np.ndarray
                     ) -> np.ndarray | None:
        """:meth:`staged_mask` against ``committed`` (:meth:`_committed`)."""
        if len(committed) == 1:
            mask = steps >= committed[0]
        else:
            mask = steps >= committed[rows // self.lane_capacity]
        return mask if mask.any() else None

    def _in_writer(self, lane: int, steps: np.ndarray) -> tuple[Any, np.ndarray] | None:
        """This process's writer of ``lane`` and which of ``steps`` (at or above the
        lane's committed count) its RAM holds: those below its count; ``None`` where no
        writer of this process writes the lane. (The one home of that rule.)"""
        w = self.writers.get(lane)
        return None if w is None else (w, steps < w.count)

    def read_staged(self, name: str, rows: np.ndarray, steps: np.ndarray, out: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows at or above their lane's committed count, from staging into ``out``:
        ``(delivered, on shards)``, the latter for rows to read from shards (committed
        since, beyond a writer's count, or of a lane with no staging known). Rows neither
        delivered nor on shards are stale."""
        lane = rows // self.lane_capacity
        ok = np.zeros(len(rows), bool)
        stored = np.zeros(len(rows), bool)
        for i in np.unique(lane).tolist():
            sel = np.flatnonzero(lane == i)
            own = self._in_writer(i, steps[sel])
            session = self.sessions.get(i)
            if own is not None:  # this process's writer: its RAM
                w, mine = own
                if mine.any():
                    part = np.empty((int(mine.sum()), *out.shape[1:]), out.dtype)
                    got = w.staged(name, steps[sel[mine]], part)
                    out[sel[mine][got]] = part[got]
                    ok[sel[mine][got]] = True
                    mine[mine] = got  # (not found: committed meanwhile, on shards)
                stored[sel[~mine]] = True
            elif session is not None:  # another process's writer: shared memory
                part = np.empty((len(sel), *out.shape[1:]), out.dtype)
                got, committed = self.shared.read(i, session, name, steps[sel], part)
                out[sel[got]] = part[got]
                ok[sel[got]] = True
                stored[sel[~got & (steps[sel] < committed)]] = True
            else:
                stored[sel] = True
        return ok, stored

    def read(self, name: str, rows: np.ndarray, steps: np.ndarray,
             out: np.ndarray) -> np.ndarray:
        """Values of field ``name`` at ``rows`` into ``out``; ``ok`` per row (``False``:
        the row no longer holds ``steps``)."""
        return self._read(name, rows, steps, out, self.staged_mask(rows, steps))

    def _read(self, name: str, rows: np.ndarray, steps: np.ndarray, out: np.ndarray,
              mask: np.ndarray | None) -> np.ndarray:
        """:meth:`read`, with ``mask`` = :meth:`staged_mask` of these rows."""
        if mask is None:
            return self.reader.read(name, rows, steps, out)
        sel = np.flatnonzero(mask)
        part = np.empty((len(sel), *out.shape[1:]), out.dtype)
        got, stored = self.read_staged(name, rows[sel], steps[sel], part)
        ok = np.zeros(len(rows), bool)
        out[sel[got]] = part[got]
        ok[sel[got]] = True
        rest = np.union1d(np.flatnonzero(~mask), sel[stored])
        if len(rest):
            buf = np.empty((len(rest), *out.shape[1:]), out.dtype)
            ok[rest] = self.reader.read(name, rows[rest], steps[rest], buf)
            out[rest] = buf
        return ok

    def read_fields(self, names: list[str], rows: np.ndarray, steps: np.ndarray
                    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """:meth:`read` of several fields at the same rows: ``{name: (values, ok)}``."""
        mask = self.staged_mask(rows, steps)  # (once for all the fields)
        if mask is None:
            return self.reader.read_fields(names, rows, steps)
        out = {}
        for name in names:
            f = self.reader.layout.fields[name]
            vals = np.empty((len(rows), *f.shape), f.dtype)
            out[name] = (vals, self._read(name, rows, steps, vals, mask))
        return out

    @property
    def held_whole(self) -> dict[str, bool | None]:
        """The reader's :attr:`~expstore.storage.read.ShardReader.held_whole`."""
        return self.reader.held_whole

    def gather_held(self, locs: list[tuple[np.ndarray, np.ndarray]],
                    jobs: list[tuple[int, str, np.ndarray]]) -> bool:
        """The reader's :meth:`~expstore.storage.read.ShardReader.gather_held` (fields of
        a batch from the hot set, one call) with staged rows merged in: rows at or above
        their lane's committed count are skipped there and read by this module's rule,
        each field's once for all its jobs. False (outputs partly written) where a row is
        neither held nor staged, or was overwritten: read the batch the general way."""
        reader = self.reader
        if not self.writers and not self.sessions:
            return reader.gather_held(locs, jobs)
        committed = self._committed()
        masks = [self._staged_mask(rows, steps, committed) for rows, steps in locs]
        if all(m is None for m in masks):
            return reader.gather_held(locs, jobs)
        split = [loc if m is None else (*loc, m) for loc, m in zip(locs, masks)]
        tokens = [(w, *w.staging_token()) for w in self.writers.values()]
        staged = self._staged_sources(jobs, len(committed))
        if staged is not None and reader.gather_held(split, jobs, staged=staged) and \
                all(w.staging_token()[0] is buf and w.staging_token()[1] == first
                    for w, buf, first in tokens):
            return True  # (one kernel call: the hot set and this process's staging)
        # (else the rows are read again below: another thread's adds may have refilled
        # a staging buffer between the arrays taken and the call)
        if not reader.gather_held(split, jobs):
            return False
        if self._own_staged(locs, masks, jobs):
            return True
        by_name: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]] = {}
        for loc, name, out in jobs:
            if masks[loc] is not None:
                sel = np.flatnonzero(masks[loc])
                rows, steps = locs[loc]
                by_name.setdefault(name, []).append((sel, rows[sel], steps[sel], out))
        for name, parts in by_name.items():
            rows = np.concatenate([p[1] for p in parts])
            steps = np.concatenate([p[2] for p in parts])
            vals = np.empty((len(rows), *parts[0][3].shape[1:]), parts[0][3].dtype)
            if not self._read(name, rows, steps, vals, np.ones(len(rows), bool)).all():
                return False
            at = 0
            for sel, _, _, out in parts:
                out[sel] = vals[at : at + len(sel)]
                at += len(sel)
        return True

    def _staged_sources(self, jobs: list[tuple[int, str, np.ndarray]], lanes: int
                        ) -> dict[str, tuple[tuple, np.ndarray]] | None:
        """Per field of ``jobs``, this process's writers' staged rows as the hot set's
        kernel takes them (per lane, the rows of the shard being filled or ``None``; per
        lane, the step of its row 0); ``None`` where other processes' staging is known or
        a writer holds a full shard not yet written (:meth:`_own_staged` reads those)."""
        if self.sessions:
            return None
        firsts = np.zeros(lanes, np.int64)
        views: dict[str, list] = {name: [None] * lanes for _, name, _ in jobs}
        for lane, w in self.writers.items():
            for name, per_lane in views.items():
                got = w.staged_rows(name)
                if got is None:
                    return None
                per_lane[lane], firsts[lane] = got
        return {name: (tuple(per_lane), firsts) for name, per_lane in views.items()}

    def _own_staged(self, locs: list[tuple[np.ndarray, np.ndarray]],
                    masks: list[np.ndarray | None], jobs: list[tuple[int, str, np.ndarray]]
                    ) -> bool:
        """The staged rows of a batch copied from this process's writers' RAM straight
        into the jobs' outputs (a learner sampling the lanes it writes: most batches hold
        a row of the shard being filled), where every one of them is in a writer's
        staging (``committed <= step < count``) and still there when copied; False
        otherwise (staged outputs may be partly written: the general merge of
        :meth:`gather_held` writes every one of them again)."""
        if self.sessions:
            return False
        picks: list[tuple[np.ndarray, Any, np.ndarray] | None] = []
        for (rows, steps), mask in zip(locs, masks):
            if mask is None:
                picks.append(None)
                continue
            sel = np.flatnonzero(mask)
            lanes = rows[sel] // self.lane_capacity
            lane = int(lanes[0])
            own = self._in_writer(lane, steps[sel])
            if own is None or (lanes != lane).any() or not own[1].all():
                return False
            picks.append((sel, own[0], steps[sel]))
        for loc, name, out in jobs:
            pick = picks[loc]
            if pick is not None:
                sel, w, steps = pick
                part = np.empty((len(sel), *out.shape[1:]), out.dtype)
                if not w.staged(name, steps, part).all():
                    return False  # (committed meanwhile by another thread's adds)
                out[sel] = part
        return True

    def read_held(self, name: str, rows: np.ndarray, steps: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Frames left in the reader's frame cache (see ``ShardReader.read_held``); staged
        rows are copied into the cache's scratch rows."""
        mask = self.staged_mask(rows, steps)
        if mask is None:
            return self.reader.read_held(name, rows, steps)
        return self.reader.read_held(name, rows, steps, staged=(
            mask, lambda r, s, out: self.read_staged(name, r, s, out)))
