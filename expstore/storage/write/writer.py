"""The append path of one lane: stage rows in a small pool of shard buffers, write full
shards on a background thread, flush the open shard incrementally.

Rows arrive already validated. The lane stages them in the current shard buffer (raw per
field: in shared memory on local stores, ``staging.py``, so readers on this machine see
them at once). A full shard is handed to the store's :class:`Background` thread serving
the lane, which encodes it (blosc/zstd release the GIL) and writes it, followed by the lane
state that commits it (docs/architecture.md §4), in the order the lane's shards were
handed over; its buffer returns to the pool once written. The ``advance`` that completes
a shard only swaps buffers; when every buffer is waiting for its write (storage slower
than the caller), it waits for the oldest one: RAM stays bounded. ``flush()`` waits for
the queued shards, writes the open one and commits. Each field's shard object is
assembled incrementally (``shard.ShardImage``): a flush encodes only rows added since the
last one, and on local disk rewrites the object in place through a spare link
(``rewrite.Rewrite``). Committing a shard is ``shard_commit.py``; how many buffers a lane
gets, ``buffer_pool.py``.

A write that fails (disk full, read-only storage) changes nothing committed and drops no
row: the shard waits in ``pending`` (RAM), later shards of the lane wait behind it, the
error surfaces on the caller's thread (:meth:`LaneWriter.poll`, then the store's next
``add``/``extend``/``flush``), and the next :meth:`LaneWriter.flush` writes everything
in order. A forked child's copy of a writer refuses to write (its parent owns the lane).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from collections.abc import Callable

import numpy as np

from ...errors import StoreLockedError
from ..backends import Backend
from ..format import LaneState, Layout, ShardImage, encoder, lane_prefix, rows_encoder
from .background import FORKS, Background
from .buffer_pool import MAX_BUFFERS, POOL_BYTES, pool_size
from .lane_rows import shard_addresses
from .rewrite import Lineage
from .shard_buffer import ShardBuffer
from .shard_commit import commit_shard
from .snapshot_blocks import SnapshotBlocks
from .staging import N_WORD as _N
from .staging import SharedStaging

__all__ = ["LaneWriter", "MAX_BUFFERS", "POOL_BYTES", "pool_size"]


class LaneWriter:
    """Appends rows to lane ``lane``; ``count`` counts rows added (staged or committed).

    ``committed`` is the lane state on storage as this thread last learnt it (results of
    background writes are applied by :meth:`poll`). ``background``: the store's writing
    thread (one of its own if ``None``). ``shared_root``: a local store's root, to stage
    in shared memory (``None``: private memory).
    """

    def __init__(self, backend: Backend, layout: Layout, state: LaneState,
                 on_shard_written: Callable[[int], None] | None = None,
                 background: Background | None = None, shared_root: str | None = None,
                 n_buffers: int | None = None) -> None:
        self.backend = backend
        self.layout = layout
        self.lane = state.lane
        self._disk = state  # what storage holds (owned by the background thread meanwhile)
        self.committed = LaneState(**vars(state))
        self.count = state.count
        self.valid_from = state.valid_from
        self.episodes = state.episodes
        self.on_shard_written = on_shard_written
        #: the lane's index snapshot blocks (stores with an id), written after commits
        self.snapshot = SnapshotBlocks(layout, self.lane) if layout.store_id else None
        self.codecs = {n: layout.codec(n) for n in layout.fields}
        self.encoders = {n: encoder(c) for n, c in self.codecs.items()}
        self.many = {n: rows_encoder(c, layout.fields[n].dtype) for n, c in self.codecs.items()}
        self.bg = background if background is not None else Background(1)
        self._worker = self.bg.worker(self.lane)  # its thread writing this lane (started now,
        # not inside the add that fills the first shard)
        #: called with the lane when the open shard moves to another buffer (``_promote``)
        self.on_move: Callable[[int], None] | None = None
        self.forks = FORKS[0]
        S = layout.shard_rows
        shard_bytes = sum(S * f.dtype.itemsize * int(np.prod(f.shape, dtype=np.int64))
                          for f in layout.fields.values())
        self.n_buffers = n_buffers or pool_size(shard_bytes, layout.lanes)
        self.shared = (SharedStaging.create(shared_root, self.lane, layout, self.n_buffers)
                       if shared_root is not None else None)
        self._free = [self._buffer(b) for b in range(self.n_buffers)]
        self._rows = S
        # the shared header's per-buffer words (staging.py): rows published at 4b + _N
        self._published = self.shared.published if self.shared is not None else None
        self._size = self.n_buffers
        #: full shards whose write failed, oldest first (changed in place: the step kernel
        #: holds this list)
        self.pending: list[ShardBuffer] = []
        self.queued: list[ShardBuffer] = []  # full shards handed to the background thread
        self._cv = threading.Condition()  # the background thread finished a shard
        self._results: deque = deque()  # (shard, error, state) from the background thread
        self._halted = False  # a background write failed: later ones of the lane wait
        #: 1 while full shards must be handed over by :meth:`_hand_off` (spare lineages to
        #: attach, or writes halted), not by the step kernel, which reads this byte
        self.gate = np.zeros(1, np.uint8)
        self._lost_to = 0  # rows before this step were dropped unwritten (a lap behind)
        self.error: BaseException | None = None  # a background error not yet reported
        self._spares: dict[str, Lineage] = {}  # the open shard's objects (partial flushes)
        self._spare_root = f"_state/spare/lane_{self.lane}"
        self._session = os.urandom(4).hex()
        self._local = getattr(backend, "is_local", False) and hasattr(backend, "remove_tree")
        self._state_lineage = Lineage(f"{self._spare_root}/{self._session}/state", False)
        if self._local:  # a dead writer's leftovers (this writer holds the lane)
            backend.remove_tree(self._spare_root)
            backend.remove_temp_files(lane_prefix(self.lane))  # (index snapshot blocks)
        self.cur = self._free.pop()
        self.cur.first_step = self.count - self.count % S
        self.cur.n = self.count % S
        self.cur.entered = self.cur.n > 0  # (else the first row opens it)
        if self.cur.slot >= 0:
            self.shared.begin(self.cur.slot, self.cur.first_step)
            self.shared.set_committed(self.count)

    def _buffer(self, b: int) -> ShardBuffer:
        L = self.layout
        if self.shared is not None and 0 <= b < self.n_buffers:
            staging = self.shared.buffers[b]
        else:
            b = -1
            staging = {n: np.empty((L.shard_rows, *f.shape), f.dtype)
                       for n, f in L.fields.items()}
        images = {n: ShardImage(L.chunks_per_shard(n), L.chunk_rows(n), self.encoders[n],
                                -1 if n == "_step_id" else 0, self.many[n]) for n in L.fields}
        # (the addresses now, not inside the add that first stages a row there)
        return ShardBuffer(b, staging, images,
                           shard_addresses(staging, list(L.fields), self.shared, b))

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

    @property
    def session(self) -> int:
        """Number of the shared staging this writer publishes (0: none)."""
        return self.shared.session if self.shared is not None else 0

    def shard_index(self, step: int) -> int:
        """Global shard number of ``step`` in this lane."""
        L = self.layout
        return self.lane * L.shards_per_lane + (step % L.lane_capacity) // L.shard_rows

    def load_partial(self, rows: dict[str, np.ndarray]) -> None:
        """Restore the staged rows of a partly written shard (after reopening)."""
        for name, arr in rows.items():
            self.cur.staging[name][: len(arr)] = arr
        if self.cur.slot >= 0:
            self.shared.publish(self.cur.slot, self.cur.n)

    def staged(self, name: str, steps: np.ndarray, out: np.ndarray
               ) -> np.ndarray:
        """Values of rows still only in RAM (``committed.count <= steps < count``) into
        ``out``; which were found there (the others: committed meanwhile and their buffer
        refilled, by another thread of this process adding: read them from storage).

        A buffer's rows count as found only if it still holds them after the copy: a
        buffer is emptied (``n = 0``) when its shard is written and refilled only as a
        later shard (another ``first_step``), so an unchanged first step and enough rows
        after the copy mean no row of it changed during the copy."""
        steps = np.asarray(steps, np.int64)
        found = np.zeros(len(steps), bool)
        for sh in (*self.pending, *self.queued, self.cur):
            first, n = sh.first_step, sh.n
            at = steps - first
            sel = (at >= 0) & (at < n)
            if not sel.any():
                continue
            out[sel] = sh.staging[name][at[sel]]
            if sh.first_step == first and sh.n >= n:
                found |= sel
        return found

    def staged_rows(self, name: str) -> tuple[np.ndarray, int] | None:
        """Field ``name``'s rows in the shard being filled and the lane step of its row 0,
        ``(rows, first_step)``, where that shard holds every row only in RAM (no full shard
        queued or pending); else ``None`` (:meth:`staged` reads them)."""
        if self.pending or self.queued:
            return None
        cur = self.cur
        return cur.staging[name][: cur.n], cur.first_step

    def staging_token(self) -> tuple[ShardBuffer, int]:
        """The shard being filled and its first step: equal (``is``, ``==``) before and
        after a read of :meth:`staged_rows`' arrays, no row they held was replaced (a
        buffer is refilled only as a later shard, of another first step)."""
        return self.cur, self.cur.first_step

    @property
    def inherited(self) -> bool:
        """This object was copied into a forked child (its parent owns the lane)."""
        return self.forks != FORKS[0]

    def _check_owner(self) -> None:
        if self.forks != FORKS[0]:
            raise StoreLockedError(
                f"{self.backend.url}: lane {self.lane}: this store object was inherited "
                "from the process that opened it (a fork), which owns the lane: open the "
                "store again in this process to write")

    # -- appending -----------------------------------------------------------------------
    def slot(self, retry: bool = True) -> tuple[dict[str, np.ndarray], int]:
        """Where the next row goes: the current shard's staging buffers (field -> array of
        ``shard_rows`` rows) and the row index in them (room for one row). Write every field
        of that row (meta fields included), then call :meth:`advance`. ``retry``: first
        write shards whose write failed (raising before anything is staged if it fails
        again); ``False`` for a row that must follow the row just staged (a final row)."""
        if self.forks != FORKS[0]:
            self._check_owner()
        if retry and self.pending:  # an earlier write failed: retry before staging more
            self.flush()
        if self.cur.n == 0:
            self._enter_shard()
        return self.cur.staging, self.cur.n

    def advance(self, rows: int = 1) -> None:
        """The row written at :meth:`slot` is staged (published to readers); a full shard
        goes to the background thread and a free buffer becomes current (waiting for the
        oldest write when none is free)."""
        cur = self.cur
        n = cur.n = cur.n + rows
        self.count += rows
        if cur.slot >= 0:
            self._published[cur.slot * 4 + _N] = n  # after the row's data (staging.py)
        if n == self._rows:
            self._hand_off()

    def append(self, rows: dict[str, np.ndarray], retry: bool = True, wait: bool = True
               ) -> tuple[int, int]:
        """Stage ``m`` consecutive rows; full shards are written as they fill, and the call
        returns once they are (their write overlaps with staging the rows after them).

        Returns ``(first_step, m)``. Every field (meta included) must be present. If a
        shard write fails, every row is still staged and :class:`WriteFailedError` is
        raised at the end (``count`` tells what was staged). ``retry``: as for :meth:`slot`.
        ``wait=False``: return once the rows are staged, as :meth:`advance` does (full
        shards are written in the background; an error surfaces at :meth:`poll`).
        """
        self._check_owner()
        if retry and self.pending:  # an earlier write failed: retry before staging more
            self.flush()
        m = len(rows["_flags"])
        start = self.count
        S = self.layout.shard_rows
        done = 0
        while done < m:
            cur = self.cur
            if cur.n == 0:
                self._enter_shard()
            take = min(S - cur.n, m - done)
            for name, buf in cur.staging.items():
                buf[cur.n : cur.n + take] = rows[name][done : done + take]
            done += take
            self.advance(take)
        if not wait:
            return start, m
        self.wait()
        error = self.take_error()
        if error is not None:
            raise error
        return start, m

    def _enter_shard(self) -> None:
        """The lane's next row opens a shard in the current buffer. (The definition: the
        step kernel's ``enter`` in ``step_shards.h`` is its fast path for the common case,
        held to the same state by ``tests/test_step_kernel.py``.)"""
        L = self.layout
        if self.cur.slot < 0:
            self._promote()
        cur = self.cur
        cur.first_step = self.count
        if not cur.clean:
            self._reset(cur)
        if cur.slot >= 0:
            self.shared.begin(cur.slot, cur.first_step)
        # Rows of the previous lap in this shard's slots are gone for this process now.
        self.valid_from = max(self.valid_from, self.count + L.shard_rows - L.lane_capacity)
        cur.entered = True

    def _hand_off(self) -> None:
        """The current shard is full: queue its write (behind a failed one: keep it) and
        make a free buffer current. (Kept to a few operations: this runs inside an add.
        The definition: the step kernel's ``hand_off`` in ``step_shards.h`` is its fast
        path for the common case, held to the same state by ``tests/test_step_kernel.py``.)"""
        if self.forks != FORKS[0]:
            self._check_owner()
        sh = self.cur
        if self._spares:
            sh.spare_dir = self._spare_dir(sh)
            sh.lineages = list(self._spares.values())
            self._spares = {}
            self._regate()
        if self.pending or self._halted:
            self.wait()  # (skipped behind the failed one: now in ``pending``, in order)
            self._keep(sh)
        else:
            sh.done = False
            self.queued.append(sh)
            wk = self._worker
            wk.jobs.append((self, sh))
            if wk.sleeping[0]:
                wk.wake.set()
        free = self._free  # (finished writes are applied by the next poll, not here)
        self.cur = free.pop() if free else self._take()  # (no rows, not opened: _recycle)

    def _promote(self) -> None:
        """Move the current shard from a private buffer (taken while writes failed) into a
        free shared one, so that readers on this machine see its rows again."""
        cur = self.cur
        shm = next((b for b in self._free if b.slot >= 0), None)
        if cur.slot >= 0 or shm is None:
            return
        self._free.remove(shm)
        n = cur.n
        for name, arr in cur.staging.items():
            shm.staging[name][:n] = arr[:n]
        shm.images, cur.images = cur.images, shm.images
        shm.clean, cur.clean = cur.clean, shm.clean
        shm.first_step, shm.n = cur.first_step, n
        self.shared.begin(shm.slot, shm.first_step)
        self.shared.publish(shm.slot, n)
        self.cur = shm
        self._recycle(cur)
        if self.on_move is not None:
            self.on_move(self.lane)

    def _spare_dir(self, sh: ShardBuffer) -> str:
        return f"{self._spare_root}/{self._session}/{sh.first_step}"

    def _reset(self, sh: ShardBuffer) -> None:
        for img in sh.images.values():
            img.reset()
        sh.clean = True

    def _keep(self, sh: ShardBuffer) -> None:
        """Keep a full shard not written in ``pending``; shards a lap older than it are
        overwritten by it and dropped unwritten."""
        L = self.layout
        keep = []
        for p in self.pending:
            if p.first_step + L.lane_capacity > sh.first_step:
                keep.append(p)
            else:
                self._lost_to = max(self._lost_to, p.first_step + p.n)
                self._recycle(p)
        self.pending[:] = keep + [sh]  # (the same list for the writer's life: see __init__)

    def _take(self) -> ShardBuffer:
        """A free buffer: waits for the oldest queued write when none is free; grows the
        pool (private memory) when the others all hold shards whose write failed."""
        self.poll()
        while not self._free:
            if not self.queued:
                self._size += 1
                return self._buffer(-1)
            self._wait_for(self.queued[0])
            self.poll()
        return self._free.pop()

    def _wait_for(self, sh: ShardBuffer) -> None:
        self.bg.hurry()
        with self._cv:
            while not sh.done:
                self._cv.wait()

    def _recycle(self, sh: ShardBuffer) -> None:
        """Return ``sh`` to the free buffers, with no rows and not opened (a free buffer
        is made current as it is, by :meth:`_hand_off` and the step kernel)."""
        if self._size > self.n_buffers and sh.slot < 0:
            self._size -= 1  # an extra buffer: dropped
        else:
            sh.n = 0
            sh.entered = False
            self._free.append(sh)

    def _regate(self) -> None:
        self.gate[0] = 1 if (self._spares or self._halted) else 0

    # -- the background thread's side -----------------------------------------------------
    def _background_write(self, sh: ShardBuffer) -> None:
        state = error = None
        try:
            if not self._halted:
                self._commit(sh, partial=False, background=True)
                state = LaneState(**vars(self._disk))
                self._reset(sh)  # ready for its next shard (here: not inside an add)
        except BaseException as e:  # reported on the caller's thread
            self._halted = True
            self._regate()
            error = e
        self._results.append((sh, error, state))
        with self._cv:
            sh.done = True
            self._cv.notify_all()

    def poll(self) -> BaseException | None:
        """Apply finished background writes on the caller's thread: commits, recycled
        buffers, shards whose write failed moved to ``pending``. Returns the first error
        not yet reported (also kept in ``error`` until :meth:`take_error`)."""
        if self.forks != FORKS[0]:
            return None
        results = self._results
        while results:
            sh, err, state = results.popleft()
            self.queued.remove(sh)
            if state is not None:
                self.committed = state
                self._recycle(sh)
                if self.on_shard_written is not None:
                    self.on_shard_written(self.shard_index(sh.first_step))
            else:
                self.pending.append(sh)
                if err is not None and self.error is None:
                    self.error = err
        return self.error

    def take_error(self) -> BaseException | None:
        """The background error not reported yet (cleared)."""
        error, self.error = self.error, None
        return error

    def wait(self) -> None:
        """Wait for every queued shard of the lane to be written (or to fail)."""
        while self.queued:
            self._wait_for(self.queued[0])
            self.poll()

    # -- committing ----------------------------------------------------------------------
    def flush(self) -> bool:
        """Write staged shards and commit the lane state; ``False`` if nothing to do.

        Waits for the shards queued for the background thread first. Raises
        :class:`WriteFailedError` (an ``OSError``) naming the object that could not be
        written; committed rows stay intact and staged rows stay in RAM.
        """
        self._check_owner()
        self.wait()
        if not self.dirty:
            self.error = None
            return False
        while self.pending:
            sh = self.pending[0]
            self._commit(sh, partial=False)
            self.pending.pop(0)
            self.committed = LaneState(**vars(self._disk))
            self._recycle(sh)
            if self.on_shard_written is not None:
                self.on_shard_written(self.shard_index(sh.first_step))
        self._halted = False
        self._regate()
        self.error = None  # what failed before is written now
        self._promote()
        if self.count > self._disk.count:
            self._commit(self.cur, partial=True)
            self.committed = LaneState(**vars(self._disk))
            if self.on_shard_written is not None:
                self.on_shard_written(self.shard_index(self.cur.first_step))
        return True

    def close(self) -> None:
        """After the last flush: the open shard's objects are rewritten without the bytes
        its in-place flushes left unreferenced; stop publishing staged rows, drop spares."""
        if self.forks != FORKS[0]:
            return
        cur, L = self.cur, self.layout
        if self._local and cur.n and not self.dirty:
            with contextlib.suppress(OSError):  # committed either way; only tidier
                for name, img in cur.images.items():
                    if img.loose and img.n == cur.n:
                        self.backend.put(L.shard_key(name, self.shard_index(cur.first_step)),
                                         img.compact(cur.first_step, cur.n, L.checksum))
        if self.shared is not None:
            self.shared.close()
        for lin in (*self._spares.values(), self._state_lineage):
            lin.close()
        if self._local:
            self.backend.remove_tree(f"{self._spare_root}/{self._session}")

    def _commit(self, sh: ShardBuffer, partial: bool, background: bool = False) -> None:
        """Write ``sh`` (every field's object) and the lane state covering it (§4):
        :func:`~.shard_commit.commit_shard`."""
        commit_shard(self, sh, partial, background)
