"""TorchRL bridge: an expstore store as a TorchRL ``Storage``, batches as ``TensorDict``.

>>> from expstore.integrations.torchrl import replay_buffer
>>> rb = replay_buffer("runs/pong.zarr", env=env, capacity=1_000_000, batch_size=256)
>>> rb.extend(collector_batch)        # [T] (one env) or [num_envs, T] batches
>>> td = rb.sample()                   # observation, action, next/{observation, reward, ...}

Pieces, for custom buffers: :class:`ExpstoreStorage` (rows of a store; TorchRL's default
``RandomSampler`` draws only rows that start a transition), :class:`ExpstoreWriter`
(collector batches -> store lanes), :class:`ExpstoreSampler` (expstore's uniform or
prioritized sampling; ``rb.update_priority(td["index"], td["td_error"])``), and
:func:`to_tensordict` for any expstore batch. Requires ``torchrl`` (and ``tensordict``).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data.replay_buffers import storages as _trl_storages
from torchrl.data.replay_buffers.samplers import Sampler as _TRLSampler
from torchrl.data.replay_buffers.writers import Writer as _TRLWriter

from ..api import open as open_store
from ..errors import ValidationError
from ..field import Field
from ..rows import FLAG_BAD, FLAG_LAST
from ..spec import Spec
from ..store import Store
from .step_writer import StepWriter, open_or_create
from .tensordict_batch import StepColumns, to_tensordict

__all__ = ["ExpstoreSampler", "ExpstoreStorage", "ExpstoreWriter", "replay_buffer",
           "spec_from_env", "to_tensordict"]


def spec_from_env(env: Any, extras: Mapping[str, Field] | None = None) -> Spec:
    """A spec from a TorchRL env's specs: every observation key, the action, a scalar reward.

    One observation key named ``observation`` gives a plain ``obs`` field; several keys
    give ``obs.<key>`` fields (TorchRL keys are kept as they are).
    """
    nb = len(env.batch_size)
    obs_spec = env.observation_spec
    keys = [k for k in obs_spec.keys(True, True) if isinstance(k, str)]
    if not keys:
        raise ValidationError("spec_from_env: the env has no (top-level) observation keys")

    def field(s: Any) -> Field:
        return Field(tuple(s.shape[nb:]), _np_dtype(s.dtype))

    obs = field(obs_spec["observation"]) if keys == ["observation"] else \
        {k: field(obs_spec[k]) for k in keys}
    return Spec.create(obs, field(env.action_spec), extras=extras)


def _np_dtype(dt: torch.dtype) -> np.dtype:
    return torch.empty((), dtype=dt).numpy().dtype


# -- storage ------------------------------------------------------------------------------
# TorchRL picks a replay buffer's default collate_fn by storage class; StoreStorage (an
# external key-value store, TorchRL >= 0.11) gets the identity, which is what batches
# returned whole by ``get`` need. Every method it defines is overridden below.
_TRLStorage = getattr(_trl_storages, "StoreStorage", _trl_storages.Storage)


class ExpstoreStorage(_TRLStorage):
    """A TorchRL ``Storage`` over an expstore store (a :class:`~expstore.Store`, or a URL).

    Indices are store rows. ``get(rows)`` returns the transitions starting there as a
    TensorDict (``n_step``/``gamma``: n-step returns). ``len()`` counts transitions (env
    steps) as TorchRL's own storages do: every step given to ``extend``/``add`` and still
    held, the one step the writer holds until its successor arrives included, the store's
    final rows (one per finished episode) not. TorchRL's
    ``RandomSampler`` works unchanged: its draw is redirected to rows that can start a
    transition. Writing goes through :class:`ExpstoreWriter` (rows are assigned by the
    store, one lane per env). A URL opens read-only unless ``writable=True`` (then the
    store is created if absent from ``spec``/``capacity``/``lanes``).
    """

    def __init__(self, store: Any, n_step: int = 1, gamma: float = 0.99, device: Any = None,
                 writable: bool = False, spec: Spec | None = None, capacity: int | None = None,
                 lanes: int = 1, **store_kwargs: Any) -> None:
        if not isinstance(store, Store):
            if writable:
                if spec is None or capacity is None:
                    try:
                        store = open_store(store, mode="r+", **store_kwargs)
                    except FileNotFoundError as e:
                        raise ValidationError(f"{os.fspath(store)}: no store here; pass "
                                              "spec= and capacity= to create one") from e
                else:
                    store = open_or_create(store, spec, capacity, lanes, **store_kwargs)
            else:
                store = open_store(store, mode="r", **store_kwargs)
        _trl_storages.Storage.__init__(self, max_size=store.capacity)
        self.store = store
        self.n_step = int(n_step)
        self.gamma = float(gamma)
        self.device = device
        self.writer = StepWriter(store, checked=True) if store.mode != "r" else None
        self._columns = StepColumns(store.spec)
        self._uniform: Any = None
        self._planned: Any = None  # see _plan
        self._transitions = _TransitionCount(store.index)

    # reading
    def get(self, index: Any) -> TensorDict:
        if self.writer is not None:  # shards written behind extend count as committed now
            self.store._poll_writes(raise_errors=False)  # (TorchRL holds its write lock)
        rows = _rows(index)
        plan, self._planned = self._planned, None
        if plan is not None and rows.ndim == 1 and np.array_equal(rows, plan.rows):
            batch = self.store.read_plan(plan)  # the rows a sampler just drew and planned
        else:
            batch = self.store.transitions(np.atleast_1d(rows), self.n_step, self.gamma)
        td = to_tensordict(batch, self.device, weights=False)
        return td[0] if np.ndim(rows) == 0 else td

    def _plan(self, sampler: Any, batch_size: int) -> Any:
        """``sampler``'s plan of ``batch_size`` transitions, kept for the ``get`` of its rows
        that TorchRL makes next (it reads the plan instead of checking and planning the
        rows again)."""
        self._planned = plan = sampler.plan(batch_size)
        return plan

    def __len__(self) -> int:
        """Transitions held (see the class doc); O(lanes + rows written since the last
        call): TorchRL asks before every sample."""
        held = 0 if self.writer is None else sum(
            len(h["reward"]) for h in self.writer.held if h is not None)
        return self._transitions() + held

    def _rand_given_ndim(self, batch_size: int) -> torch.Tensor:
        """Uniform rows that can start an ``n_step`` transition (used by RandomSampler)."""
        from ..sampling.uniform import UniformSampler

        if self._uniform is None:
            seed = None if self._rng is None else int(
                torch.randint(2**31 - 1, (), generator=self._rng))
            self._uniform = UniformSampler(self.store, n_step=self.n_step, gamma=self.gamma,
                                           seed=seed)
        return torch.from_numpy(self._plan(self._uniform, batch_size).rows)

    def contains(self, item: Any) -> Any:
        rows = np.atleast_1d(_rows(item))
        ok = self.store.index.valid(rows, self.store.history, self.n_step)
        return torch.as_tensor(ok if np.ndim(item) else ok[0])

    # writing
    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        raise NotImplementedError("ExpstoreStorage: the store assigns rows itself; write "
                                  "through ExpstoreWriter (replay_buffer(...) sets it up)")

    def write(self, data: TensorDictBase) -> None:
        """Store collector steps: batch ``[T]`` (one lane) or ``[lanes, T]``. Every value
        is checked (for every lane) before any is stored."""
        if self.writer is None:
            raise ValidationError(f"{self.store.url}: opened read-only; pass writable=True")
        lanes = self.store.lanes
        if data.ndim == 1 and lanes != 1:
            raise ValidationError(f"a [T] batch needs a 1-lane store; this one has "
                                  f"{lanes} lanes (pass [lanes, T] batches)")
        if data.ndim not in (1, 2) or (data.ndim == 2 and data.shape[0] != lanes):
            raise ValidationError(f"expected a [T] or [{lanes}, T] batch, got "
                                  f"shape {tuple(data.shape)}")
        lead = tuple(data.shape)
        if lead[-1] == 0:
            return
        steps = self._columns(data, lead)
        if data.ndim == 1:
            self.writer.extend(0, steps)
            return
        for lane in range(lanes):
            self.writer.extend(lane, {k: v[lane] for k, v in steps.items()})

    def flush(self) -> None:
        self.store.flush()

    def close(self) -> None:
        """Write held steps (open episodes end truncated) and close the store."""
        if self.writer is not None:
            self.writer.end()
        self.store.close()

    # bookkeeping TorchRL asks for
    def state_dict(self) -> dict[str, Any]:
        return {"url": self.store.url, "n_step": self.n_step, "gamma": self.gamma}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.n_step = int(state_dict.get("n_step", self.n_step))
        self.gamma = float(state_dict.get("gamma", self.gamma))

    def _empty(self) -> None:
        raise NotImplementedError("ExpstoreStorage: emptying a store is not supported; "
                                  "create a new one (expstore.create(..., overwrite=True))")

    def dumps(self, path: Any) -> None:
        self.store.flush()

    def loads(self, path: Any) -> None:
        self.store.refresh()

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("ExpstoreStorage does not pickle; open the store from its url "
                        f"({self.store.url}) in the other process")

    def __setstate__(self, state: dict[str, Any]) -> None:
        raise TypeError("ExpstoreStorage does not unpickle")

    def __repr__(self) -> str:
        return f"ExpstoreStorage({self.store!r}, n_step={self.n_step})"


class _TransitionCount:
    """Intact rows of a row index that are not final rows (env steps held). A lane is
    counted again only when its window of steps moved (one pass over its flags: ~0.15 ms
    per million rows), or after rows were reported dropped (lost, quarantined)."""

    def __init__(self, index: Any) -> None:
        self.index = index
        self.lo = np.full(index.lanes, -1, np.int64)
        self.hi = np.full(index.lanes, -1, np.int64)
        self.n = np.zeros(index.lanes, np.int64)
        self.stale = True
        ref = weakref.ref(self)

        def listener(kind: str, rows: np.ndarray) -> None:
            me = ref()
            if me is None:
                index.unsubscribe(listener)
            elif kind == "dropped":
                me.stale = True

        index.subscribe(listener)

    def _count(self, lane: int, a: int, b: int) -> int:
        """Steps among lane steps ``[a, b)`` (at most one lap), by ring slices."""
        if b <= a:
            return 0
        L = self.index.lane_capacity
        base, s, e = lane * L, a % L, (b - 1) % L + 1
        fl = self.index.flags
        parts = [fl[base + s : base + e]] if s < e else [fl[base + s : base + L],
                                                          fl[base : base + e]]
        other = sum(int(np.count_nonzero(p & (FLAG_LAST | FLAG_BAD))) for p in parts)
        return b - a - other

    def __call__(self) -> int:
        idx = self.index
        lo_all, hi_all = idx.lower_bound(), idx.count
        stale, self.stale = self.stale, False
        for lane in range(idx.lanes):
            lo, hi = int(lo_all[lane]), int(hi_all[lane])
            if stale or lo != self.lo[lane] or hi != self.hi[lane]:
                self.n[lane] = self._count(lane, lo, hi)
                self.lo[lane], self.hi[lane] = lo, hi
        return int(self.n.sum())


def _rows(index: Any) -> Any:
    if isinstance(index, torch.Tensor):
        return np.asarray(index.detach().cpu().numpy(), np.int64)
    if isinstance(index, (int, np.integer)):
        return np.int64(index)
    return np.asarray(index, np.int64)


# -- writer -------------------------------------------------------------------------------
class ExpstoreWriter(_TRLWriter):
    """Sends ``rb.extend``/``rb.add`` data to :meth:`ExpstoreStorage.write`; returns index -1
    (rows are assigned by the store, and a step is written once its successor arrives)."""

    def add(self, data: Any) -> torch.Tensor:
        self._storage.write(data.unsqueeze(0))
        return torch.tensor(-1)

    def extend(self, data: Any) -> torch.Tensor:
        self._storage.write(data)
        return torch.full(tuple(data.shape), -1, dtype=torch.long)

    def _empty(self, empty_write_count: bool = True) -> None:
        self._storage._empty()

    def dumps(self, path: Any) -> None:
        self._storage.flush()

    def loads(self, path: Any) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


# -- sampler ------------------------------------------------------------------------------
class ExpstoreSampler(_TRLSampler):
    """TorchRL sampler running expstore's sampling on an :class:`ExpstoreStorage`.

    ``prioritized=True``: proportional PER (``alpha``, ``beta``, ``eps``, ``beta_final``,
    ``beta_steps`` as for :class:`~expstore.PrioritizedSampler`); the batch's
    ``priority_weight`` holds the importance weights, and
    ``rb.update_priority(td["index"], td["td_error"])`` feeds priorities back. Other
    keyword arguments go to the expstore sampler (``cer``, ``seed``...).
    """

    def __init__(self, prioritized: bool = False, **kwargs: Any) -> None:
        self.prioritized = prioritized
        self.kwargs = kwargs
        self.sampler: Any = None

    def _make(self, storage: ExpstoreStorage) -> Any:
        if not isinstance(storage, ExpstoreStorage):
            raise TypeError(f"ExpstoreSampler needs an ExpstoreStorage, got "
                            f"{type(storage).__name__}")
        if self.sampler is None or self.sampler.store is not storage.store:
            from ..sampling.prioritized import PrioritizedSampler
            from ..sampling.uniform import UniformSampler

            cls = PrioritizedSampler if self.prioritized else UniformSampler
            self.sampler = cls(storage.store, n_step=storage.n_step, gamma=storage.gamma,
                               **self.kwargs)
        return self.sampler

    def sample(self, storage: Any, batch_size: int) -> tuple[torch.Tensor, dict]:
        plan = storage._plan(self._make(storage), batch_size)
        return torch.from_numpy(plan.rows), {"priority_weight": torch.from_numpy(plan.weight)}

    def _sampleable_count(self, storage: Any, batch_size: int) -> int:
        return len(storage)

    def update_priority(self, index: Any, priority: Any, *,
                        storage: Any = None) -> None:
        if self.sampler is not None and getattr(self.sampler, "prioritized", False):
            self.sampler.update_priorities(_rows(index), _rows_f(priority))

    @property
    def default_priority(self) -> float:
        return 1.0

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass

    def _empty(self) -> None:
        pass

    def dumps(self, path: Any) -> None:
        if self.sampler is not None and hasattr(self.sampler, "save_priorities"):
            self.sampler.save_priorities()

    def loads(self, path: Any) -> None:
        pass


def _rows_f(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy().reshape(-1)
    return np.asarray(x, np.float32).reshape(-1)


def replay_buffer(store: Any, env: Any = None, capacity: int | None = None,
                  batch_size: int | None = None, prioritized: bool = False,
                  n_step: int = 1, gamma: float = 0.99, spec: Spec | None = None,
                  lanes: int | None = None, device: Any = None, shard_rows: int | None = None,
                  fsync: bool = True, **sampler_kwargs: Any) -> Any:
    """A ``TensorDictReplayBuffer`` on an expstore store, writable and sampleable.

    ``store``: a :class:`~expstore.Store` or URL; created if absent from ``spec`` (or
    ``spec_from_env(env)``) with ``capacity`` rows and ``lanes`` (default: the env's batch
    size, one lane per env), ``shard_rows`` per shard (default: at least 8 per lane, of at
    most 1024 rows for frames and 4096 for small rows; see
    :func:`~expstore.integrations.step_writer.default_shard_rows`). ``fsync=False``: shards and
    lane states are not synced to disk (about 9 syncs per full shard, written behind
    ``extend``: with small rows they bound how many steps per second the store takes;
    a process crash loses nothing, a power loss may). ``prioritized``/``sampler_kwargs``:
    see :class:`ExpstoreSampler`.
    """
    from torchrl.data import TensorDictReplayBuffer

    if spec is None and env is not None:
        spec = spec_from_env(env)
    if lanes is None:
        lanes = int(np.prod(tuple(env.batch_size))) if env is not None and \
            len(env.batch_size) else 1
    options: dict[str, Any] = {"fsync": fsync}
    if shard_rows is not None and spec is not None and capacity is not None:
        options["shard_rows"] = shard_rows  # (a new store's layout)
    storage = ExpstoreStorage(store, n_step=n_step, gamma=gamma, device=device, writable=True,
                              spec=spec, capacity=capacity, lanes=lanes, **options)
    return TensorDictReplayBuffer(storage=storage, writer=ExpstoreWriter(),
                                  sampler=ExpstoreSampler(prioritized, **sampler_kwargs),
                                  batch_size=batch_size, collate_fn=_identity)


def _identity(x: Any) -> Any:
    return x
