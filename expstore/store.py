"""The store: a thin face over storage (shards, state), the row index, and reading.

``create``/``open`` (``api.py``) give a :class:`Store`. Writes go to one
:class:`LaneWriter` per lane the store may write (full shards are written by background
threads); the :class:`RowIndex` learns every row as it is staged, so the writing process
can sample rows not yet flushed (read from the staging buffers). Other processes call
:meth:`Store.refresh`: they see rows once flushed, and on a local store the rows its
writers staged too (shared memory, ``staged.py``). :class:`StoreSource`
(``store_source.py``) serves rows to plans from wherever they are.
"""

from __future__ import annotations

import dataclasses
import errno
import os
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
from .errors import (
    ReadOnlyError,
    StoreCorruptError,
    ValidationError,
    WriteFailedError,
)
from .index.rows import RowIndex
from .loading.execute import assemble
from .loading.skip_corrupt import SkipCorruptSource, quarantine_lap
from .sampling import UniformSampler, make_plan
from .spec import Spec
from .storage.backends import Backend, RetryPolicy
from .storage.format import (
    LaneState,
    Layout,
    decode_priorities,
    encode_priorities,
    lost_ranges,
    priority_key,
    read_metadata,
    read_quarantine,
    read_state,
    read_states,
)
from .storage.ownership import (
    DEFAULT_TTL,
    LeasedBackend,
    acquire_all,
)
from .storage.ownership import losses as lease_losses
from .storage.read import ShardReader, StagedRows, shared_root
from .storage.write import Background, LaneWriter
from .store_source import StoreSource
from .validate import refuse_many_steps, step_from_mapping, validate_steps


def _check_writable(backend: Backend) -> None:
    """Refuse ``mode="r+"`` up front on a local store this process cannot write."""
    folder = os.path.join(getattr(backend, "root", ""), "_state")
    if backend.is_local and os.path.isdir(folder) and not os.access(folder, os.W_OK):
        why = "read-only file system" if _read_only_mount(folder) else "permission denied"
        raise ReadOnlyError(f"{backend.url}/_state: cannot open for writing ({why}); "
                            "open with mode='r' to read")


