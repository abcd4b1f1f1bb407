"""The newest ``buffer_size`` steps of every env, in RAM, in SB3's own layout.

An :class:`~expstore.integrations.sb3.ExpstoreReplayBuffer` whose fields are small
(vector observations, discrete or box actions) samples from this mirror: an ``add`` is a
handful of array assignments and a ``sample`` a handful of gathers, as in SB3's
``ReplayBuffer``, while the store is written behind it in chunks. Slot ``pos`` of env ``e``
is transition id ``pos * n_envs + e`` (the ``index`` of a sampled batch).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ValidationError
from ...index.sumtree import PriorityTree
from ...sampling.by_priority import BetaSchedule
from ...spec import Spec
from .frames import FrameRing, ring_range

Gathered = dict[str, np.ndarray]


class RamMirror:
    """Ring of ``size`` steps x ``n_envs`` for every field of ``spec`` (flat names), plus
    ``next_`` observations, ``truncated`` (time limits and broken streams) and, for
    prioritized sampling, a sum-tree over the ``size * n_envs`` transitions."""

    def __init__(self, spec: Spec, size: int, n_envs: int) -> None:
        self.spec, self.size, self.n_envs = spec, int(size), int(n_envs)
        self.obs_names = list(spec.obs_names)
        shapes = {n: ((f.stack,) if f.stack else ()) + tuple(f.shape)
                  for n, f in spec.fields.items()}
        #: frame-stacked observation fields, kept as single frames
        self.rings = {name: FrameRing(name, self.size, self.n_envs, f.stack, f.shape, f.dtype)
                      for name, f in spec.fields.items()
                      if name in self.obs_names and f.stack}
        self.arrays: dict[str, np.ndarray] = {}
        for name, f in spec.fields.items():
            if name in self.rings:
                continue
            dtype = np.float32 if name == "reward" else f.dtype
            self.arrays[name] = np.zeros((self.size, self.n_envs, *shapes[name]), dtype)
        for name in self.obs_names:
            if name not in self.rings:
                self.arrays["next_" + name] = np.zeros_like(self.arrays[name])
        for name in ("terminated", "truncated"):
            self.arrays[name] = np.zeros((self.size, self.n_envs), bool)
        #: lane step (adds before this one) that wrote slot ``pos``; -1 where empty
        self.step_at = np.full(self.size, -1, np.int64)
        self.adds = 0
        self.tree: PriorityTree | None = None

    # -- size ------------------------------------------------------------------------------
    @staticmethod
    def nbytes_for(spec: Spec, size: int, n_envs: int) -> int:
        """Bytes a mirror of ``size`` steps x ``n_envs`` would hold (observations twice;
        a frame-stacked one as two frames)."""
        per, rings = 2, 0  # terminated, truncated
        for name, f in spec.fields.items():
            item = 4 if name == "reward" else f.dtype.itemsize
            n = int(np.prod(f.shape, dtype=np.int64)) * item
            if name in spec.obs_names and f.stack:
                rings += FrameRing.nbytes_for(size, n_envs, f.stack, n)
            else:
                per += n * (2 if name in spec.obs_names else 1)
        return per * int(size) * int(n_envs) + 8 * int(size) + rings

    @property
    def nbytes(self) -> int:
        """Bytes the mirror's arrays hold."""
        return (sum(a.nbytes for a in self.arrays.values()) + self.step_at.nbytes
                + sum(r.nbytes for r in self.rings.values()))

    @property
    def pos(self) -> int:
        return self.adds % self.size

    @property
    def full(self) -> bool:
        return self.adds >= self.size

    def filled(self) -> int:
        """Steps per env held now."""
        return min(self.adds, self.size)

    # -- writing ---------------------------------------------------------------------------
    def put(self, step: dict[str, np.ndarray]) -> None:
        """Store one step of every env (flat names, leading axis ``n_envs``) at ``pos``."""
        pos = self.adds % self.size
        arrays = self.arrays
        for name, ring in self.rings.items():
            ring.put(self.adds, step[name], step["next_" + name])
        for name, value in step.items():
            if name in self.rings or (name.startswith("next_") and name[5:] in self.rings):
                continue
            try:
                arrays[name][pos] = value
            except (ValueError, TypeError) as e:
                want = arrays[name].shape[1:]
                raise ValidationError(
                    f"{name}: expected {want} ({arrays[name].dtype}) for {self.n_envs} env(s), "
                    f"got {np.shape(value)} ({np.asarray(value).dtype}): {e}") from None
        self.step_at[pos] = self.adds
        self.adds += 1

    def cut(self, pos: int) -> None:
        """Mark the step at ``pos`` as the last of its stream (SB3's ``dones[pos] = True``
        before a new ``learn()``): it bootstraps from its own ``next_obs``."""
        pos = int(pos) % self.size
        a = self.arrays
        a["truncated"][pos] |= ~a["terminated"][pos]

    def window(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """The steps with add counts ``start..stop-1`` (``stop - start <= size``), leading
        axes ``(steps, n_envs)``: views into the ring where the range does not wrap (valid
        until those slots are overwritten), else copies."""
        out = {k: ring_range(v, start, stop, self.size) for k, v in self.arrays.items()}
        for name, ring in self.rings.items():  # one frame per step, as the store keeps them
            out[name], out["next_" + name] = ring.window(start, stop)
        return out

    # -- sampling --------------------------------------------------------------------------
    def gather(self, inds: np.ndarray, envs: np.ndarray, n_steps: int = 1,
               gamma: float = 0.99, reward_fn: Any = None) -> Gathered:
        """Transitions at (``inds``, ``envs``): flat obs fields, ``next_`` fields, ``action``
        fields, ``reward``, ``terminated``, ``horizon``; n-step as SB3's
        ``NStepReplayBuffer`` (stops at termination, truncation and the newest step).
        ``reward_fn`` normalizes rewards before they are summed (SB3's order)."""
        a = self.arrays
        out = {name: a[name][inds, envs] for name in self.obs_names if name not in self.rings}
        stacked = {name: ring.stacks(self.step_at[inds], inds, envs)
                   for name, ring in self.rings.items()}
        for name, (obs, _) in stacked.items():
            out[name] = obs
        for name in self.spec.action_names:
            out[name] = a[name][inds, envs]
        if n_steps <= 1:
            last = inds
            reward = a["reward"][inds, envs]
            out["reward"] = reward if reward_fn is None else reward_fn(reward)
            out["horizon"] = None  # type: ignore[assignment]
        else:
            steps = np.arange(n_steps)
            seq = (inds[:, None] + steps) % self.size
            env2 = envs[:, None]
            stop = a["terminated"][seq, env2] | a["truncated"][seq, env2]
            newest = (self.adds - 1) % self.size
            stop |= seq == newest  # nothing after the newest step is this stream
            for name in self.obs_names:
                if name in self.rings:  # the ring knows where its streams break
                    ring = self.rings[name]
                    stop[:, :-1] |= ring.back[seq[:, 1:], env2] == 0
                    continue
                # a stream that broke without a done flag (env reset between learn() calls)
                nxt, following = a["next_" + name][seq[:, :-1], env2], a[name][seq[:, 1:], env2]
                same = (nxt == following).reshape(len(inds), n_steps - 1, -1).all(axis=2)
                stop[:, :-1] |= ~same
            first = np.where(stop.any(axis=1), stop.argmax(axis=1), n_steps - 1)
            mask = steps[None, :] <= first[:, None]
            rewards = a["reward"][seq, env2]
            if reward_fn is not None:
                rewards = reward_fn(rewards)
            disc = (gamma ** steps).astype(np.float32)
            out["reward"] = (rewards * disc * mask).sum(axis=1, dtype=np.float32)
            last = seq[np.arange(len(inds)), first]
            out["horizon"] = first + 1
        for name in self.obs_names:
            if name in self.rings:
                if last is inds:
                    out["next_" + name] = stacked[name][1]
                else:
                    out["next_" + name] = self.rings[name].stacks(
                        self.step_at[last], last, envs, obs=False)[1]
            else:
                out["next_" + name] = a["next_" + name][last, envs]
        out["terminated"] = a["terminated"][last, envs]
        out["index"] = inds * self.n_envs + envs
        out["step_id"] = self.step_at[inds]
        return out

    # -- priorities ------------------------------------------------------------------------
    def enable_priorities(self, alpha: float, eps: float, schedule: BetaSchedule) -> None:
        self.tree = PriorityTree(self.size * self.n_envs)
        self.alpha, self.eps, self.schedule = float(alpha), float(eps), schedule
        self.max_priority = 1.0
        self.synced = 0  # adds whose slots have their initial priority in the tree
        self.batches = 0

    def _sync_tree(self) -> None:
        """Give the steps added since the last draw the highest priority seen so far."""
        assert self.tree is not None
        start = max(self.synced, self.adds - self.size)
        if start < self.adds:
            pos = np.arange(start, self.adds) % self.size
            slots = (pos[:, None] * self.n_envs + np.arange(self.n_envs)).ravel()
            self.tree.update(slots, self.max_priority)
        self.synced = self.adds

    def draw_prioritized(self, batch_size: int,
                         rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(slots, envs, importance weights ``(p_i / p_min) ** -beta``) by priority."""
        assert self.tree is not None
        if self.adds == 0:
            raise ValidationError("sample: the buffer is empty; add transitions first")
        self._sync_tree()
        ids = self.tree.sample(batch_size, rng)
        beta = self.schedule(self.batches)
        self.batches += 1
        p = self.tree.get(ids)
        weights = (p / self.tree.min) ** -beta
        return ids // self.n_envs, ids % self.n_envs, weights.astype(np.float32)

    def update_priorities(self, index: Any, td_error: Any, step_id: Any = None) -> int:
        """Set ``(|td_error| + eps) ** alpha`` for transitions ``index``; those rewritten
        since they were drawn (``step_id`` no longer matches) are skipped. Returns how many
        were set."""
        assert self.tree is not None
        ids = np.asarray(_numpy(index), np.int64).ravel()
        td = np.abs(np.asarray(_numpy(td_error), np.float64).ravel())
        if td.size != ids.size:
            raise ValidationError(f"td_error: expected {ids.size} values (one per index), "
                                  f"got {td.size}")
        if not np.isfinite(td).all():
            raise ValidationError("td_error: expected finite values, got NaN or inf")
        if ids.size and (ids.min() < 0 or ids.max() >= self.tree.capacity):
            raise ValidationError(f"index: expected transition ids in [0, "
                                  f"{self.tree.capacity}), got {ids.min()}..{ids.max()}")
        self._sync_tree()
        keep = self.step_at[ids // self.n_envs] >= 0
        if step_id is not None:
            keep &= self.step_at[ids // self.n_envs] == np.asarray(_numpy(step_id)).ravel()
        pri = (td[keep] + self.eps) ** self.alpha
        if pri.size:
            self.tree.update(ids[keep], pri)
            self.max_priority = max(self.max_priority, float(pri.max()))
        return int(keep.sum())


def _numpy(x: Any) -> Any:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else x
