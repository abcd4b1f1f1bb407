"""Opening, flushing, closing, resetting and pickling an SB3 buffer's store.

Mixed into :class:`~expstore.integrations.sb3.ExpstoreReplayBuffer`; it uses the buffer's
``spec``, ``n_envs``, ``buffer_size``, its RAM rings (``_mirror``, ``_ram``), its
``_lock`` and its sampler factory.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import SpecError, ValidationError
from ...store import Store
from ..step_writer import StepWriter, open_or_create
from .mirror import RamMirror
from .sync import StoreSync


class StoreLifecycle:
    """The store behind a buffer: opened on first use, written by a :class:`StoreSync`
    thread, closed, recreated by ``reset()``, written out before pickling."""

    # -- store lifecycle -------------------------------------------------------------------
    # The store opens on first use, not here: SB3's ``load()`` rebuilds the buffer from the
    # saved kwargs, and a model loaded only to act must not take the store's write lease.
    @property
    def store(self) -> Any:
        """The :class:`~expstore.Store` (opened for writing on first use). With a mirror,
        steps reach it in chunks: call :meth:`flush` first to see all of them."""
        if self._store is None:
            self._open()
        return self._store

    @property
    def writer(self) -> StepWriter:
        self.store  # noqa: B018  (opens)
        return self._writer

    @property
    def sampler(self) -> Any:
        self.store  # noqa: B018  (opens)
        return self._sampler

    def _store_exists(self, url: Any) -> bool:
        if isinstance(url, Store):
            return True
        from ...storage.backends import backend_for
        from ...storage.format import read_layout

        try:
            read_layout(backend_for(os.fspath(url), self._options["storage_options"]))
        except FileNotFoundError:
            return False
        return True

    def _check_existing(self, url: Any) -> None:
        """Fail now, naming the differences, if a store at ``url`` cannot serve this buffer."""
        from ...storage.backends import backend_for
        from ...storage.format import read_layout

        try:
            layout = read_layout(backend_for(os.fspath(url), self._options["storage_options"]))
        except FileNotFoundError:
            return
        if not layout.spec.same_as(self.spec):
            raise SpecError(f"{url}: store spec differs from the one these spaces need: "
                            + "; ".join(layout.spec.diff(self.spec)))
        if layout.lanes != self.n_envs:
            raise SpecError(f"{url}: store has {layout.lanes} lane(s) but n_envs="
                            f"{self.n_envs} (one lane per env); use another url or "
                            "overwrite=True")

    def _open(self) -> None:
        url = self._url_arg
        if url is None:
            self._tmpdir = tempfile.mkdtemp(prefix="expstore-sb3-")
            url = self._url_arg = self.url = str(Path(self._tmpdir) / "replay.zarr")
        self._store = open_or_create(url, self.spec, **self._options)
        self._writer = StepWriter(self._store)
        if self._ram is not None:
            self._sync = StoreSync(self._writer, self.n_envs, self._ram.window,
                                   written=self._submitted, lock=self._lock)
        self._finalizer = weakref.finalize(self, _close, self._writer, self._store,
                                           self._tmpdir, self._sync)
        self._sampler = None
        if self._mirror is None:  # with a mirror, np.random stays untouched (SB3's batches)
            seed = self._seed if self._seed is not None else int(np.random.randint(2**31 - 1))
            self._sampler = self._make_sampler(seed)
            self._deal_rng = np.random.default_rng(seed + 1)

    def _overwrite_now(self) -> None:
        """Replace the store at ``url`` with an empty one now (``overwrite=True``,
        :meth:`reset`). The only place a buffer wipes its store: no flag is left to be
        replayed by a later open, a pickle, a copy or SB3's ``load()``."""
        open_or_create(self._url_arg, self.spec, overwrite=True, **self._options).close()

    def _make_sampler(self, seed: int) -> Any:
        from ...sampling.uniform import UniformSampler

        return UniformSampler(self.store, n_step=self.n_steps, gamma=self.gamma, seed=seed)

    def _fill_mirror(self) -> None:
        """Load the newest transitions of the store at ``url`` into the mirror (the same
        number from every lane, at most ``buffer_size``), read through a read-only handle:
        a buffer built by SB3's ``load()`` takes no write lease until it is used."""
        if self._store is None and not isinstance(self._url_arg, Store):
            from ...api import open as open_store

            reader = open_store(self._url_arg, storage_options=self._options["storage_options"])
            try:
                self._fill_mirror_from(reader)
            finally:
                reader.close()
        else:
            self._fill_mirror_from(self.store)

    def _fill_mirror_from(self, store: Any) -> None:
        m = self._mirror
        assert m is not None
        idx = store.index
        per_lane = []
        for lane in range(store.lanes):
            lo, hi = int(idx.lower_bound()[lane]), int(idx.count[lane])
            rows = idx.lane_rows(lane, np.arange(lo, hi))
            per_lane.append(rows[idx.valid(rows, store.history, 1)])
        k = min(min(len(r) for r in per_lane), self.buffer_size)
        if k == 0:
            return
        got = [store.transitions(r[len(r) - k:]) for r in per_lane]
        for t in range(k):
            step = {}
            names = [*m.arrays, *m.rings, *("next_" + r for r in m.rings)]
            for name in names:
                key = "next_obs" + name[8:] if name.startswith("next_") else name
                if key not in got[0]:
                    continue
                step[name] = np.stack([g[key][t] for g in got])
            m.put(step)
        self._submitted = m.adds  # already in the store
        if self._sync is not None:
            self._sync.written = m.adds
        self.pos, self.full = m.pos, m.full

    def _submit(self) -> None:
        """Hand the steps added since the last chunk to the background writer."""
        m = self._ram
        assert m is not None
        if m.adds > self._submitted:
            self.store  # noqa: B018  (opens; starts the writer thread)
            assert self._sync is not None
            self._sync.submit(max(self._submitted, m.adds - m.size), m.adds)
            self._submitted = m.adds

    def _make_room(self) -> None:
        """Before an add overwrites the oldest step: wait until the store has it."""
        m = self._ram
        assert m is not None
        oldest = m.adds - m.size  # the step the next add overwrites
        if self._submitted <= oldest:
            self._submit()
        assert self._sync is not None
        self._room = self._sync.wait_written(oldest + 1) + m.size

    def flush(self) -> None:
        """Commit written rows to storage (the newest step per env stays held)."""
        if self._ram is not None and self._ram.adds > self._submitted:
            self._submit()
        if self._store is not None:
            if self._sync is not None:
                self._sync.wait()
            with self._lock:
                self._store.flush()

    def close(self) -> None:
        """Write held steps (unfinished episodes end truncated), flush, release the store
        (and its write lease). Using the buffer again reopens it."""
        if self._ram is not None and self._ram.adds > self._submitted:
            self._submit()
        self._stop_prefetch()
        if self._store is not None:
            self._finalizer()
            self._store, self._sync = None, None

    def _stop_prefetch(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

    def reset(self) -> None:
        """Empty the buffer: the store at ``url`` is replaced by an empty one, now."""
        self._stop_prefetch()
        if self._store is not None:
            self._finalizer.detach()
            if self._sync is not None:
                self._sync.stop()
            if getattr(self._sampler, "close", None):
                self._sampler.close()
            _close(None, self._store, None, None)
            self._store, self._sync = None, None
        if self._mirror is not None:
            per = getattr(self._mirror, "tree", None) is not None
            self._mirror = self._ram = RamMirror(self.spec, self.buffer_size, self.n_envs)
            if per:
                self._enable_priorities()
        elif self._ram is not None:
            self._ram = self._make_staging()
        self._bind_mirror()
        self._submitted = 0
        self._room = self._ram.size if self._ram is not None else 0
        self.pos, self.full = 0, False
        if self._url_arg is not None and not isinstance(self._url_arg, Store):
            self._overwrite_now()


    # -- pickling and copies ---------------------------------------------------------------
    _TRANSIENT = ("_store", "_writer", "_sampler", "_finalizer", "_sync", "last_batch",
                  "_prefetcher", "_lock", "_deal_rng",
                  "_mirror_arrays", "_ring", "_a_terminated", "_a_truncated", "dones")

    def __getstate__(self) -> dict[str, Any]:
        """Pickle (``save_replay_buffer``). Every added step is written to the store first
        and flushed (held steps end truncated). The pickle carries the url and, with a RAM
        mirror, the mirror itself; a buffer on a temporary store (``url=None``) needs the
        mirror, because its store goes with it."""
        self._stop_prefetch()
        if self._store is not None or (self._ram is not None
                                       and self._ram.adds > self._submitted):
            self.flush()
            self._writer.end()
            self._store.flush()
        if self._tmpdir is not None and self._mirror is None:
            raise ValidationError(
                "cannot pickle a buffer on a temporary store (url=None) without a RAM "
                "mirror: the store is removed with the buffer; give url= a lasting path")
        state = {k: v for k, v in self.__dict__.items() if k not in self._TRANSIENT}
        state["_url_arg"] = self.url
        if self._mirror is None and self._ram is not None:  # all in the store: a new one
            state["_ram"], state["_submitted"], state["_room"] = "staging", 0, 0
        state["_owned"] = self._tmpdir is not None or self.url is None
        state["_tmpdir"] = None  # a temporary store stays owned by the buffer that made it
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        owned = state.pop("_owned", False)
        # pickles made before overwrite became a one-off carry the flag: never replayed
        state.pop("_overwrite", None)
        self.__dict__.update(state)
        self._store, self._sync, self.last_batch = None, None, None
        self._prefetcher, self._lock = None, threading.Lock()
        if isinstance(self._ram, str):
            self._ram = self._make_staging()
            self._room = self._ram.size
        self._bind_mirror()
        if owned:  # a fresh temporary store, written from the mirror
            self._url_arg = self.url = None
            self._submitted = max(0, self._mirror.adds - self._mirror.size)
            self._room = self._submitted + self._mirror.size
        elif not self._store_exists(self._url_arg):
            raise FileNotFoundError(
                f"{self._url_arg}: the replay buffer's store is missing (moved or deleted "
                f"since the buffer was saved); put it back at that path, or build a new "
                f"buffer on the store's new url")

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        """A copy writes its own temporary store (from the mirror); two buffers never write
        one store. Without a mirror there is nothing in RAM to copy from: refused."""
        if self._mirror is None:
            raise TypeError("cannot copy an ExpstoreReplayBuffer that samples from its store "
                            "(mirror=False): two buffers would write one store; build a "
                            "second buffer on another url")
        import copy

        state = {k: v for k, v in self.__dict__.items() if k not in self._TRANSIENT}
        new = self.__class__.__new__(self.__class__)
        new.__dict__.update(copy.deepcopy(state, memo))
        new.__setstate__({**new.__dict__, "_owned": True, "_tmpdir": None})
        return new


def sb3_loading() -> bool:
    """Whether SB3's ``BaseAlgorithm.load`` is running in this thread (it rebuilds the
    replay buffer from the kwargs saved with the model, ``overwrite`` included)."""
    from stable_baselines3.common.base_class import BaseAlgorithm

    load = BaseAlgorithm.load.__func__.__code__  # type: ignore[attr-defined]
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is load:
            return True
        frame = frame.f_back
    return False


def _close(writer: StepWriter | None, store: Any, tmpdir: str | None,
           sync: StoreSync | None) -> None:
    try:
        if sync is not None:
            sync.stop()
        if writer is not None and tmpdir is None:
            writer.end()
    finally:
        store.close()
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
