"""One row in each of many lanes per call: the staging side of a vector env's ``add``.

A vector env's ``add`` stages one row in every lane. Each lane stages in its own buffers
(its own shared-memory file, ``staging.py``), so numpy cannot write them all with one
assignment. :class:`LaneRows` keeps, per lane, the address of each field's current
staging buffer and the rows staged there, and writes a field's rows of every lane with one
call of the C kernel ``stage_lanes`` (a memcpy per lane and field, then every lane's new
published row count: after the rows, so readers see a row only once all of it is
written). Without the C kernel, the same rows are written lane by lane with numpy.

The table mirrors each writer's ``cur`` shard (``n``, ``first_step``, buffer addresses,
its record's address).
Anything else that stages rows or moves a lane's open shard calls :meth:`LaneRows.touch`
(the per-step and batch paths of the appender; ``LaneWriter._promote`` through its
``on_move`` hook), and the lane is re-read before its next row here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..native import step_kernel as _step
from ..native import write_kernel
from .background import FORKS
from .staging import _BUF0, N_WORD


def shard_addresses(staging: dict[str, np.ndarray], names: list[str],
                    shared: Any, slot: int) -> np.ndarray:
    """Data address of each field's staging buffer (in ``names`` order) and, last, of the
    buffer's published row count in ``shared`` staging (0: private memory), int64."""
    arrays = [staging[name] for name in names]
    out = np.zeros(len(arrays) + 1, np.int64)
    if _step is not None:  # (``arr.ctypes.data`` takes microseconds)
        _step.addresses(tuple(arrays), out)
    else:
        out[:-1] = [a.ctypes.data for a in arrays]
    if slot >= 0:
        out[-1] = shared.words.ctypes.data + 8 * (_BUF0 + 4 * slot + N_WORD)
    return out


class LaneRows:
    """Stages one row per lane into ``writers`` (``LaneWriter`` of lanes ``0..L-1``;
    ``None`` for a lane not written here: its buffer addresses stay 0)."""

    def __init__(self, writers: list[Any]) -> None:
        self.writers = writers
        layout = next(w for w in writers if w is not None).layout
        self.names = list(layout.fields)
        self.dtypes = [f.dtype for f in layout.fields.values()]
        self.row_bytes = [f.dtype.itemsize * int(np.prod(f.shape, dtype=np.int64))
                          for f in layout.fields.values()]
        self.row_bytes_arr = np.array(self.row_bytes, np.int64)
        self.step_field = self.names.index("_step_id")
        self.shard_rows = layout.shard_rows
        L = len(writers)
        self.all = np.arange(L)
        self.n = np.zeros(L, np.int64)  # rows staged in the lane's current shard
        self.first = np.zeros(L, np.int64)  # its first step
        self.base = np.zeros((len(self.names), L), np.int64)  # field buffers' addresses
        self.pub = np.zeros(L, np.int64)  # address of its published row count; 0: private
        self.entered = np.zeros(L, np.uint8)  # its current shard was opened
        self.rec = np.zeros(L, np.int64)  # address of its record (``shard_buffer``); 0: none
        self.curs: list[Any] = [None] * L
        self.stale = {j for j, w in enumerate(writers) if w is not None}
        for w in writers:
            if w is not None:
                w.on_move = self.touch

    def touch(self, lane: int) -> None:
        """Lane ``lane`` staged rows or moved its open shard elsewhere: re-read it."""
        self.stale.add(lane)

    def reload(self) -> None:
        """Re-read the lanes touched since the last call (:meth:`touch`)."""
        for j in list(self.stale):
            self._load(j)
        self.stale.clear()

    def _load(self, j: int) -> None:
        w = self.writers[j]
        c = w.cur
        self.curs[j] = c
        self.n[j] = c.n
        self.first[j] = c.first_step
        self.entered[j] = c.entered
        self.rec[j] = c.rec_at
        at = c.addresses  # (fixed for the buffer's life: computed once)
        self.base[:, j] = at[:-1]
        self.pub[j] = at[-1]

    def put(self, values: dict[str, np.ndarray], lanes: np.ndarray | None = None
            ) -> tuple[np.ndarray, list[int]]:
        """Stage row ``values[name][i]`` in lane ``lanes[i]`` (every lane when ``None``),
        for every field but ``_step_id`` (the lanes' next step ids, written here).

        Returns ``(steps, changed)``: each row's step id, and the lanes that entered a new
        shard or handed a full one to the background writer (their ``valid_from`` and
        committed count may have moved). Full shards are handed over as in
        ``LaneWriter.advance``.
        """
        ws = self.writers
        idx = self.all if lanes is None else lanes
        if ws[int(idx[0])].forks != FORKS[0]:
            ws[int(idx[0])]._check_owner()
        if self.stale:
            self.reload()
        n = self.n if lanes is None else self.n[idx]
        changed: list[int] = []
        if not n.all():  # lanes whose next row opens a shard
            for j in idx[n == 0].tolist():
                ws[j]._enter_shard()
                self._load(j)
                changed.append(j)
            n = self.n if lanes is None else self.n[idx]
        curs = self.curs
        native = write_kernel()
        if native is not None:
            srcs = []
            for f, name in enumerate(self.names):
                v = values.get(name) if f != self.step_field else None
                if v is not None and (v.dtype != self.dtypes[f] or not v.flags.c_contiguous):
                    v = np.ascontiguousarray(v, self.dtypes[f])
                srcs.append(v)
            steps = np.empty(len(idx), np.int64)
            full = native.stage_lanes(tuple(srcs), idx, self.base, self.n, self.first,
                                      self.pub, self.row_bytes_arr, self.step_field, steps,
                                      self.shard_rows)
        else:
            steps = (self.first if lanes is None else self.first[idx]) + n
            for i, j in enumerate(idx.tolist()):
                c, row = curs[j], int(n[i])
                for name in self.names:
                    c.staging[name][row] = steps[i] if name == "_step_id" else values[name][i]
                if c.slot >= 0:
                    ws[j].shared.publish(c.slot, row + 1)
            n = n + 1
            self.n[idx] = n
            full = int(np.count_nonzero(n == self.shard_rows))
        for j in idx.tolist():
            curs[j].n += 1
            ws[j].count += 1
        if full:
            for j in idx[self.n[idx] == self.shard_rows].tolist():
                ws[j]._hand_off()
                self._load(j)
                changed.append(j)
        return steps, changed
