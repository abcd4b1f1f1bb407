"""The append path of one lane: stage the current shard in RAM, write whole shards.

Rows arrive already validated. Each field's current shard is staged raw; complete inner
chunks are encoded once and cached, so re-flushing a partly filled shard only encodes
the new tail. A flush (docs/architecture.md §4):

1. if the shard about to be written replaces rows the on-disk state still calls intact
   (ring wrap-around), commit a state that drops them first;
2. write every field's shard object (atomic replace);
3. commit the lane state covering the new rows.

When a write fails (disk full, read-only storage) nothing committed changes and no staged
row is dropped: a full shard that could not be written waits in ``pending`` (RAM), later
rows keep staging, and the next :meth:`LaneWriter.flush` writes everything in order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import WriteFailedError
from ..rows import FLAG_LAST
from . import faults
from .backends import Backend
from .layout import Layout
from .shard import assemble, encoder
from .state import LaneState, write_state


@dataclass
class _Shard:
    """Rows of one shard staged in RAM: raw per field, plus the inner chunks encoded so far."""

    first_step: int
    staging: dict[str, np.ndarray]
    encoded: dict[str, list[bytes | None]]
    n: int = 0


class LaneWriter:
    """Appends rows to lane ``lane``; ``count`` counts rows added (staged or committed)."""

    def __init__(self, backend: Backend, layout: Layout, state: LaneState,
                 on_shard_written: Callable[[int], None] | None = None) -> None:
        self.backend = backend
        self.layout = layout
        self.lane = state.lane
        self.committed = state
        self.count = state.count
        self.valid_from = state.valid_from
        self.episodes = state.episodes
        self.on_shard_written = on_shard_written
        self.codecs = {n: layout.codec(n) for n in layout.fields}
        self.encoders = {n: encoder(c) for n, c in self.codecs.items()}
        S = layout.shard_rows
        self.cur = self._new_shard(self.count - self.count % S)
        self.cur.n = self.count % S
        self.pending: list[_Shard] = []  # full shards whose write failed, oldest first

    # -- state ---------------------------------------------------------------------------
    @property
    def first_step(self) -> int:
        return self.cur.first_step

    @property
    def n(self) -> int:
        return self.cur.n

    @property
    def staging(self) -> dict[str, np.ndarray]:
        return self.cur.staging

    @property
    def dirty(self) -> bool:
        return self.count != self.committed.count

    def shard_index(self, step: int) -> int:
        """Global shard number of ``step`` in this lane."""
        L = self.layout
        return self.lane * L.shards_per_lane + (step % L.lane_capacity) // L.shard_rows

    def _new_shard(self, first_step: int) -> _Shard:
        L = self.layout
        staging = {n: np.full((L.shard_rows, *f.shape), -1 if n == "_step_id" else 0, f.dtype)
                   for n, f in L.fields.items()}
        encoded = {n: [None] * L.chunks_per_shard(n) for n in L.fields}
        return _Shard(first_step, staging, encoded)

    def load_partial(self, rows: dict[str, np.ndarray]) -> None:
        """Restore the staged rows of a partly written shard (after reopening)."""
        for name, arr in rows.items():
            self.cur.staging[name][: len(arr)] = arr

    def staged(self, name: str, steps: np.ndarray) -> np.ndarray:
        """Values of rows still only in RAM (``committed.count <= steps < count``)."""
        steps = np.asarray(steps, np.int64)
        if not self.pending:
            return self.cur.staging[name][steps - self.cur.first_step]
        out = np.empty((len(steps), *self.layout.fields[name].shape),
                       self.layout.fields[name].dtype)
        for sh in (*self.pending, self.cur):
            sel = (steps >= sh.first_step) & (steps < sh.first_step + sh.n)
            out[sel] = sh.staging[name][steps[sel] - sh.first_step]
        return out

    # -- appending -----------------------------------------------------------------------
    def append(self, rows: dict[str, np.ndarray]) -> tuple[int, int]:
        """Stage ``m`` consecutive rows; whole shards are written as they fill.

        Returns ``(first_step, m)``. Every field (meta included) must be present. If a
        shard write fails, every row is still staged and :class:`WriteFailedError` is
        raised at the end (``count`` tells what was staged).
        """
        if self.pending:  # an earlier write failed: retry before staging more
            self.flush()
        m = len(rows["_flags"])
        start = self.count
        S = self.layout.shard_rows
        error: WriteFailedError | None = None
        done = 0
        while done < m:
            if self.cur.n == 0:
                self._enter_shard()
            take = min(S - self.cur.n, m - done)
            for name, buf in self.cur.staging.items():
                buf[self.cur.n : self.cur.n + take] = rows[name][done : done + take]
            self.cur.n += take
            self.count += take
            done += take
            if self.cur.n == S:
                if error is None and not self.pending:
                    try:
                        self.flush()
                    except WriteFailedError as e:
                        error = e
                if self.dirty:  # not written: keep it in RAM
                    self._retire()
                self.cur.n = 0
        if error is not None:
            raise error
        return start, m

    def _enter_shard(self) -> None:
        L = self.layout
        self.cur.first_step = self.count
        for name, buf in self.cur.staging.items():
            buf.fill(-1 if name == "_step_id" else 0)
            self.cur.encoded[name] = [None] * L.chunks_per_shard(name)
        # Rows of the previous lap in this shard's slots are gone for this process now.
        self.valid_from = max(self.valid_from, self.count + L.shard_rows - L.lane_capacity)

    def _retire(self) -> None:
        """Move the full current shard to ``pending`` (its write failed or is queued)."""
        L = self.layout
        self.pending = [p for p in self.pending
                        if p.first_step + L.lane_capacity > self.cur.first_step]
        self.pending.append(self.cur)
        self.cur = self._new_shard(self.cur.first_step + L.shard_rows)

    # -- committing ----------------------------------------------------------------------
    def flush(self) -> bool:
        """Write staged shards and commit the lane state; ``False`` if nothing to do.

        Raises :class:`WriteFailedError` (an ``OSError``) naming the object that could not
        be written; committed rows stay intact and staged rows stay in RAM.
        """
        if not self.dirty:
            return False
        while self.pending:
            self._write(self.pending[0])
            self.pending.pop(0)
        if self.dirty:
            self._write(self.cur)
        return True

    def _write(self, sh: _Shard) -> None:
        L = self.layout
        st = self.committed
        end = sh.first_step + sh.n
        # replacing the shard object drops the previous lap's rows in all its slots
        valid_from = max(st.valid_from, sh.first_step + L.shard_rows - L.lane_capacity)
        shard = self.shard_index(sh.first_step)
        key = "_state"
        try:
            if valid_from > st.valid_from:
                if faults.ARMED:
                    faults.hit("flush.drop")
                key = f"_state/lane_{self.lane}.json"
                drop = min(valid_from, st.count)
                write_state(self.backend, LaneState(st.lane, st.count, drop, st.episodes,
                                                    st.generation))
                st.valid_from = drop
                st.generation += 1
            for i, name in enumerate(L.fields):
                key = L.shard_key(name, shard)
                self.backend.put(key, assemble(self._chunks(sh, name), sh.first_step, sh.n,
                                               L.checksum))
                if faults.ARMED and i == 0:
                    faults.hit("flush.shards")
            if faults.ARMED:
                faults.hit("flush.state")
            key = f"_state/lane_{self.lane}.json"
            new_rows = slice(max(st.count - sh.first_step, 0), sh.n)
            finals = int(np.count_nonzero(sh.staging["_flags"][new_rows] & FLAG_LAST))
            new = LaneState(st.lane, end, valid_from, st.episodes + finals, st.generation)
            write_state(self.backend, new)
        except OSError as e:
            raise WriteFailedError(
                e.errno, f"{self.backend.url}/{key}: write failed ({e.strerror or e}); lane "
                f"{self.lane} keeps {self.count - st.count} uncommitted rows in RAM for the "
                f"next flush(); committed rows are intact") from e
        self.committed = new
        if faults.ARMED:
            faults.hit("flush.done")
        if self.on_shard_written is not None:
            self.on_shard_written(shard)

    def _chunks(self, sh: _Shard, name: str) -> list[bytes | None]:
        R = self.layout.chunk_rows(name)
        cache = sh.encoded[name]
        encode = self.encoders[name]
        buf = sh.staging[name]
        full = sh.n // R
        for c in range(full):
            if cache[c] is None:
                cache[c] = encode(np.ascontiguousarray(buf[c * R : (c + 1) * R]))
        out: list[bytes | None] = list(cache[:full])
        if sh.n % R:
            out.append(encode(np.ascontiguousarray(buf[full * R : (full + 1) * R])))
        out += [None] * (len(cache) - len(out))
        return out
