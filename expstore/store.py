"""The store: a thin face over storage (shards, state), the row index, and reading.

``create``/``open`` (``api.py``) give a :class:`Store`. Writes go to one
:class:`LaneWriter` per lane the store may write (full shards are written by background
threads), through the :class:`Appender` (``appender.py``: which path a step takes), once
:class:`WriteAccess` (``write_access.py``: leases, open, writable) allows them; the
:class:`RowIndex` learns every row as it is staged, so the writing process can sample rows
not yet flushed (read from the staging buffers). Opening, and other processes'
:meth:`Store.refresh`, load committed rows into the index with the :class:`IndexLoader`
(``index_loader.py``): they see rows once flushed, and on a local store the rows its
writers staged too (shared memory, ``storage/read/staged.py``). :attr:`Store.source`
(``loading/store_rows.py``) serves rows to plans from wherever they are, by the rule
DataLoader workers read by too.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from .appender import Appender
from .episode_view import (
    count_transitions,
    find_episodes,
    iter_episodes,
    missing_field,
    read_episode,
)
from .errors import WriteFailedError
from .index.rows import RowIndex
from .index_loader import IndexLoader
from .loading.execute import assemble
from .loading.skip_corrupt import SkipCorruptSource, quarantine_lap, skipping_in_process
from .loading.store_rows import StagedSnapshot, StoreRows, staged_snapshot
from .sampling import IN_PROCESS, ReaderView, UniformSampler, make_plan, read_fresh
from .saved_priorities import load_priority_file, save_priority_file
from .spec import Spec
from .storage.backends import Backend
from .storage.format import (
    LaneState,
    Layout,
    read_quarantine,
    read_states,
    round_capacity,
)
from .storage.ownership import DEFAULT_TTL, LeasedBackend
from .storage.read import ENTRY_TABLE_BYTES, MAP_BYTES, ShardReader, StagedRows, shared_root
from .storage.write import Background, LaneWriter, resume_writer
from .write_access import WriteAccess, acquire_leases, release_at_end


class Store:
    """A disk-backed ring of transitions. See :func:`create` and :func:`open`.

    A context manager: ``with es.open(url, "r+") as store:`` flushes and releases the lanes'
    leases on exit (:meth:`close`). A store that is garbage-collected, or still open when
    the process exits, releases its leases without flushing: rows added since the last
    :meth:`flush` are not committed (reopening gives the store as of that flush).
    """

    #: bytes of decoded frames kept by this process's reader (``open(cache_bytes=...)``)
    cache_bytes: int = 256 << 20
    #: bytes of this process's hot set (``open(hot_bytes=...)``): decoded small fields
    #: (scalars, state vectors: every field stored many rows per chunk) held in RAM, shard
    #: by shard as they are first read; a 1M-row store of 17-dim float32 obs and 6-dim
    #: actions takes ~100 MB. Where a field's share does not hold every shard it may,
    #: shards are admitted while there is room and never evicted (see
    #: ``storage/read/shard_table.py``). Independent of capacity; every DataLoader worker
    #: process keeps its own (``make_loader(hot_bytes=...)``).
    hot_bytes: int = 512 << 20
    #: bytes of frame shard files this process's reader maps at once, per frame field
    #: (``open(map_bytes=...)``; local stores): warm frames are copied from the page
    #: cache without a system call. Mapped pages touched count in RSS (as ``RssFile``)
    map_bytes: int = MAP_BYTES
    #: bytes of frame shards' chunk offsets this process's reader holds per frame field
    #: (``open(entry_bytes=...)``): a held shard's frame costs one read, not two. Taken as
    #: shards are first read; every DataLoader worker process holds its own
    entry_bytes: int = ENTRY_TABLE_BYTES

    def __init__(self, backend: Backend, layout: Layout, mode: str = "r",
                 lane: int | None = None, storage_options: dict[str, Any] | None = None,
                 lease_ttl: float | None = DEFAULT_TTL, strict: bool = False,
                 index_all: bool = True, hot_bytes: int | None = None,
                 map_bytes: int | None = None, entry_bytes: int | None = None):
        self.backend = backend
        self.layout = layout
        if hot_bytes is not None:  # (before the index is loaded: its reader is the one kept)
            self.hot_bytes = int(hot_bytes)
        if map_bytes is not None:
            self.map_bytes = int(map_bytes)
        if entry_bytes is not None:
            self.entry_bytes = int(entry_bytes)
        self.mode = mode
        self.storage_options = storage_options
        self.index = RowIndex(layout.lanes, layout.lane_capacity)
        self._reader: ShardReader | None = None
        self._source: StoreRows | None = None  # (made once per reader: ``source``)
        self._reader_pid = -1
        self._sampler = None
        #: held while this process's reader is used by sample/read_plan or a loader's
        #: prefetch thread (``loading/prefetch.py``): one thread at a time
        self._read_lock = threading.RLock()
        self._flush_hooks: list[Callable[[], None]] = []
        if lane is not None and not 0 <= lane < layout.lanes:
            raise ValueError(f"lane: expected 0..{layout.lanes - 1}, got {lane}")
        self.write_lanes = ([] if mode == "r" else
                            [lane] if lane is not None else list(range(layout.lanes)))
        self.writers: dict[int, LaneWriter] = {}
        self._bg = Background() if self.write_lanes else None  # writes full shards
        if self._bg is not None:
            self._bg.start()
        self._staged = StagedRows(self)  # rows other processes staged (shared memory)
        self.leases = acquire_leases(backend, self.write_lanes, lease_ttl)
        if self.leases:  # released when this object is collected or the process exits
            weakref.finalize(self, release_at_end, list(self.leases.values()))
        self._access = WriteAccess(backend.url, mode, self.write_lanes, self.writers,
                                   self.leases)
        self._appender = Appender(layout.spec, self.writers, self.index, self._access,
                                  self._poll_writes, strict=strict)
        self.add = self._appender.add  # Store.add itself: one Python call less per step
        self._skipping: SkipCorruptSource | None = None  # (made by the first skipping read)
        try:
            self._loader = IndexLoader(backend, layout, self.index, lambda: self.reader,
                                       read_quarantine(backend),  # rows lost (repair)
                                       read_states(backend, list(range(layout.lanes))))
            #: ``time.monotonic()`` when lane states were last read (open, ``refresh``)
            self.refreshed_at = time.monotonic()
            for st in list(self._states):
                if index_all or st.lane in self.write_lanes:
                    self._loader.load_lane(st)
            for i in self.write_lanes:
                lease = self.leases.get(i)
                self.writers[i] = resume_writer(
                    LeasedBackend(backend, lease) if lease is not None else backend, layout,
                    self._states[i], self._loader.quarantine, lambda: self.reader,
                    on_shard_written=self._forget_shard, background=self._bg,
                    shared_root=shared_root(backend))
                snapshot = self.writers[i].snapshot  # its open block: rows written before
                if snapshot is not None:
                    snapshot.resume(*self._loader.committed_rows(
                        i, *snapshot.wants(self.writers[i].first_step)))
            if self.writers:
                self._appender.step_kernel.plan()  # built now, not in the first add
        except BaseException:
            self._access.release()
            raise

    # -- basic facts ---------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self.backend.url

    @property
    def spec(self) -> Spec:
        return self.layout.spec

    @property
    def capacity(self) -> int:
        """Rows the store holds at most (all lanes)."""
        return self.layout.capacity

    @property
    def lanes(self) -> int:
        return self.layout.lanes

    def __len__(self) -> int:
        """Rows currently held (intact), all lanes; final rows of episodes included, rows
        marked lost (quarantined by ``repair``, or skipped as corrupt) not."""
        return int(self.index.held().sum())

    @property
    def episodes_written(self) -> int:
        """Finished episodes written so far, all lanes, including ones since overwritten
        (:attr:`num_episodes` counts the complete episodes held now)."""
        return sum(self._lane_episodes(i) for i in range(self.lanes))

    def _lane_episodes(self, lane: int) -> int:
        if lane in self.writers:
            return self.writers[lane].episodes
        return self._states[lane].episodes

    @property
    def _states(self) -> list[LaneState]:
        """Per lane, the committed state its rows in the index were loaded up to."""
        return self._loader.states

    def __repr__(self) -> str:
        return (f"Store({self.url!r}, rows={len(self)}, transitions={self.num_transitions}, "
                f"episodes={self.num_episodes}, capacity={self.capacity} "
                f"({self.capacity_note}), lanes={self.lanes}, mode={self.mode!r})")

    # -- reading back: episodes and counts (logic in episode_view.py) ---------------------
    @property
    def num_transitions(self) -> int:
        """Env steps (transitions) held, all lanes: ``len(store)`` minus the final rows
        (and quarantined rows). The newest step of an open episode counts, though it is
        sampled only once its next step arrives."""
        return count_transitions(self.index)

    @property
    def num_episodes(self) -> int:
        """Complete episodes held now (first row to final row intact), all lanes."""
        return len(find_episodes(self.index))

    @property
    def capacity_note(self) -> str:
        """How ``capacity`` came about: rows per lane in whole shards, and the capacity
        ``create`` was asked for when it was rounded up (or given headroom)."""
        lay = self.layout
        asked = lay.requested_capacity
        shards = f"{lay.lanes * lay.shards_per_lane} shards of {lay.shard_rows} rows"
        if asked is None or asked == lay.capacity:
            return shards
        rounded = round_capacity(asked, lay.lanes, lay.shard_rows)
        if lay.capacity > rounded:  # (create(headroom_rows=...): the integrations' stores)
            return (f"{asked} requested, rounded up to whole shards with "
                    f"{lay.capacity - rounded} rows of headroom: {shards}")
        return f"{asked} requested, rounded up to whole shards: {shards}"

    #: in-process sampling (``sample``, every sampler's ``sample``) skips the samples whose
    #: reads touch a chunk that fails its checks: that chunk's rows (of the lap read) are
    #: marked lost in this process's index (never sampled again), logged once per chunk and
    #: counted in ``corrupt_rows_skipped``; nothing is written. The same per sampler:
    #: ``UniformSampler(store, skip_corrupt=True)`` (any sampler), and per loader:
    #: ``make_loader(store, ..., skip_corrupt=True)``
    skip_corrupt: bool = False

    @property
    def corrupt_rows_skipped(self) -> int:
        """Rows in-process sampling did not deliver because their shard is corrupt."""
        skipping = self._skipping
        return 0 if skipping is None else skipping.found.rows_skipped

    def _plan_source(self, skip_corrupt: bool = False) -> Any:
        """:attr:`source`, skipping corrupt chunks with ``skip_corrupt`` or
        :attr:`skip_corrupt` (one quarantine per process; ``quarantine_lap`` logs)."""
        if not (skip_corrupt or self.skip_corrupt):
            return self.source
        self._skipping = skipping_in_process(self._skipping, self.source, self.layout,
                                             on_shard=self._quarantine_chunk)
        return self._skipping

    def _quarantine_chunk(self, name: str, shard: int, chunk: int, first_step: int) -> None:
        """Mark the rows a corrupt chunk (-1: shard) held in the lap from ``first_step``
        lost in this process's index, and log it once."""
        quarantine_lap(self.index, self.layout, name, shard, first_step, chunk)

    def episodes(self, lanes: int | Iterable[int] | None = None,
                 steps: tuple[int | None, int | None] | None = None,
                 stacked: bool = True) -> Iterator[dict[str, Any]]:
        """The complete episodes held, one dict of arrays each (memory: one episode), lane
        by lane, oldest first. ``lanes``: a lane or lanes; ``steps``: ``(start, stop)``
        lane steps an episode must lie within. See ``episode_view.read_episode`` for the
        keys (``obs`` holds ``T + 1`` rows, ``action``/``reward``/... ``T``)."""
        return iter_episodes(self, lanes, steps, stacked)

    def episode(self, i: int, lanes: int | Iterable[int] | None = None,
                steps: tuple[int | None, int | None] | None = None,
                stacked: bool = True) -> dict[str, Any]:
        """Episode ``i`` (negative counts from the newest) of the complete episodes held,
        with the same filters as :meth:`episodes`."""
        refs = find_episodes(self.index, lanes, steps)
        if not -len(refs) <= int(i) < len(refs):
            raise IndexError(f"episode {i}: the store holds {len(refs)} complete "
                             "episode(s) here")
        j = int(i) % len(refs)
        return read_episode(self, refs[j], j, stacked)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce_ex__(self, protocol: object) -> Any:
        """A store holds open files, writers and leases: it is never pickled or copied (a
        copy that reopened it could replay a creation, or take a second lease)."""
        raise TypeError(f"{self.url}: an open Store does not pickle or copy; pass its URL "
                        "and call expstore.open(url) where it is needed (make_loader's "
                        "workers do so themselves)")

    # -- opening -------------------------------------------------------------------------
    @property
    def reader(self) -> ShardReader:
        """This process's reader (a forked child gets its own)."""
        if self._reader is None or self._reader_pid != os.getpid():
            self._reader = ShardReader(self.backend, self.layout,
                                       row_cache_bytes=self.cache_bytes,
                                       values_budget=self.hot_bytes,
                                       map_bytes=self.map_bytes,
                                       entry_bytes=self.entry_bytes)
            self._reader_pid = os.getpid()
        return self._reader

    def _forget_shard(self, shard: int) -> None:
        if self._reader is not None and self._reader_pid == os.getpid():
            # (the writing thread: a learner thread's sample, holding the lock, may be
            # claiming, filling or gathering the very slots forgetting frees)
            with self._read_lock:
                self._reader.forget(shard)

    def refresh(self) -> None:
        """Re-read lane state files and index rows other processes committed since; on a
        local store also the rows their writers staged and did not flush yet (from shared
        memory, ``expstore/storage/read/staged.py``), which this process's samplers then see."""
        lanes = [i for i in range(self.lanes) if i not in self.writers]
        with self._read_lock:  # (a loader's prefetch thread plans from the index)
            self._loader.reload_quarantine()  # (at most every few s)
            for st in read_states(self.backend, lanes):
                self._staged.refresh_lane(st, self._loader.load_lane)
            self.refreshed_at = time.monotonic()

    @property
    def publishes_staging(self) -> bool:
        """Whether processes of this machine (DataLoader workers included) can read every
        row this store knows, staged ones too, without a flush: a local store whose
        writers stage in shared memory."""
        return self._staged.shared and all(w.shared is not None
                                           for w in self.writers.values())

    def staged_snapshot(self) -> StagedSnapshot:
        """Per lane, the writer session whose staged rows this process plans with (0: none)
        and the committed count: what a reader in another process (a DataLoader worker)
        needs to read this process's plans (``StoreDataset``)."""
        return staged_snapshot(self.lanes, self.index.committed, self._staged.sessions,
                               self.writers)

    def _poll_writes(self, raise_errors: bool = True) -> None:
        """Apply the results of background shard writes on this thread (the writing one):
        committed counts, shards to re-open, and a failed write's error (raised as
        ``WriteFailedError``, its rows kept staged for the next flush; ``raise_errors=False``:
        kept for the next write call). Reads see written shards as committed after it."""
        bg = self._bg
        if bg is None or not bg.state["news"]:
            return
        bg.state["news"] = False
        error = None
        for lane, w in self.writers.items():
            w.poll()
            self.index.committed[lane] = w.committed.count
            e = w.take_error() if raise_errors else None
            error = error or e
        if error is not None:
            raise error

    # -- writing -------------------------------------------------------------------------
    def add(self, obs: Any = None, action: Any = None, reward: Any = None,
            next_obs: Any = None, terminated: Any = None, truncated: Any = None,
            lane: int | None = None, **extras: Any) -> None:
        """Store one env step (Gymnasium's ``obs, action, reward, next_obs, term, trunc``).

        The step may also be one mapping with the keys of :meth:`extend` (no leading axis):
        ``add({"obs": ..., "action": ..., "reward": ..., "next_obs": ..., ...})``.
        ``lane`` defaults to the store's one writable lane (``lanes=1``, or opened with
        ``lane=i``). With several writable lanes and ``lane=None`` every value has a leading
        ``num_envs == lanes`` axis and one step goes into each lane. ``next_obs`` is stored
        only when the episode ends (as the episode's final row) or when the lane's next
        step does not start from it; otherwise it is the next step's ``obs``.
        """
        self._appender.add(obs, action, reward, next_obs, terminated, truncated, lane,
                           **extras)  # (an open store binds its appender's add as its own)

    def extend(self, batch: Mapping[str, Any] | None = None, lane: int | None = None,
               check_next_obs: bool = True, **fields: Any) -> None:
        """Store ``T`` consecutive steps of one lane: every value has leading axis ``T``.

        Keys: ``obs, action, reward, terminated, truncated`` (+ user fields) and
        ``next_obs``, which may be omitted when no step in the batch ends an episode.
        ``next_<user field>`` (optional) gives a user field's value for the final rows of
        episodes ending in the batch (else they hold zeros). The same as keywords:
        ``extend(obs=..., action=..., ...)``. ``lane`` defaults to the store's one
        writable lane (``lanes=1``, or opened with ``lane=i``), else 0.

        ``check_next_obs`` (default): where ``next_obs`` is given for every step, a step
        whose ``next_obs`` is not the next step's ``obs`` is closed with a final row holding
        it (``strict=True``: refused), so no sampled ``next_obs`` is ever wrong; the last
        step's ``next_obs`` is held for the lane's next ``add``. ``False``: ``next_obs`` is
        read only where an episode ends (elsewhere it may hold anything, e.g. zeros): for
        importers whose batches are known to be consecutive steps.
        """
        self._appender.extend(batch, lane, check_next_obs, fields)

    def extend_checked(self, lane: int, steps: Mapping[str, np.ndarray],
                       check_next_obs: bool = True) -> None:
        """:meth:`extend` for integrations that checked and cast the steps already (flat
        field names, ``next_<obs field>``: ``validate.validate_steps``' output): no second
        check; full shards are written in the background, as :meth:`add` leaves them (a
        write's error surfaces at the next call)."""
        self._appender.extend_checked(lane, dict(steps), check_next_obs)

    def set_episode_position(self, lane: int, position: int) -> None:
        """The next row of ``lane`` starts at this position of its episode; 0 = a new
        episode (flag FIRST, even when the lane's last episode has no final row: it stays
        interrupted). ``k > 0`` continues an episode whose first ``k`` rows are not here."""
        if not 0 <= lane < self.lanes:
            raise ValueError(f"lane: expected 0..{self.lanes - 1}, got {lane}")
        if position < 0:
            raise ValueError(f"position: expected >= 0, got {position}")
        self._appender.open_step[lane] = int(position)

    def flush(self) -> None:
        """Commit every staged row of the lanes this store writes (data, then state),
        then run the flush hooks (samplers persisting their priorities)."""
        if self._access.closed:
            self._access.refuse_closed()
        self._access.ensure_held()  # a lease another writer took: raises, naming who, why
        self._poll_writes(raise_errors=False)  # a failed background write is retried below
        errors = []
        for lane, w in self.writers.items():
            try:
                w.flush()
            except WriteFailedError as e:  # try the other lanes anyway
                errors.append(e)
            self.index.committed[lane] = w.committed.count
        if errors:
            raise errors[0]
        for fn in list(self._flush_hooks):
            fn()

    def add_flush_hook(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` at the end of every :meth:`flush` (and so on :meth:`close`)."""
        self._flush_hooks.append(fn)

    def remove_flush_hook(self, fn: Callable[[], None]) -> None:
        if fn in self._flush_hooks:
            self._flush_hooks.remove(fn)

    def save_priorities(self, name: str, payload: Mapping[str, Any]) -> None:
        """Write a sampler's priority payload (``PriorityIndex.payload()``) as
        ``_index/<name>.bin``, replacing the last one atomically; ``ReadOnlyError`` on a
        store opened with ``mode="r"`` (``saved_priorities.py``)."""
        save_priority_file(self.backend, self.mode, name, payload)

    def load_priorities(self, name: str) -> dict[str, Any] | None:
        """The priority payload saved as ``name`` (``None`` if there is none), with
        ``source`` naming where it came from. ``StoreCorruptError`` if it is damaged or was
        saved for another capacity or number of lanes (``saved_priorities.py``)."""
        return load_priority_file(self.backend, name, self.capacity, self.lanes)

    def close(self) -> None:
        """Flush (when writable), release the lanes' leases, file handles and the reader's
        memory (hot set, caches, mapped shards). Closing twice is a no-op;
        ``add``/``extend``/``flush`` afterwards raise ``ValueError``."""
        if self._access.closed:
            return
        inherited = any(w.inherited for w in self.writers.values())  # a fork's copy
        try:
            if self.mode != "r" and not inherited:
                self.flush()
        finally:
            self._access.closed = True
            if self._bg is not None:
                self._bg.close()
            for w in self.writers.values():
                w.close()  # shared staging unlinked (rows not flushed are gone now)
            self._access.release()
            if self._reader is not None:
                self._reader.close()
                # (its caches, hot set and held index entries go with it: up to GBs at
                # 100M rows; a read after close makes a new one)
                self._reader = self._source = None
            self.backend.close()

    # -- reading -------------------------------------------------------------------------
    def read(self, name: str, rows: np.ndarray, steps: np.ndarray | None = None,
             out: np.ndarray | None = None) -> np.ndarray:
        """Raw values of field ``name`` at ``rows`` (no stacking); rows must be intact."""
        rows = np.asarray(rows, np.int64)
        idx_steps = self.index.steps(rows)
        steps = idx_steps if steps is None else np.asarray(steps, np.int64)
        if name not in self.layout.fields:
            raise missing_field(name, self.spec.fields)
        f = self.layout.fields[name]
        out = np.empty((len(rows), *f.shape), f.dtype) if out is None else out
        ok = self.source.read(name, rows, steps, out)
        if not ok.all():
            raise KeyError(f"{name}: rows {rows[~ok][:8].tolist()} are not held "
                           "(never written or overwritten)")
        return out

    @property
    def source(self) -> StoreRows:
        """Rows as this process sees them (a ``RowSource``): its writers' staged rows from
        their RAM, rows other writers of this machine staged (found by :meth:`refresh`)
        from shared memory, the rest from shards (``loading/store_rows.py``)."""
        reader = self.reader
        source = self._source
        if source is None or source.reader is not reader:  # (the rest are live objects)
            source = self._source = StoreRows(reader, self.layout.lane_capacity,
                                              self.index.committed, self._staged.sessions,
                                              self._staged.lanes, self.writers)
        return source

    def read_plan(self, plan: Any, skip_corrupt: bool = False) -> dict[str, np.ndarray]:
        """Execute a sampler's plan in this process: a batch dict of numpy arrays.
        ``skip_corrupt``: as :attr:`skip_corrupt`, for this read."""
        with self._read_lock:
            batch, _ = assemble(plan, self.layout, self._plan_source(skip_corrupt))
        return batch

    @functools.cached_property
    def history(self) -> int:
        """Past frames any stacked field needs (deepest ``stack`` - 1)."""
        return max((f.stack or 1) for f in self.spec.fields.values()) - 1

    def transitions(self, rows: np.ndarray, n_step: int = 1, gamma: float = 0.99,
                    weight: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Transitions starting at ``rows`` (stacked obs, next_obs, n-step reward).

        Raises ``ValueError`` for rows that cannot start a transition (final rows, rows
        whose next step is not written yet, overwritten rows).
        """
        rows = np.asarray(rows, np.int64)
        valid = self.index.valid(rows, self.history, 1)
        if not valid.all():
            raise ValueError(f"rows {rows[~valid][:8].tolist()} cannot start a transition")
        return self.read_plan(make_plan(self.index, rows, weight, self.history, n_step, gamma))

    def sample(self, batch_size: int, rng: np.random.Generator | None = None, *,
               view: ReaderView = IN_PROCESS) -> dict[str, np.ndarray]:
        """``batch_size`` uniform transitions (dict of numpy arrays, incl. index, weight):
        the store's ``UniformSampler`` plans them, :meth:`read_plan` reads the plan. On a
        read-only store it picks up other processes' rows by itself (the sampler's default
        ``refresh_every``: every 1 s)."""
        if self._sampler is None:
            self._sampler = UniformSampler(self)
        if rng is not None:
            self._sampler.rng = rng
        sampler = self._sampler
        with self._read_lock:  # (a plan wholly overwritten is drawn again: read_fresh)
            return read_fresh(self, lambda: sampler.plan(batch_size, view=view),
                              sampler.skip_corrupt, lambda: sampler.maybe_refresh(now=True))
