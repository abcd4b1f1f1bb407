"""Record every step of a Gymnasium env (or vector env) into a store.

``env = RecordToStore(env, "data/cartpole.zarr")`` and run any policy: each step goes into
the store (a vector env writes one lane per sub-env), the store is flushed on ``close()``.
An episode cut short by ``reset()`` (or by ``close()``) ends *truncated* with its real final
observation. Vector envs are handled in all three autoreset modes of Gymnasium 1.x: in
``NEXT_STEP`` (the default) the step that only resets a finished sub-env is not recorded;
in ``SAME_STEP`` the final observation is taken from ``infos["final_obs"]``; with
``DISABLED`` sub-envs are reset through ``reset(options={"reset_mask": ...})``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from ..errors import ValidationError
from ..field import Field
from ..spec import Spec
from ..store import Store
from .step_writer import StepWriter, index_tree, open_or_create

__all__ = ["RecordToStore", "RecordVectorToStore"]


class _Recorder:
    """What both wrappers share: the store, the writer, extras from infos, closing."""

    def _setup(self, obs_space: gym.Space, act_space: gym.Space, url: Any, lanes: int,
               capacity: int, spec: Spec | None, extras: Mapping[str, Field] | None,
               frame_stack: int | None, shard_rows: int | None, overwrite: bool,
               storage_options: dict[str, Any] | None, fsync: bool) -> None:
        if spec is None:
            spec = Spec.from_spaces(obs_space, act_space, frame_stack=frame_stack,
                                    extras=extras)
        self._owns_store = not isinstance(url, Store)
        self.store = open_or_create(url, spec, capacity, lanes, shard_rows, overwrite,
                                    storage_options, fsync)
        self.writer = StepWriter(self.store)
        builtin = set(spec.obs_names) | set(spec.action_names) | {
            "reward", "terminated", "truncated"}
        self.extra_names = [n for n in spec.fields if n not in builtin]

    def _extras(self, info: Mapping[str, Any], sel: Any = None) -> dict[str, Any]:
        out = {}
        for name in self.extra_names:
            if name not in info:
                raise ValidationError(f"{name}: the store has this extra field, so every "
                                      f"step's info must carry {name!r}; got keys "
                                      f"{sorted(info)}")
            v = info[name]
            out[name] = v if sel is None else np.asarray(v)[sel]
        return out

    def flush(self) -> None:
        """Commit recorded rows (the newest step of an open episode stays held)."""
        self.store.flush()

    def _close_store(self) -> None:
        if getattr(self, "store", None) is None:
            return
        self.writer.end()
        if self._owns_store:
            self.store.close()
        else:
            self.store.flush()
        self.store = None


class RecordToStore(gym.Wrapper, _Recorder):
    """Write every ``step`` of ``env`` into the store at ``url`` (a path, fsspec URL or an
    open :class:`~expstore.Store`); given a ``VectorEnv`` this builds a
    :class:`RecordVectorToStore` (one lane per sub-env).

    The store is created if absent (spec from the env's spaces, or ``spec``), else opened
    and its spec checked. ``capacity``: rows (the store is a ring; old rows are overwritten
    beyond it). ``extras``: extra per-step fields whose values come from ``info[name]``.
    ``frame_stack=k``: the env returns ``(k, H, W)`` stacks; one frame per row is stored.
    """

    def __new__(cls, env: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(env, gym.vector.VectorEnv):
            return RecordVectorToStore(env, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, env: gym.Env, url: Any, capacity: int = 1_000_000,
                 spec: Spec | None = None, extras: Mapping[str, Field] | None = None,
                 frame_stack: int | None = None, shard_rows: int | None = None,
                 overwrite: bool = False, storage_options: dict[str, Any] | None = None,
                 fsync: bool = True) -> None:
        gym.Wrapper.__init__(self, env)
        self._setup(env.observation_space, env.action_space, url, 1, capacity, spec, extras,
                    frame_stack, shard_rows, overwrite, storage_options, fsync)
        self._obs: Any = None

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.writer.end()  # an episode still open was cut short: it ends truncated
        self._obs = obs
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        if self._obs is None:
            raise gym.error.ResetNeeded("RecordToStore: call reset() before step()")
        obs, reward, terminated, truncated, info = self.env.step(action)
        steps = self.writer.coerce(self._obs, action, reward, obs, terminated, truncated,
                                   self._extras(info), lead=())
        self.writer.extend(0, {k: v[None] for k, v in steps.items()})
        self._obs = obs
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        """End the open episode (truncated), flush and close the store, close the env."""
        self._close_store()
        super().close()


class RecordVectorToStore(gym.vector.VectorWrapper, _Recorder):
    """:class:`RecordToStore` for a Gymnasium ``VectorEnv``: sub-env ``i`` writes lane ``i``."""

    def __init__(self, env: gym.vector.VectorEnv, url: Any, capacity: int = 1_000_000,
                 spec: Spec | None = None, extras: Mapping[str, Field] | None = None,
                 frame_stack: int | None = None, shard_rows: int | None = None,
                 overwrite: bool = False, storage_options: dict[str, Any] | None = None,
                 fsync: bool = True) -> None:
        gym.vector.VectorWrapper.__init__(self, env)
        self._setup(env.single_observation_space, env.single_action_space, url, env.num_envs,
                    capacity, spec, extras, frame_stack, shard_rows, overwrite,
                    storage_options, fsync)
        mode = env.metadata.get("autoreset_mode", "NextStep")
        self.autoreset_mode = str(getattr(mode, "value", mode))
        if self.autoreset_mode not in ("NextStep", "SameStep", "Disabled"):
            raise ValueError(f"autoreset_mode: unsupported {mode!r}")
        self._obs: Any = None
        self._resetting = np.zeros(env.num_envs, bool)  # NEXT_STEP: next step only resets

    def reset(self, *, seed: Any = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        mask = None if options is None else options.get("reset_mask")  # env.reset pops it
        obs, infos = self.env.reset(seed=seed, options=options)
        lanes = np.arange(self.num_envs) if mask is None else np.flatnonzero(mask)
        self.writer.end(lanes)
        if self._obs is None or mask is None:
            self._obs = obs
        else:
            self._obs = _set_lanes(self._obs, lanes, obs, full=True)
        self._resetting[lanes] = False
        return obs, infos

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        if self._obs is None:
            raise gym.error.ResetNeeded("RecordVectorToStore: call reset() before step()")
        obs, rewards, term, trunc, infos = self.env.step(actions)
        done = np.asarray(term, bool) | np.asarray(trunc, bool)
        nxt = obs
        if self.autoreset_mode == "SameStep" and done.any():
            final = infos.get("final_obs")
            if final is None:
                raise ValidationError("SAME_STEP autoreset: infos['final_obs'] is missing for "
                                      "sub-envs that ended")
            lanes = np.flatnonzero(done)
            nxt = _set_lanes(obs, lanes, _stack([final[i] for i in lanes]), full=False)
        record = ~self._resetting if self.autoreset_mode == "NextStep" else np.ones_like(done)
        sel = np.flatnonzero(record)
        if len(sel):
            steps = self.writer.coerce(
                index_tree(self._obs, sel), index_tree(actions, sel),
                np.asarray(rewards)[sel], index_tree(nxt, sel), np.asarray(term)[sel],
                np.asarray(trunc)[sel], self._extras(infos, sel), lead=(len(sel),))
            for j, lane in enumerate(sel):
                self.writer.extend(int(lane), {k: v[j:j + 1] for k, v in steps.items()})
        self._obs = obs
        if self.autoreset_mode == "NextStep":
            self._resetting = done
        return obs, rewards, term, trunc, infos

    def close(self, **kwargs: Any) -> None:
        """End open episodes (truncated), flush and close the store, close the env."""
        self._close_store()
        super().close(**kwargs)


def _stack(items: list[Any]) -> Any:
    first = items[0]
    if isinstance(first, Mapping):
        return {k: _stack([it[k] for it in items]) for k in first}
    if isinstance(first, tuple):
        return tuple(_stack([it[i] for it in items]) for i in range(len(first)))
    return np.stack([np.asarray(it) for it in items])


def _set_lanes(tree: Any, lanes: np.ndarray, values: Any, full: bool) -> Any:
    """A copy of ``tree`` whose rows ``lanes`` come from ``values`` (a full batch when
    ``full``, else one entry per lane in ``lanes``)."""
    if isinstance(tree, Mapping):
        return {k: _set_lanes(v, lanes, values[k], full) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_set_lanes(v, lanes, values[i], full) for i, v in enumerate(tree))
    out = np.array(tree, copy=True)
    values = np.asarray(values)
    out[lanes] = values[lanes] if full else values
    return out
