"""The append path of one lane: stage the current shard in RAM, write whole shards.

Rows arrive already validated. Each field's current shard is staged raw; complete inner
chunks are encoded once and cached, so re-flushing a partly filled shard only encodes
the new tail. A flush (DESIGN.md §4):

1. if the shard about to be written replaces rows the on-disk state still calls intact
   (ring wrap-around), commit a state that drops them first;
2. write every field's shard object (atomic replace);
3. commit the lane state covering the new rows.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .backend import Backend
from .layout import Layout
from .shard import assemble
from .state import LaneState, write_state


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
        S = layout.shard_rows
        self.staging = {n: np.zeros((S, *f.shape), f.dtype) for n, f in layout.fields.items()}
        self.encoded: dict[str, list[bytes | None]] = {
            n: [None] * layout.chunks_per_shard(n) for n in layout.fields
        }
        self.codecs = {n: layout.codec(n) for n in layout.fields}
        self.first_step = self.count - self.count % S
        self.n = self.count % S

    @property
    def dirty(self) -> bool:
        return self.count != self.committed.count

    def shard_index(self, step: int) -> int:
        """Global shard number of ``step`` in this lane."""
        L = self.layout
        return self.lane * L.shards_per_lane + (step % L.lane_capacity) // L.shard_rows

    def load_partial(self, rows: dict[str, np.ndarray]) -> None:
        """Restore the staged rows of a partly written shard (after reopening)."""
        for name, arr in rows.items():
            self.staging[name][: len(arr)] = arr

    def staged(self, name: str, steps: np.ndarray) -> np.ndarray:
        """Rows of the current shard still only in RAM (``steps`` >= committed count)."""
        return self.staging[name][np.asarray(steps) - self.first_step]

    def append(self, rows: dict[str, np.ndarray]) -> tuple[int, int]:
        """Stage ``m`` consecutive rows; whole shards are written as they fill.

        Returns ``(first_step, m)``. Every field (meta included) must be present.
        """
        m = len(rows["_flags"])
        start = self.count
        S = self.layout.shard_rows
        done = 0
        while done < m:
            if self.n == 0:
                self._enter_shard()
            take = min(S - self.n, m - done)
            for name, buf in self.staging.items():
                buf[self.n : self.n + take] = rows[name][done : done + take]
            self.n += take
            self.count += take
            done += take
            if self.n == S:
                self.flush()
                self.n = 0
        return start, m

    def _enter_shard(self) -> None:
        L = self.layout
        self.first_step = self.count
        for name, buf in self.staging.items():
            buf.fill(-1 if name == "_step_id" else 0)
            self.encoded[name] = [None] * L.chunks_per_shard(name)
        # Rows of the previous lap in this shard's slots are gone for this process now.
        self.valid_from = max(self.valid_from, self.first_step + L.shard_rows - L.lane_capacity)

    def flush(self) -> bool:
        """Write the staged shard and commit the lane state; ``False`` if nothing to do."""
        if not self.dirty:
            return False
        L = self.layout
        st = self.committed
        if self.valid_from > st.valid_from:
            write_state(self.backend, LaneState(st.lane, st.count, self.valid_from, st.episodes,
                                                st.generation))
            st.valid_from = self.valid_from
            st.generation += 1
        shard = self.shard_index(self.first_step)
        for name in L.fields:
            data = assemble(self._chunks(name), self.first_step, self.n)
            self.backend.put(L.shard_key(name, shard), data)
        new = LaneState(st.lane, self.count, self.valid_from, self.episodes, st.generation)
        write_state(self.backend, new)
        self.committed = new
        if self.on_shard_written is not None:
            self.on_shard_written(shard)
        return True

    def _chunks(self, name: str) -> list[bytes | None]:
        R = self.layout.chunk_rows(name)
        cache = self.encoded[name]
        codec = self.codecs[name]
        buf = self.staging[name]
        full = self.n // R
        for c in range(full):
            if cache[c] is None:
                cache[c] = codec.encode(np.ascontiguousarray(buf[c * R : (c + 1) * R]))
        out: list[bytes | None] = list(cache[:full])
        if self.n % R:
            out.append(codec.encode(np.ascontiguousarray(buf[full * R : (full + 1) * R])))
        out += [None] * (len(cache) - len(out))
        return out
