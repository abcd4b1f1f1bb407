"""The store: a thin face over storage (shards, state), the row index, and reading.

``create``/``open`` give a :class:`Store`. Writes go to one :class:`LaneWriter` per lane the
store may write; the :class:`RowIndex` learns every row as it is staged, so the writing
process can sample rows not yet flushed (read from the staging buffer). Other processes
see rows once flushed and call :meth:`Store.refresh`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .errors import ReadOnlyError, SpecError, StoreCorruptError, ValidationError
from .index.rows import RowIndex
from .loading.assemble import assemble
from .sampling.plan import make_plan
from .spec import BUILTIN, Spec
from .storage.backend import Backend, backend_for
from .storage.layout import (
    FLAG_FIRST,
    FLAG_LAST,
    FLAG_TERMINATED,
    FLAG_TRUNCATED,
    Layout,
    auto_shard_rows,
    read_layout,
    round_capacity,
    write_metadata,
)
from .storage.reader import ShardReader
from .storage.state import LaneState, read_state, write_state
from .storage.writer import LaneWriter
from .validate import coerce


def create(url: str | os.PathLike, spec: Spec, capacity: int, lanes: int = 1,
           shard_rows: int | None = None, overwrite: bool = False,
           storage_options: dict[str, Any] | None = None, fsync: bool = True) -> Store:
    """Create a store of ``capacity`` rows (split into ``lanes`` rings) at a path or URL.

    ``capacity`` is rounded up to a whole number of shards per lane (``store.capacity`` says
    what was made); ``shard_rows`` defaults to ``auto_shard_rows`` (64..4096). ``fsync``:
    flushes survive power loss, not only process crashes (costs ~4 ms per object written).
    Fails if a store exists there unless ``overwrite=True``.
    """
    url = os.fspath(url)
    shard_rows = int(shard_rows or auto_shard_rows(int(capacity), int(lanes)))
    capacity = round_capacity(int(capacity), int(lanes), shard_rows)
    layout = Layout(spec, capacity, int(lanes), shard_rows)
    backend = backend_for(url, storage_options, fsync)
    if backend.get("zarr.json") is not None and not overwrite:
        raise FileExistsError(f"{url}: a store exists here (pass overwrite=True to replace it)")
    write_metadata(url, layout, storage_options, overwrite=True)
    for lane in range(layout.lanes):
        write_state(backend, LaneState(lane))
    return Store(backend, layout, mode="r+", storage_options=storage_options)


def open(url: str | os.PathLike, mode: str = "r", spec: Spec | None = None,  # noqa: A001
         lane: int | None = None, storage_options: dict[str, Any] | None = None,
         fsync: bool = True) -> Store:
    """Open a store. ``mode="r"`` reads; ``"r+"`` also writes (all lanes, or ``lane``).

    Passing ``spec`` checks it against the stored one and fails naming the differences.
    """
    if mode not in ("r", "r+"):
        raise ValueError(f"mode: expected 'r' or 'r+', got {mode!r}")
    url = os.fspath(url)
    backend = backend_for(url, storage_options, fsync)
    layout = read_layout(backend)
    if spec is not None and not layout.spec.same_as(spec):
        raise SpecError(f"{url}: store spec differs from the given spec: "
                        + "; ".join(layout.spec.diff(spec)))
    return Store(backend, layout, mode=mode, lane=lane, storage_options=storage_options)


class Store:
    """A disk-backed ring of transitions. See :func:`create` and :func:`open`."""

    def __init__(self, backend: Backend, layout: Layout, mode: str = "r",
                 lane: int | None = None, storage_options: dict[str, Any] | None = None):
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
        self._episode_step = np.zeros(layout.lanes, np.int64)
        states = [read_state(backend, i) for i in range(layout.lanes)]
        self._load_index(states)
        for i in self.write_lanes:
            self.writers[i] = self._resume_writer(states[i])

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
        """Rows currently held (intact), all lanes; final rows of episodes included."""
        return int((self.index.count - self.index.valid_from).sum())

    @property
    def episodes(self) -> int:
        """Finished episodes written so far (including ones since overwritten)."""
        return int(sum(self._lane_episodes(i) for i in range(self.lanes)))

    def _lane_episodes(self, lane: int) -> int:
        if lane in self.writers:
            return self.writers[lane].episodes
        return self._states[lane].episodes

    def __repr__(self) -> str:
        return (f"Store({self.url!r}, rows={len(self)}, capacity={self.capacity}, "
                f"lanes={self.lanes}, mode={self.mode!r})")

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- opening -------------------------------------------------------------------------
    @property
    def reader(self) -> ShardReader:
        """This process's reader (a forked child gets its own)."""
        if self._reader is None or self._reader_pid != os.getpid():
            self._reader = ShardReader(self.backend, self.layout)
            self._reader_pid = os.getpid()
        return self._reader

    def _load_index(self, states: list[LaneState]) -> None:
        self._states = states
        for st in states:
            self._load_lane(st)

    def _load_lane(self, st: LaneState) -> None:
        """Bring the index of one lane up to a committed state (reads metadata shards)."""
        idx = self.index
        lane = st.lane
        old_count = int(idx.count[lane])
        idx.set_valid_from(lane, st.valid_from)
        start = max(old_count, st.valid_from)
        if st.count <= start:
            return
        steps = np.arange(start, st.count)
        rows = idx.lane_rows(lane, steps)
        ep = np.empty(len(rows), np.int32)
        fl = np.empty(len(rows), np.uint8)
        ok1 = self.reader.read("_episode_step", rows, steps, ep)
        ok2 = self.reader.read("_flags", rows, steps, fl)
        if not (ok1.all() and ok2.all()):
            bad = int(rows[~(ok1 & ok2)][0])
            raise StoreCorruptError(
                f"{self.url}/{self.layout.shard_key('_flags', bad // self.layout.shard_rows)}: "
                f"lane {lane} state covers steps up to {st.count} but a shard does not hold "
                f"step {int(steps[~(ok1 & ok2)][0])}")
        idx.put(lane, start, ep, fl)

    def _resume_writer(self, st: LaneState) -> LaneWriter:
        w = LaneWriter(self.backend, self.layout, LaneState(**vars(st)),
                       on_shard_written=self._forget_shard)
        if w.n:  # a partly written shard: restore its rows into the staging buffer
            steps = np.arange(w.first_step, w.count)
            rows = self.index.lane_rows(st.lane, steps)
            data = {}
            for name, f in self.layout.fields.items():
                buf = np.empty((len(rows), *f.shape), f.dtype)
                if not self.reader.read(name, rows, steps, buf).all():
                    key = self.layout.shard_key(name, w.shard_index(w.first_step))
                    raise StoreCorruptError(f"{self.url}/{key}: partial shard does not hold "
                                            "its committed rows")
                data[name] = buf
            w.load_partial(data)
        return w

    def _forget_shard(self, shard: int) -> None:
        if self._reader is not None and self._reader_pid == os.getpid():
            self._reader.forget(shard)

    def refresh(self) -> None:
        """Re-read lane state files and index rows other processes committed since."""
        for lane in range(self.lanes):
            if lane in self.writers:
                continue
            st = read_state(self.backend, lane)
            self._states[lane] = st
            self._load_lane(st)

    # -- writing -------------------------------------------------------------------------
    def _writer(self, lane: int) -> LaneWriter:
        if self.mode == "r":
            raise ReadOnlyError(f"{self.url}: store opened read-only (mode='r')")
        if lane not in self.writers:
            raise ReadOnlyError(f"{self.url}: lane {lane} is not open for writing here "
                                f"(writable lanes: {self.write_lanes})")
        return self.writers[lane]

    def add(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any,
            truncated: Any, lane: int | None = None, **extras: Any) -> None:
        """Store one env step (Gymnasium's ``obs, action, reward, next_obs, term, trunc``).

        With ``lanes > 1`` and ``lane=None`` every value has a leading ``num_envs == lanes``
        axis and one step goes into each lane. ``next_obs`` is stored only when the episode
        ends (as the episode's final row); otherwise it is the next step's ``obs``.
        """
        if lane is None and self.lanes > 1:
            batch = self._validate(obs, action, reward, next_obs, terminated, truncated,
                                   extras, (self.lanes,))
            for i in range(self.lanes):
                self._writer(i)
            for i in range(self.lanes):
                self._append(i, {k: v[i : i + 1] for k, v in batch.items()})
            return
        lane = 0 if lane is None else lane
        self._writer(lane)
        batch = self._validate(obs, action, reward, next_obs, terminated, truncated, extras, ())
        self._append(lane, {k: v[None] for k, v in batch.items()})

    def extend(self, batch: Mapping[str, Any], lane: int = 0) -> None:
        """Store ``T`` consecutive steps of one lane: every value has leading axis ``T``.

        Keys: ``obs, action, reward, terminated, truncated`` (+ user fields) and
        ``next_obs``, which may be omitted when no step in the batch ends an episode.
        ``next_<user field>`` (optional) gives a user field's value for the final rows of
        episodes ending in the batch (else they hold zeros).
        """
        self._writer(lane)
        b = dict(batch)
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
        vals = self._validate(b["obs"], b["action"], b["reward"], b.get("next_obs"),
                              b["terminated"], b["truncated"], extras, (T,))
        self._append(lane, vals)

    def _validate(self, obs, action, reward, next_obs, terminated, truncated, extras,
                  lead: tuple[int, ...]) -> dict[str, np.ndarray]:
        """All values cast and checked; raises before anything is stored."""
        spec = self.spec
        nonfinite = spec.reject_nonfinite
        out: dict[str, np.ndarray] = {}
        given = {**spec.flatten("obs", obs), **spec.flatten("action", action),
                 "reward": reward, "terminated": terminated, "truncated": truncated}
        # ``next_<user field>``: the field's value at the next row, kept for final rows
        nxt = {k: v for k, v in extras.items() if k not in spec.fields
               and k.startswith("next_") and k[5:] in spec.fields and k[5:] not in BUILTIN
               and k[5:] not in spec.obs_names and k[5:] not in spec.action_names}
        extras = {k: v for k, v in extras.items() if k not in nxt}
        unknown = [k for k in extras if k not in spec.fields]
        if unknown:
            raise ValidationError(f"unknown field(s) {unknown}; the spec has "
                                  f"{list(spec.fields)}")
        given.update(extras)
        for name, f in spec.fields.items():
            out[name] = coerce(name, f, given.get(name), lead, nonfinite)
        for k, v in nxt.items():
            out[k] = coerce(k, spec.fields[k[5:]], v, lead, nonfinite)
        done = out["terminated"] | out["truncated"]
        if np.any(done):
            if next_obs is None:
                raise ValidationError("next_obs: required for steps that end an episode "
                                      "(terminated or truncated)")
            for name, v in spec.flatten("obs", next_obs).items():
                out["next_" + name] = coerce("next_" + name, spec.fields[name], v, lead,
                                             nonfinite)
        return out

    def _append(self, lane: int, vals: dict[str, np.ndarray]) -> None:
        """Turn validated steps into rows (+ a final row per finished episode)."""
        w = self.writers[lane]
        T = len(vals["reward"])
        done = vals["terminated"] | vals["truncated"]
        n_final = int(done.sum())
        # row position of each step: steps shift by one for each final row before them
        step_pos = np.arange(T) + np.concatenate([[0], np.cumsum(done)[:-1]])
        final_pos = step_pos[done] + 1
        n_rows = T + n_final
        rows: dict[str, np.ndarray] = {}
        for name, f in self.layout.fields.items():
            if name.startswith("_"):
                continue
            arr = np.zeros((n_rows, *f.shape), f.dtype)
            arr[step_pos] = vals[name]
            if n_final and "next_" + name in vals:  # obs; user fields when given
                arr[final_pos] = vals["next_" + name][done]
            rows[name] = arr
        flags = np.zeros(n_rows, np.uint8)
        flags[step_pos] |= np.where(vals["terminated"], FLAG_TERMINATED, 0).astype(np.uint8)
        flags[step_pos] |= np.where(vals["truncated"], FLAG_TRUNCATED, 0).astype(np.uint8)
        flags[final_pos] = FLAG_LAST
        # episode positions: count up from the lane's open episode, restart after final rows
        idx = np.arange(n_rows, dtype=np.int64)
        prev_final = np.maximum.accumulate(np.where(flags & FLAG_LAST, idx, -1))
        prev_final = np.concatenate([[-1], prev_final[:-1]])
        ep = idx - (prev_final + 1) + np.where(prev_final < 0, self._episode_step[lane], 0)
        flags[ep == 0] |= FLAG_FIRST
        rows["_episode_step"] = ep.astype(np.int32)
        rows["_flags"] = flags
        rows["_step_id"] = np.arange(w.count, w.count + n_rows, dtype=np.int64)
        start, m = w.append(rows)
        w.episodes += n_final
        self._episode_step[lane] = 0 if flags[-1] & FLAG_LAST else int(ep[-1]) + 1
        self.index.set_valid_from(lane, w.valid_from)
        self.index.put(lane, start, rows["_episode_step"], flags, committed=False)
        self.index.committed[lane] = w.committed.count

    def flush(self) -> None:
        """Commit every staged row of the lanes this store writes (data, then state),
        then run the flush hooks (samplers persisting their priorities)."""
        for lane, w in self.writers.items():
            w.flush()
            self.index.committed[lane] = w.committed.count
        for fn in list(self._flush_hooks):
            fn()

    def add_flush_hook(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` at the end of every :meth:`flush` (and so on :meth:`close`)."""
        self._flush_hooks.append(fn)

    def remove_flush_hook(self, fn: Callable[[], None]) -> None:
        if fn in self._flush_hooks:
            self._flush_hooks.remove(fn)

    def close(self) -> None:
        """Flush (when writable) and release file handles."""
        if self.mode != "r":
            self.flush()
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
        f = self.layout.fields[name]
        out = np.empty((len(rows), *f.shape), f.dtype) if out is None else out
        ok = self._source.read(name, rows, steps, out)
        if not ok.all():
            raise KeyError(f"{name}: rows {rows[~ok][:8].tolist()} are not held "
                           "(never written or overwritten)")
        return out

    @property
    def _source(self) -> _StoreSource:
        return _StoreSource(self)

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
        plan = make_plan(self.index, rows, weight, self.history, n_step, gamma)
        batch, _ = assemble(plan, self.layout, self._source)
        return batch

    def sample(self, batch_size: int, rng: np.random.Generator | None = None,
               **kwargs: Any) -> dict[str, np.ndarray]:
        """``batch_size`` uniform transitions (dict of numpy arrays, incl. index, weight)."""
        from .sampling.uniform import UniformSampler

        if self._sampler is None:
            self._sampler = UniformSampler(self)
        if rng is not None:
            self._sampler.rng = rng
        return self._sampler.sample(batch_size, **kwargs)


class _StoreSource:
    """Rows for this process: staged rows from the writers, the rest from shards."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def read(self, name: str, rows: np.ndarray, steps: np.ndarray,
             out: np.ndarray) -> np.ndarray:
        st = self.store
        if not st.writers:
            return st.reader.read(name, rows, steps, out)
        L = st.layout.lane_capacity
        lane = rows // L
        ok = np.zeros(len(rows), bool)
        staged = np.zeros(len(rows), bool)
        for i, w in st.writers.items():
            sel = (lane == i) & (steps >= w.committed.count) & (steps >= w.first_step)
            sel &= steps < w.count
            if sel.any():
                out[sel] = w.staged(name, steps[sel])
                ok[sel] = True
                staged |= sel
        rest = np.flatnonzero(~staged)
        if len(rest):
            buf = np.empty((len(rest), *out.shape[1:]), out.dtype)
            ok[rest] = st.reader.read(name, rows[rest], steps[rest], buf)
            out[rest] = buf
        return ok
