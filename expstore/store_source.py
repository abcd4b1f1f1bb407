"""Rows as this process sees them, for plans (``loading/``) and ``Store.read``: rows its own
writers staged (RAM), rows other writers of this machine staged (shared memory,
``staged.py``), and the rest from shards through the store's reader."""

from __future__ import annotations

from typing import Any

import numpy as np


class StoreSource:
    """Rows for this process: staged rows from its writers, rows other writers of this
    machine staged (shared memory, ``staged.py``), the rest from shards."""

    def __init__(self, store: Any) -> None:
        #: the :class:`~expstore.store.Store` whose writers, staging and reader serve rows
        self.store = store

    @property
    def stats(self) -> Any:
        """The shard reader's counters (staged rows are not counted)."""
        return self.store.reader.stats

    def _staged_mask(self, rows: np.ndarray, steps: np.ndarray) -> np.ndarray | None:
        """Which rows are not committed (staged by this process's writers or by other local
        writers); ``None`` when no row is."""
        st = self.store
        if not st.writers and not st._staged.sessions:
            return None
        lane = rows // st.layout.lane_capacity
        committed = st.index.committed.copy()
        for i, w in st.writers.items():
            committed[i] = w.committed.count
        mask = steps >= committed[lane]
        return mask if mask.any() else None

    def _read_staged(self, name: str, rows: np.ndarray, steps: np.ndarray,
                     out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows staged in RAM (this process's writers) or in shared memory (other local
        writers): ``(delivered, on storage)``, the latter for rows to read from shards
        (never staged, or committed since)."""
        st = self.store
        lane = rows // st.layout.lane_capacity
        ok = np.zeros(len(rows), bool)
        staged = np.zeros(len(rows), bool)
        for i, w in st.writers.items():
            sel = (lane == i) & (steps >= w.committed.count) & (steps < w.count)
            if sel.any():
                out[sel] = w.staged(name, steps[sel])
                ok[sel] = True
                staged |= sel
        if st._staged.sessions:  # never ask storage for rows not committed
            st._staged.read(name, rows, steps, out, lane, ok, staged)
        return ok, ~staged

    def read(self, name: str, rows: np.ndarray, steps: np.ndarray,
             out: np.ndarray) -> np.ndarray:
        st = self.store
        if not st.writers and not st._staged.sessions:
            return st.reader.read(name, rows, steps, out)
        ok, stored = self._read_staged(name, rows, steps, out)
        rest = np.flatnonzero(stored)
        if len(rest):
            buf = np.empty((len(rest), *out.shape[1:]), out.dtype)
            ok[rest] = st.reader.read(name, rows[rest], steps[rest], buf)
            out[rest] = buf
        return ok

    def read_fields(self, names: list[str], rows: np.ndarray, steps: np.ndarray
                    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """:meth:`read` of several fields at the same rows: ``{name: (values, ok)}``."""
        st = self.store
        if self._staged_mask(rows, steps) is None:
            return st.reader.read_fields(names, rows, steps)
        out = {}
        for name in names:
            f = st.layout.fields[name]
            vals = np.empty((len(rows), *f.shape), f.dtype)
            out[name] = (vals, self.read(name, rows, steps, vals))
        return out

    def read_held(self, name: str, rows: np.ndarray, steps: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Frames left in the reader's frame cache (see ``ShardReader.read_held``); rows
        not committed yet are copied from staging into the cache's scratch rows."""
        reader = self.store.reader
        mask = self._staged_mask(rows, steps)
        if mask is None:
            return reader.read_held(name, rows, steps)

        def staged(r: np.ndarray, s: np.ndarray, out: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
            ok, stored = self._read_staged(name, r, s, out)
            return ok, stored & ~ok

        return reader.read_held(name, rows, steps, staged=(mask, staged))
