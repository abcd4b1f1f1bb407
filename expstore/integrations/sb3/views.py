"""SB3's replay-buffer arrays (``observations``, ``actions``, ``rewards``, ...) as views of
an :class:`~expstore.integrations.sb3.ExpstoreReplayBuffer`'s RAM mirror, in the shapes
SB3's ``ReplayBuffer`` gives them. Code written against SB3's buffer reads them (checks
on stored actions, copying one buffer into another with ``extend``), and
:class:`DoneMarks`, the buffer's ``dones``."""

from __future__ import annotations

from typing import Any

import numpy as np

from .mirror import RamMirror


class SB3ArrayViews:
    """Read access to the mirror in SB3's layout: leading axes ``(buffer_size, n_envs)``.
    Arrays are views (writing to them writes the mirror, as with SB3's arrays); a buffer
    without a mirror (``mirror=False``: it samples from its store) has none of them."""

    _mirror: RamMirror | None
    n_envs: int
    obs_shape: Any
    action_dim: int

    def _arrays(self, attr: str) -> dict[str, np.ndarray]:
        if self._mirror is None:
            raise AttributeError(
                f"{attr}: this buffer samples from its store (mirror=False) and keeps no "
                "arrays in RAM; read transitions with buffer.store.transitions(rows)")
        return self._mirror.arrays

    def _obs_view(self, prefix: str, attr: str) -> Any:
        a = self._arrays(attr)
        lead = (-1, self.n_envs)
        if isinstance(self.obs_shape, dict):
            return {k: a[f"{prefix}obs.{k}"].reshape(*lead, *shape)
                    for k, shape in self.obs_shape.items()}
        ring = self._mirror.rings.get("obs")
        if ring is not None:
            return self._stacks(ring, next_obs=bool(prefix))
        return a[prefix + "obs"].reshape(*lead, *self.obs_shape)

    def _stacks(self, ring: Any, next_obs: bool) -> np.ndarray:
        """Frame-stacked observations are kept as single frames: their stacks rebuilt for
        every slot (a copy, not a view; zeros where nothing was added yet)."""
        m = self._mirror
        size, n = m.size, self.n_envs
        pos = np.repeat(np.arange(size), n)
        envs = np.tile(np.arange(n), size)
        adds = m.step_at[pos]
        live = adds >= 0
        out = np.zeros((size * n, *self.obs_shape), ring.dtype)
        if live.any():
            obs, nxt = ring.stacks(adds[live], pos[live], envs[live], obs=not next_obs)
            got = nxt if next_obs else obs
            out[live] = got.reshape(len(got), *self.obs_shape)
        return out.reshape(size, n, *self.obs_shape)

    @property
    def observations(self) -> Any:
        """``(buffer_size, n_envs, *obs_shape)`` observations (a dict of them for Dict
        spaces)."""
        return self._obs_view("", "observations")

    @property
    def next_observations(self) -> Any:
        """``(buffer_size, n_envs, *obs_shape)`` next observations (the real terminal one
        at episode ends)."""
        return self._obs_view("next_", "next_observations")

    @property
    def actions(self) -> np.ndarray:
        """``(buffer_size, n_envs, action_dim)`` actions (float64 Box actions as float32)."""
        return self._arrays("actions")["action"].reshape(-1, self.n_envs, self.action_dim)

    @property
    def rewards(self) -> np.ndarray:
        """``(buffer_size, n_envs)`` float32 rewards."""
        return self._arrays("rewards")["reward"]

    @property
    def timeouts(self) -> np.ndarray:
        """``(buffer_size, n_envs)`` bool: the step ended its episode by a time limit
        (``TimeLimit.truncated``) or by a cut between ``learn()`` calls."""
        return self._arrays("timeouts")["truncated"]


class DoneMarks:
    """Stand-in for SB3's ``dones`` array: ``OffPolicyAlgorithm._setup_learn`` sets
    ``dones[pos] = True`` to cut the last episode before a new ``learn()``. The RAM mirror
    marks that step truncated (it bootstraps); the store detects the break itself."""

    def __init__(self, ram: RamMirror | None = None, buffer_size: int = 0,
                 mirrored: bool = True) -> None:
        self.ram, self.buffer_size = ram, buffer_size
        #: the buffer's whole RAM mirror (readable as SB3's array), not a staging ring
        self.mirror = ram if mirrored else None

    def __setitem__(self, key: Any, value: Any) -> None:
        m = self.ram
        if m is not None and bool(np.all(value)):
            # SB3 marks its newest step; a staging ring (smaller than the buffer) finds it
            # by its own count
            m.cut(int(np.asarray(key).ravel()[0]) if self.mirror is not None
                  else m.adds - 1)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """SB3's ``dones`` (``(buffer_size, n_envs)`` float32): 1 where the step ended its
        episode (terminated or truncated, a cut included). A copy."""
        if self.mirror is None:
            raise TypeError("dones: this buffer samples from its store (mirror=False) and "
                            "keeps no arrays in RAM; read them with store.transitions(rows)")
        a = self.mirror.arrays
        return (a["terminated"] | a["truncated"]).astype(dtype or np.float32)

    def __getitem__(self, key: Any) -> np.ndarray:
        return np.asarray(self)[key]

    def __iter__(self) -> Any:
        return iter(np.asarray(self))

    def __len__(self) -> int:
        return 0 if self.mirror is None else self.mirror.size