def _read_only_mount(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def _release_all(leases: Any) -> None:
    """Release leases, never raising (also run by the finalizer of a collected Store and at
    exit; a lease lost to another holder, or taken by the parent of a fork, is left be)."""
    for lease in leases:
        try:
            lease.release()
        except Exception:  # noqa: BLE001 - storage gone: the lease expires by itself
            pass


def _release_at_end(leases: list[Any]) -> None:
    """Finalizer of a collected Store, also run at exit: release its leases with a short
    retry budget (at exit the storage may be gone; a lease left behind expires by itself).
    Rows not flushed are not committed: nothing is written but the lease objects."""
    for lease in leases:
        retry = getattr(lease.backend, "retry", None)
        if isinstance(retry, RetryPolicy):
            lease.backend.retry = dataclasses.replace(retry, attempts=min(retry.attempts, 3),
                                                      deadline=min(retry.deadline, 5.0),
                                                      timeout=min(retry.timeout, 5.0))
    _release_all(leases)


QUARANTINE_RELOAD = 5.0  # seconds between re-reads of the quarantine on refresh()


#: rows of a lane indexed per block when a store is opened or refreshed (bounds the
#: temporary arrays of a load: about 40 bytes per row of a block)
LOAD_BLOCK_ROWS = 1 << 18
#: reads of a row that its lane state covers, under one state, before it counts as damage
DAMAGE_READS = 3


class Store:
    """A disk-backed ring of transitions. See :func:`create` and :func:`open`.

    A context manager: ``with es.open(url, "r+") as store:`` flushes and releases the lanes'
    leases on exit (:meth:`close`). A store that is garbage-collected, or still open when
    the process exits, releases its leases without flushing: rows added since the last
    :meth:`flush` are not committed (reopening gives the store as of that flush).
    """

    #: bytes of decoded frames kept by this process's reader (``open(cache_bytes=...)``)
    cache_bytes: int = 256 << 20

    def __init__(self, backend: Backend, layout: Layout, mode: str = "r",
                 lane: int | None = None, storage_options: dict[str, Any] | None = None,
                 lease_ttl: float | None = DEFAULT_TTL, strict: bool = False,
                 index_all: bool = True):
        self._closed = False
        self.backend = backend
        self.layout = layout
        self.mode = mode
        self.storage_options = storage_options
        self.index = RowIndex(layout.lanes, layout.lane_capacity)
        self._reader: ShardReader | None = None
        self._reader_pid = -1
        self._sampler = None
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
        self._appender = Appender(layout.spec, self.writers, self.index, strict=strict)
        if self.write_lanes:
            _check_writable(backend)
        try:
            self.leases = (acquire_all(backend, self.write_lanes, lease_ttl)
                           if lease_ttl and self.write_lanes else {})
        except OSError as e:
            if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            raise ReadOnlyError(f"{backend.url}: cannot open for writing, the storage refuses "
                                f"writes ({e.strerror or e}); open with mode='r' to read"
                                ) from e
        if self.leases:  # released when this object is collected or the process exits
            weakref.finalize(self, _release_at_end, list(self.leases.values()))
        try:
            self._quarantine = read_quarantine(backend)  # rows lost to corruption (repair)
            self._quarantine_read = time.monotonic()
            self._states = read_states(backend, list(range(layout.lanes)))
            #: ``time.monotonic()`` when lane states were last read (open, ``refresh``)
            self.refreshed_at = time.monotonic()
            for st in list(self._states):
                if index_all or st.lane in self.write_lanes:
                    self._load_lane(st)
            for i in self.write_lanes:
                self.writers[i] = self._resume_writer(self._states[i])
            if self.writers:
                self._appender.plan()  # the step kernel's plan: now, not in the first add
        except BaseException:
            self._release_leases()
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
        ``create`` was asked for when it was rounded up."""
        lay = self.layout
        asked = lay.requested_capacity
        shards = f"{lay.lanes * lay.shards_per_lane} shards of {lay.shard_rows} rows"
        if asked is not None and asked != lay.capacity:
            return f"{asked} requested, rounded up to whole shards: {shards}"
        return shards

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
        skipping = self.__dict__.get("_skipping")
        return 0 if skipping is None else skipping.found.rows_skipped

    def _plan_source(self, skip_corrupt: bool = False) -> Any:
        if not (skip_corrupt or self.skip_corrupt):
            return self.source
        skipping = self.__dict__.get("_skipping")
        if skipping is None or skipping.pid != os.getpid():
            skipping = SkipCorruptSource(None, self.layout, on_shard=self._quarantine_chunk,
                                         log=False)  # quarantine_lap logs it
            self._skipping = skipping
        skipping.source = self.source
        return skipping

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
                                       row_cache_bytes=self.cache_bytes)
            self._reader_pid = os.getpid()
        return self._reader

    def _load_lane(self, st: LaneState) -> None:
        """Bring the index of one lane up to a committed state (reads metadata shards) and
        remember the state it reached (``_states``).

        Streams: rows are read and indexed in blocks of :data:`LOAD_BLOCK_ROWS`, so the
        temporary arrays of a load stay a few MB whatever the lane's size (the index
        itself is 5 bytes per row). The lane's writer may lap this load: rows it drops
        meanwhile are skipped, never reported as damage (:meth:`_read_block`).
        """
        idx = self.index
        lane = st.lane
        st = LaneState(**vars(st))  # (its valid_from rises if the writer drops rows)
        old_count = int(idx.count[lane])
        idx.set_valid_from(lane, st.valid_from)
        a = max(old_count, st.valid_from)
        quarantined = self._quarantine.lanes.get(lane, [])
        while a < st.count:  # block ends aligned to LOAD_BLOCK_ROWS: no shard read twice
            b = min(st.count, (a // LOAD_BLOCK_ROWS + 1) * LOAD_BLOCK_ROWS)
            ep, fl, lost = self._read_block(st, a, b)
            idx.set_valid_from(lane, st.valid_from)
            idx.put(lane, a, ep, fl)  # (rows below valid_from are not announced)
            damaged = lost_ranges(np.arange(a, b), lost)  # (quarantined ones included)
            if quarantined or damaged:
                idx.mark_lost(lane, quarantined + damaged, a, b)
            a = max(b, st.valid_from)  # blocks the writer dropped meanwhile: not read
        if int(idx.count[lane]) < st.count:  # the writer dropped every row left to read
            idx.count[lane] = idx.committed[lane] = st.count
        self._states[lane] = st

    def _read_block(self, st: LaneState, start: int, stop: int
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
                shard = int(self.index.lane_rows(lane, np.array([bad]))[0])
                raise StoreCorruptError(
                    f"{self.url}/"
                    f"{self.layout.shard_key('_flags', shard // self.layout.shard_rows)}: "
                    f"lane {lane} state covers steps {st.valid_from}..{newer.count} but a "
                    f"shard does not hold step {bad}")
            generation = newer.generation
            span = slice(int(missing[0]), int(missing[-1]) + 1)  # (consecutive steps)
            e, f, again, gone = self._read_metadata(lane, steps[span], st.count)
            at = missing - span.start
            ep[missing], fl[missing], lost[missing] = e[at], f[at], gone[at]
            missing = missing[~again[at]]
        for name in ("_episode_step", "_flags"):  # read once: keep no decoded copy
            self.reader.drop_chunks(name)
        return ep, fl, lost

    def _read_metadata(self, lane: int, steps: np.ndarray, count: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``_episode_step`` and ``_flags`` of ``steps`` (consecutive) of ``lane``, which rows
        were read, and which rows are lost: a bad metadata chunk is rebuilt from the rows
        around it (``storage/metadata_rebuild.py``), and rows nothing can rebuild are
        lost. Quarantined rows are never read (lost, zeros). ``count``: the lane's count."""
        rows = self.index.lane_rows(lane, steps)
        ep = np.zeros(len(rows), np.int32)
        fl = np.zeros(len(rows), np.uint8)
        lost = self._quarantine.mask(lane, steps)  # never read lost rows
        ok = lost.copy()
        keep = np.flatnonzero(~lost)
        if len(keep):
            bounds = (max(int(self.index.valid_from[lane]), count - self.layout.lane_capacity),
                      count)
            m = read_metadata(self.reader, self.layout, lane, rows[keep], steps[keep], bounds)
            ok[keep], ep[keep], fl[keep] = m.ok, m.episode_step, m.flags
            lost[keep] = m.lost
        return ep, fl, ok, lost

    def _release_leases(self) -> None:
        _release_all(self.leases.values())

    def _resume_writer(self, st: LaneState) -> LaneWriter:
        lease = self.leases.get(st.lane)
        backend = LeasedBackend(self.backend, lease) if lease is not None else self.backend
        w = LaneWriter(backend, self.layout, LaneState(**vars(st)),
                       on_shard_written=self._forget_shard, background=self._bg,
                       shared_root=shared_root(self.backend))
        if w.n:  # a partly written shard: restore its rows into the staging buffer
            steps = np.arange(w.first_step, w.count)
            keep = ~self._quarantine.mask(st.lane, steps)  # lost rows are restored as zeros
            rows = self.index.lane_rows(st.lane, steps)
            data = {}
            for name, f in self.layout.fields.items():
                buf = np.zeros((len(rows), *f.shape), f.dtype)
                part = buf[keep]
                if not self.reader.read(name, rows[keep], steps[keep], part).all():
                    key = self.layout.shard_key(name, w.shard_index(w.first_step))
                    raise StoreCorruptError(f"{self.url}/{key}: partial shard does not hold "
                                            "its committed rows")
                buf[keep] = part
                data[name] = buf
            w.load_partial(data)
        return w

    def _forget_shard(self, shard: int) -> None:
        if self._reader is not None and self._reader_pid == os.getpid():
            self._reader.forget(shard)

    def refresh(self) -> None:
        """Re-read lane state files and index rows other processes committed since; on a
        local store also the rows their writers staged and did not flush yet (from shared
        memory, ``expstore/storage/read/staged.py``), which this process's samplers then see."""
        lanes = [i for i in range(self.lanes) if i not in self.writers]
        if time.monotonic() - self._quarantine_read >= QUARANTINE_RELOAD:
            self._reload_quarantine()
        for st in read_states(self.backend, lanes):
            self._staged.refresh_lane(st, self._load_lane)
        self.refreshed_at = time.monotonic()

    @property
    def publishes_staging(self) -> bool:
        """Whether processes of this machine (DataLoader workers included) can read every
        row this store knows, staged ones too, without a flush: a local store whose
        writers stage in shared memory."""
        return self._staged.shared and all(w.shared is not None
                                           for w in self.writers.values())

    def staged_snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """Per lane, the writer session whose staged rows this process plans with (0: none)
        and the committed count: what a reader in another process (a DataLoader worker)
        needs to read this process's plans (``StoreDataset``)."""
        return self._staged.snapshot()

    def _poll_writes(self, raise_errors: bool = True) -> None:
        """Apply the results of background shard writes on this thread: committed counts,
        shards to re-open, and a failed write's error (raised as ``WriteFailedError``, its
        rows kept staged for the next flush)."""
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

    def _reload_quarantine(self) -> None:
        """Pick up rows ``repair`` marked lost since we last looked (at most every few s)."""
        q = read_quarantine(self.backend)
        self._quarantine_read = time.monotonic()
        if q.lanes != self._quarantine.lanes:
            self._quarantine = q
            for lane, ranges in q.lanes.items():
                self.index.mark_lost(lane, ranges, 0, int(self.index.count[lane]))

    # -- writing -------------------------------------------------------------------------
    def _writer(self, lane: int) -> LaneWriter:
        if self._closed:
            self._refuse_closed()
        if self.mode == "r":
            raise ReadOnlyError(f"{self.url}: store opened read-only (mode='r')")
        if lane not in self.writers:
            raise ReadOnlyError(f"{self.url}: lane {lane} is not open for writing here "
                                f"(writable lanes: {self.write_lanes})")
        lease = self.leases.get(lane)
        if lease is not None:
            lease.ensure()  # renews when a third of its ttl has passed
        return self.writers[lane]

    def _ensure_leases(self) -> None:
        """``lease.ensure()`` for every lane (a vector ``add``), skipped while every lease
        is held and none is due for renewal (a third of its ttl after its last renewal)."""
        leases = self.leases
        if not leases:
            return
        if (time.monotonic() < self.__dict__.get("_lease_due", 0.0)
                and lease_losses() == self._lease_losses):
            return  # none due, and no lease of this process was lost since the last check
        losses = lease_losses()
        for lease in leases.values():
            lease.ensure()  # raises if lost; renews when a third of its ttl has passed
        self._lease_due = min(lease.renewed_at + lease.ttl / 3 for lease in leases.values())
        self._lease_losses = losses

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
        self._poll_writes()  # background shard writes: commits, or an error raised here
        if not extras and not self._closed and self.writers:  # one C call, where it can
            at = lane
            if at is None:
                at = (self.write_lanes[0] if len(self.write_lanes) == 1 else
                      -1 if self.lanes > 1 and len(self.writers) == self.lanes else None)
            if at == -1 and lane is None:
                self._ensure_leases()
            elif at is not None and at in self.writers:
                self._writer(at)  # renews the lane's lease when due
            else:
                at = None
            if at is not None and self._appender.add_fast(at, obs, action, reward, next_obs,
                                                           terminated, truncated):
                return
        if action is None and reward is None:  # one mapping (or no step at all)
            obs, action, reward, next_obs, terminated, truncated, extras = step_from_mapping(
                obs, next_obs, terminated, truncated, extras)
        if lane is None and len(self.write_lanes) == 1:
            lane = self.write_lanes[0]
        if type(reward) is np.ndarray and reward.ndim and lane is not None:
            refuse_many_steps(self.spec, reward, lane, self.lanes, len(self.write_lanes))
        if lane is None and self.lanes > 1:
            if self._closed or len(self.writers) != self.lanes:
                for i in range(self.lanes):
                    self._writer(i)  # raises, naming what is not writable
            self._ensure_leases()
            batch = self._appender.lanes_check.check(obs, action, reward, next_obs,
                                                     terminated, truncated, extras)
            if batch is None:  # anything else: cast, checked, or refused naming the field
                batch = validate_steps(self.spec, obs, action, reward, next_obs, terminated,
                                       truncated, extras, (self.lanes,))
            self._appender.add_lanes(batch)
            return
        lane = 0 if lane is None else lane
        self._writer(lane)
        self._appender.add_one(lane, obs, action, reward, next_obs, terminated, truncated,
                               extras)

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
        if batch is None:
            if not fields:
                raise ValidationError("extend: no steps given; expected a mapping "
                                      "extend({'obs': ..., 'action': ..., ...}) or keywords "
                                      "extend(obs=..., action=..., ...)")
            batch = fields
        elif fields:
            raise ValidationError(f"extend: give the steps either as one mapping or as "
                                  f"keywords, not both (got a mapping and {sorted(fields)})")
        if lane is None:
            lane = self.write_lanes[0] if len(self.write_lanes) == 1 else 0
        self._writer(lane)
        self._poll_writes()  # background shard writes: commits, or an error raised here
        try:
            b = dict(batch)
        except (TypeError, ValueError) as e:
            raise ValidationError(f"extend: expected a mapping of field -> values with "
                                  f"leading axis T, got {type(batch).__name__}") from e
        missing = [k for k in ("obs", "action", "reward", "terminated", "truncated")
                   if k not in b]
        if missing:
            raise ValidationError(f"extend: missing key(s) {missing}")
        try:
            T = len(b["reward"])
        except TypeError as e:
            raise ValidationError("reward: expected an array with leading axis T") from e
        known = {"obs", "action", "reward", "terminated", "truncated", "next_obs"}
        extras = {k: v for k, v in b.items() if k not in known}
        vals = validate_steps(self.spec, b["obs"], b["action"], b["reward"], b.get("next_obs"),
                              b["terminated"], b["truncated"], extras, (T,))
        self._appender.add_many(lane, vals, check_next_obs)

    def _refuse_closed(self) -> None:
        raise ValueError(f"{self.url}: the store is closed; open it again "
                         "(es.open(url, mode='r+')) to write")

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
        if self._closed:
            self._refuse_closed()
        for lease in self.leases.values():
            if not lease.held:  # taken by another writer: raises, naming who and why
                lease.ensure()
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
        store opened with ``mode="r"``."""
        if self.mode == "r":
            raise ReadOnlyError(f"{self.url}: store opened read-only; priorities cannot be "
                                "saved (open with mode='r+')")
        self.backend.put(priority_key(name),
                         encode_priorities({"name": name, **payload}))

    def load_priorities(self, name: str) -> dict[str, Any] | None:
        """The priority payload saved as ``name`` (``None`` if there is none), with
        ``source`` naming where it came from. ``StoreCorruptError`` if it is damaged or was
        saved for another capacity or number of lanes."""
        key = priority_key(name)
        raw = self.backend.get(key)
        if raw is None:
            return None
        where = f"{self.backend.url}/{key}"
        saved = decode_priorities(raw, where)
        if saved["capacity"] != self.capacity or saved["lanes"] != self.lanes:
            raise StoreCorruptError(
                f"{where}: saved for capacity {saved['capacity']} / {saved['lanes']} lanes, "
                f"the store has {self.capacity} / {self.lanes}")
        saved["source"] = where
        return saved

    def close(self) -> None:
        """Flush (when writable), release the lanes' leases and file handles. Closing
        twice is a no-op; ``add``/``extend``/``flush`` afterwards raise ``ValueError``."""
        if self._closed:
            return
        inherited = any(w.inherited for w in self.writers.values())  # a fork's copy
        try:
            if self.mode != "r" and not inherited:
                self.flush()
        finally:
            self._closed = True
            if self._bg is not None:
                self._bg.close()
            for w in self.writers.values():
                w.close()  # shared staging unlinked (rows not flushed are gone now)
            self._release_leases()
            if self._reader is not None:
                self._reader.close()
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
    def source(self) -> StoreSource:
        """Rows as this process sees them (staged rows included): a ``RowSource``."""
        return StoreSource(self)

    def read_plan(self, plan: Any, skip_corrupt: bool = False) -> dict[str, np.ndarray]:
        """Execute a sampler's plan in this process: a batch dict of numpy arrays.
        ``skip_corrupt``: as :attr:`skip_corrupt`, for this read."""
        batch, _ = assemble(plan, self.layout, self._plan_source(skip_corrupt))
        return batch

    @property
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

    def sample(self, batch_size: int, rng: np.random.Generator | None = None,
               **kwargs: Any) -> dict[str, np.ndarray]:
        """``batch_size`` uniform transitions (dict of numpy arrays, incl. index, weight).
        On a read-only store it picks up other processes' rows by itself (a
        ``UniformSampler``'s default ``refresh_every``: every 1 s)."""
        if self._sampler is None:
            self._sampler = UniformSampler(self)
        if rng is not None:
            self._sampler.rng = rng
        return self._sampler.sample(batch_size, **kwargs)
