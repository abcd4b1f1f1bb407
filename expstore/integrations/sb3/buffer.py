"""A Stable-Baselines3 ``ReplayBuffer`` backed by an expstore store.

``DQN(..., replay_buffer_class=ExpstoreReplayBuffer, replay_buffer_kwargs={"url": path})``
works for DQN, SAC, TD3 (and CleanRL-style scripts that build SB3's buffer themselves).
Each env of the VecEnv writes one lane. When it fits in 1 GiB of RAM the newest
``buffer_size`` steps per env are also kept in RAM in SB3's own layout (:mod:`.mirror`;
frame stacks as single frames, :mod:`.frames`): ``add`` and ``sample`` cost about what
SB3's do, ``size()``, ``pos`` and ``full`` follow SB3's rules, and with ``seed=None`` the
batches are the ones SB3's buffer would draw; the store is written behind it by a
background thread (:mod:`.sync`) and is complete after
:meth:`~ExpstoreReplayBuffer.flush`. Larger buffers stage adds in a small ring written by
that thread and sample from the store (:mod:`.store_batches`). Compared with SB3's own
buffer:

- observations are stored once (like ``optimize_memory_usage=True``), and that works with
  ``handle_timeout_termination=True`` too; ``frame_stack=k`` stores one frame per row;
- a step whose successor does not continue its episode (env reset between ``learn``
  calls, CleanRL's ``done=terminations``) is stored as truncated with its real next
  observation, so it bootstraps instead of learning a wrong transition;
- ``dones`` returned by :meth:`sample` are *terminations* only (truncated transitions,
  including SB3 timeouts when ``handle_timeout_termination=True``, bootstrap);
- ``n_steps``/``gamma`` give n-step returns (``discounts`` = gamma^m, like SB3's
  ``NStepReplayBuffer``); batches also carry ``weights``, ``index`` and ``step_id``;
- SB3's arrays (``observations``, ``actions``, ``rewards``, ``timeouts``, ``dones``) are
  views of the RAM mirror (:mod:`.views`); a buffer without a mirror has none.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, ReplayBuffer

from ...errors import SpecError, ValidationError
from ...rows import FLAG_LAST
from ...store import Store
from .convert import ExpstoreSamples, SB3Conversions, sb3_spec
from .lifecycle import StoreLifecycle, sb3_loading
from .mirror import RamMirror, _numpy
from .store_batches import BatchPrefetcher, deal_staged, staged_pending
from .sync import StoreSync
from .views import DoneMarks, SB3ArrayViews

#: RAM a mirror may take before ``mirror=None`` (auto) leaves sampling to the store (bytes)
MIRROR_AUTO_BYTES = 1 << 30
#: steps (all envs together) a buffer sampling from its store stages in RAM: adds land
#: there and reach the store on the writer thread
STAGING_STEPS = 1024


class ExpstoreReplayBuffer(SB3Conversions, SB3ArrayViews, StoreLifecycle, ReplayBuffer):
    """SB3 replay buffer whose transitions live in an expstore store at ``url``.

    ``url``: path or fsspec URL (created if absent, with a spec from the spaces; an existing
    store there is reused, its rows included), an open :class:`~expstore.Store`, or ``None``
    for a temporary directory removed with the buffer. ``overwrite=True`` replaces a store
    at ``url`` with an empty one here, in the constructor, once: reopening, pickling,
    copying and SB3's ``load()`` (which rebuilds the buffer from the saved kwargs) keep
    its rows (:meth:`reset` empties it on purpose). The store's capacity is 1.5 x
    ``buffer_size`` rows and a shard per env (rounded up), so that final rows of episodes
    (one per episode of 2 steps or more) and whole-shard eviction still leave
    ``buffer_size`` transitions in it.
    ``mirror``: keep the newest ``buffer_size`` steps per env in RAM in SB3's layout and
    sample from there (``add``/``sample`` cost about what SB3's do); the store is written
    behind it by a background thread, ``chunk`` steps at a time, and is complete after
    :meth:`flush`. ``None`` (default): mirror when it takes at most 1 GiB
    (:data:`MIRROR_AUTO_BYTES`); otherwise batches are read from the store.
    ``fsync=False``: commits are atomic but not forced to disk (a training buffer).
    ``seed``: sampling seed; ``None`` (default) draws from ``np.random`` (which SB3 seeds)
    with the same calls as SB3's ``ReplayBuffer``, so the same seed gives the same batches.
    Sampling from the store (no mirror): each env's newest step, which the store writes
    only when the next one arrives, is dealt into batches from RAM (sampleable as soon as
    it is added; ``index``/``step_id`` -1); ``prefetch=True`` draws the next batch from the
    store on a background thread while the learner uses the current one (a batch then
    misses only the steps added while it was drawn ahead, apart from the newest ones).
    """

    def __init__(self, buffer_size: int, observation_space: spaces.Space,
                 action_space: spaces.Space, device: th.device | str = "auto",
                 n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, *, url: Any = None,
                 n_steps: int = 1, gamma: float = 0.99, frame_stack: int | None = None,
                 shard_rows: int | None = None, overwrite: bool = False,
                 storage_options: dict[str, Any] | None = None, fsync: bool = False,
                 seed: int | None = None, mirror: bool | None = None,
                 chunk: int | None = None, prefetch: bool = True) -> None:
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device,
                            n_envs=n_envs)
        self.buffer_size = max(buffer_size // n_envs, 1)
        self.optimize_memory_usage = optimize_memory_usage  # always "on"; no restrictions
        self.handle_timeout_termination = handle_timeout_termination
        self.n_steps = int(n_steps)
        self.gamma = float(gamma)
        self.frame_stack = frame_stack
        self.spec = sb3_spec(observation_space, action_space, frame_stack)
        capacity = int(self.buffer_size * n_envs * 3 // 2) + 16 * n_envs
        self._options = dict(capacity=capacity, lanes=n_envs, shard_rows=shard_rows,
                             storage_options=storage_options, fsync=fsync)
        self._tmpdir: str | None = None
        self._url_arg = url
        self.url = url.url if isinstance(url, Store) else url
        if overwrite and sb3_loading():
            # SB3's load() rebuilds the buffer from the kwargs saved with the model: the
            # store they name holds that model's replay, so it is reattached, never wiped
            overwrite = False
        self._seed = seed
        # seed=None: uniform draws use np.random exactly as SB3's ReplayBuffer does (same
        # calls, same order), so a seeded run samples the very batches SB3's buffer would
        self._rng: np.random.Generator | None = (
            None if seed is None else np.random.default_rng(seed))
        self._store: Any = None
        self._sync: StoreSync | None = None
        self.prefetch = bool(prefetch)
        self._prefetcher: BatchPrefetcher | None = None
        self._lock = threading.Lock()  # the store, between adds and batches drawn ahead
        self.last_batch: dict[str, np.ndarray] | None = None
        if url is not None and not isinstance(url, Store) and not overwrite:
            self._check_existing(url)
        self._mirror = self._make_mirror(mirror)
        #: where adds land: the mirror, or (sampling from the store) a small staging ring
        self._ram = self._mirror if self._mirror is not None else self._make_staging()
        # at most half the ring: the writer thread has the other half as slack before the
        # adding thread must wait for it (``_make_room``)
        ram_size = self._ram.size if self._ram is not None else self.buffer_size
        default = max(4096 // n_envs, 64) if self._mirror is not None else ram_size // 4
        self._chunk = max(1, min(int(chunk or default), ram_size // 2))
        self._submitted = 0  # adds handed to the store so far
        self._bind_mirror()
        if self._ram is not None:
            # the store opens at the first chunk, inside the training loop: import its
            # libraries now (about a second) rather than then
            import zarr  # noqa: F401
        if overwrite and url is not None and not isinstance(url, Store):
            self._overwrite_now()  # once, here: nothing later (reopen, pickle, load) wipes
        elif (self._mirror is not None and url is not None and not overwrite
              and self._store_exists(url)):
            self._fill_mirror()
        self._room = self._submitted + ram_size  # adds that overwrite nothing unwritten

    def _make_mirror(self, mirror: bool | None) -> RamMirror | None:
        single_action = self.spec.structure["action"]["kind"] == "single"
        need = RamMirror.nbytes_for(self.spec, self.buffer_size, self.n_envs)
        if mirror is None:
            mirror = single_action and need <= MIRROR_AUTO_BYTES
        if mirror and not single_action:
            raise SpecError("mirror=True: the RAM mirror needs a single (non-Dict) action "
                            "space; use mirror=False")
        return RamMirror(self.spec, self.buffer_size, self.n_envs) if mirror else None

    def _make_staging(self) -> RamMirror:
        size = max(STAGING_STEPS // self.n_envs, 8 * self.n_steps, 64)
        return RamMirror(self.spec, size, self.n_envs)

    @property
    def mirrored(self) -> bool:
        """Whether batches come from the RAM mirror (else from the store)."""
        return self._mirror is not None

    def _enable_priorities(self) -> None:
        pass

    # -- SB3 contract ----------------------------------------------------------------------
    def add(self, obs: Any, next_obs: Any, action: np.ndarray, reward: np.ndarray,
            done: np.ndarray, infos: Any) -> None:
        """One step of every env (leading axis ``n_envs``); ``next_obs`` is the real next
        (terminal) observation, as ``OffPolicyAlgorithm._store_transition`` passes it."""
        m = self._ram
        if self.handle_timeout_termination and isinstance(infos, (list, tuple)):
            timeout = np.array([i.get("TimeLimit.truncated", False) for i in infos], bool)
        else:
            timeout = False
        if m.adds >= self._room:
            self._make_room()
        pos = m.adds % m.size
        a = self._mirror_arrays
        term, trunc = self._a_terminated, self._a_truncated
        ring = self._ring
        if ring is not None:  # frame stacks: one new frame each of obs and next_obs
            ring.put(m.adds, obs, next_obs)
        try:  # SB3's shapes: plain assignments, as SB3's own add does
            if ring is None:
                if not self._plain_obs:
                    raise ValueError
                a["obs"][pos] = obs
                a["next_obs"][pos] = next_obs
            a["action"][pos] = action
            a["reward"][pos] = reward
            term[pos] = done
        except (ValueError, TypeError):  # other shapes: reshaped, or refused naming the field
            if ring is None:
                for name, value in self._flat_obs(obs, "").items():
                    self._put(name, pos, value)
                for name, value in self._flat_obs(next_obs, "next_").items():
                    self._put(name, pos, value)
            self._put("action", pos, action)
            self._put("reward", pos, reward)
            self._put("terminated", pos, done)
        if timeout is not False:  # a time limit ends the stream, as in SB3's n-step buffer
            trunc[pos] = timeout
            term[pos] &= ~trunc[pos]
        else:
            trunc[pos] = False
        m.step_at[pos] = m.adds
        m.adds += 1
        self.pos = m.adds % self.buffer_size
        self.full = self.full or m.adds >= self.buffer_size
        if m.adds - self._submitted >= self._chunk:
            self._submit()

    def _put(self, name: str, pos: int, value: Any) -> None:
        """``mirror[name][pos] = value`` (leading axis ``n_envs``), reshaped if it has to
        be; a value that does not fit raises naming the field."""
        target = self._mirror_arrays[name]
        try:
            target[pos] = value
        except (ValueError, TypeError):
            shape = target.shape[1:]
            try:
                target[pos] = np.asarray(value).reshape(shape)
            except (ValueError, TypeError) as e:
                raise ValidationError(
                    f"{name}: expected {shape} ({target.dtype}) for {self.n_envs} env(s), got "
                    f"{np.shape(value)} ({np.asarray(value).dtype}): {e}") from None

    def _bind_mirror(self) -> None:
        """Cache the ring's arrays for :meth:`add` (after it is made or replaced)."""
        m = self._ram
        self.dones = DoneMarks(m, self.buffer_size, mirrored=m is self._mirror)
        self._ring = None if m is None else m.rings.get("obs")
        if m is None:
            return
        self._mirror_arrays = m.arrays
        self._a_terminated, self._a_truncated = m.arrays["terminated"], m.arrays["truncated"]
        self._plain_obs = self.spec.structure["obs"]["kind"] == "single" and not self.frame_stack

    def _flat_obs(self, obs: Any, pre: str) -> dict[str, Any]:
        if isinstance(obs, dict):
            return {f"{pre}obs.{k}": np.asarray(v).reshape(self.n_envs, *self._field(f"obs.{k}", v))
                    for k, v in obs.items()}
        return {pre + "obs": np.asarray(obs).reshape(self.n_envs, *self._field("obs", obs))}

    def sample(self, batch_size: int, env: Any = None) -> ExpstoreSamples:
        """``batch_size`` transitions as torch tensors on ``self.device``."""
        m = self._mirror
        if m is None:
            batch = self._store_batch(batch_size)
            self.last_batch = batch
            return self._to_samples(batch, env)
        if m.tree is not None:
            if self._rng is None:  # drawn once, from np.random (which SB3 seeds)
                self._rng = np.random.default_rng(int(np.random.randint(2**31 - 1)))
            inds, envs, weights = m.draw_prioritized(batch_size, self._rng)
        else:
            upper = self.buffer_size if self.full else self.pos  # SB3's bound
            if upper == 0:
                raise ValidationError("sample: the buffer is empty; add transitions first")
            if self._rng is None:
                inds = np.random.randint(0, upper, size=batch_size)
            else:
                inds = self._rng.integers(0, upper, batch_size)
            envs = self._draw_envs(batch_size)
            weights = None
        return self._mirror_samples(inds, envs, weights, env)

    def _store_batch(self, batch_size: int) -> dict[str, np.ndarray]:
        """A batch from the store (drawn ahead with ``prefetch``), with the staged steps
        the store cannot serve yet dealt in from RAM."""
        from ...errors import NotEnoughData
        from ...sampling.plans import IN_PROCESS

        sampler = self.sampler
        try:
            if self.prefetch:
                if self._prefetcher is None:
                    self._prefetcher = BatchPrefetcher(sampler.sample, self._lock)
                batch = self._prefetcher.get(batch_size)
            else:
                with self._lock:
                    batch = sampler.sample(batch_size)
        except NotEnoughData:
            batch = None
        ram = self._ram
        with self._lock:  # a consistent view of what the writer thread has written
            stored = int(sampler.index.present(sampler.guard_for(IN_PROCESS)).sum())
            held = np.array([h is not None for h in self.writer.held])
            adds, envs = staged_pending(ram, self._written(), held, self.n_steps)
        if batch is None and not len(adds):
            raise ValidationError("sample: the buffer is empty; add transitions first")
        return deal_staged(batch, batch_size, ram, adds, envs, stored, self._deal_rng,
                           self.n_steps, self.gamma)

    def _written(self) -> int:
        """Adds of the ring handed to the store's writer so far."""
        return self._sync.written if self._sync is not None else 0

    def _draw_envs(self, n: int) -> np.ndarray:
        if self._rng is None:
            return np.random.randint(0, high=self.n_envs, size=(n,))
        return self._rng.integers(0, self.n_envs, n)

    def _mirror_samples(self, inds: np.ndarray, envs: np.ndarray, weights: Any,
                        env: Any) -> ExpstoreSamples:
        assert self._mirror is not None
        norm = None if env is None else (lambda r: self._normalize_reward(r, env))
        b = self._mirror.gather(inds, envs, self.n_steps, self.gamma, norm)
        b["weight"] = weights
        self.last_batch = b
        return self._to_samples(b, env, rewards_normalized=True)

    def update_priorities(self, index: Any, td_error: Any, step_id: Any = None) -> None:
        """Feed ``|TD error|`` of sampled rows back (no-op for uniform sampling)."""
        m = self._mirror
        if m is not None:
            if m.tree is not None:
                m.update_priorities(index, td_error, step_id)
        elif getattr(self.sampler, "prioritized", False):
            index = np.asarray(_numpy(index), np.int64).ravel()
            keep = index >= 0  # -1: a newest step dealt from RAM (enters at top priority)
            td = np.asarray(_numpy(td_error)).ravel()
            if td.size != index.size:
                raise ValidationError(f"td_error: expected {index.size} values (one per "
                                      f"index), got {td.size}")
            sid = None if step_id is None else np.asarray(_numpy(step_id)).ravel()[keep]
            with self._lock:
                self.sampler.update_priorities(index[keep], td[keep], sid)

    def _get_samples(self, batch_inds: np.ndarray, env: Any = None) -> ExpstoreSamples:
        """Transitions at ``batch_inds``: buffer positions (random envs) with a mirror,
        store rows without."""
        if self._mirror is not None:
            inds = np.asarray(batch_inds, np.int64)
            envs = self._draw_envs(len(inds))
            return self._mirror_samples(inds, envs, None, env)
        return self._to_samples(self.store.transitions(batch_inds, self.n_steps, self.gamma),
                                env)

    def size(self) -> int:
        """Transitions held per env: every added step (the newest included), at most
        ``buffer_size``; without a mirror, the store's (final rows of episodes not
        counted) and the steps still in RAM on their way to it."""
        if self._mirror is not None:
            return self._mirror.filled()
        store = self.store
        with self._lock:  # a consistent view of what the writer thread has written
            idx = store.index
            total = sum(h is not None for h in self.writer.held)  # written when the next comes
            if self._ram is not None:  # staged, not yet handed to the store
                total += (self._ram.adds - self._written()) * self.n_envs
            for lane in range(store.lanes):
                lo, hi = int(idx.lower_bound()[lane]), int(idx.count[lane])
                rows = idx.lane_rows(lane, np.arange(lo, hi))
                total += int(np.count_nonzero((idx.flags[rows] & FLAG_LAST) == 0))
        return min(total // self.n_envs, self.buffer_size)
