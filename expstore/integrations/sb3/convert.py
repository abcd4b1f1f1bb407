"""Between SB3's shapes and expstore's fields: the spec an SB3 buffer stores, the shapes
``add`` receives, and the ``ExpstoreSamples`` ``sample`` returns."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np
import torch as th
from gymnasium import spaces

from ...errors import SpecError, ValidationError
from ...field import Field
from ...spec import Spec


class ExpstoreSamples(NamedTuple):
    """SB3's ``ReplayBufferSamples`` fields plus importance weights and row ids."""

    observations: Any  # th.Tensor, or dict of tensors for Dict spaces
    actions: th.Tensor
    next_observations: Any
    dones: th.Tensor  # (B, 1) float32, 1 where the transition terminated
    rewards: th.Tensor  # (B, 1) float32 (n-step discounted sum when n_steps > 1)
    discounts: th.Tensor | None = None  # (B, 1) gamma^m with n_steps > 1, else None
    weights: th.Tensor | None = None  # (B, 1) float32 importance weights (1 if uniform)
    index: np.ndarray | None = None  # (B,) store rows (for update_priorities)
    step_id: np.ndarray | None = None  # (B,) lane steps of those rows


def sb3_spec(observation_space: spaces.Space, action_space: spaces.Space,
             frame_stack: int | None = None) -> Spec:
    """The spec an SB3 buffer stores: SB3 keeps Box actions unbounded (SAC/TD3 store the
    [-1, 1]-scaled action) and float64 actions as float32; VecFrameStack pads with zeros."""
    if frame_stack:
        shape = getattr(observation_space, "shape", None) or ()
        if len(shape) != 3 or shape[0] != frame_stack:
            raise SpecError(f"frame_stack={frame_stack}: expected a channel-first observation "
                            f"space of shape ({frame_stack}, H, W) (VecFrameStack + "
                            f"VecTransposeImage), got {shape}")
    spec = Spec.from_spaces(observation_space, action_space, frame_stack=frame_stack,
                            padding="zero")
    fields = dict(spec.fields)
    for name in spec.action_names:
        f = fields[name]
        if f.dtype.kind == "f":
            fields[name] = Field(f.shape, np.float32 if f.dtype == np.float64 else f.dtype)
    return replace(spec, fields=fields)


class SB3Conversions:
    """Shape conversions of :class:`ExpstoreReplayBuffer` (SB3 arrays <-> spec fields).
    Uses the buffer's ``spec``, ``n_envs``, ``frame_stack``, ``obs_shape``, ``n_steps``,
    ``gamma``, ``device`` and SB3's ``_normalize_obs``/``_normalize_reward``."""

    spec: Spec
    n_envs: int
    frame_stack: int | None
    obs_shape: Any
    n_steps: int
    gamma: float
    device: Any

    def _shape_obs(self, obs: Any) -> Any:
        if isinstance(obs, dict):
            return {k: np.asarray(v).reshape(self.n_envs, *self._field(f"obs.{k}", v))
                    for k, v in obs.items()}
        return np.asarray(obs).reshape(self.n_envs, *self._field("obs", obs))

    def _field(self, name: str, value: Any) -> tuple[int, ...]:
        f = self.spec.fields.get(name)
        if f is None:
            return np.shape(value)[1:]
        if f.stack and np.size(value) == self.n_envs * f.stack * int(np.prod(f.shape)):
            return (f.stack, *f.shape)
        return f.shape

    def _shape_action(self, action: Any) -> Any:
        if self.spec.structure["action"]["kind"] != "single":
            return action
        return np.asarray(action).reshape(self.n_envs, *self.spec.fields["action"].shape)

    def _check_frames(self, obs: Any, next_obs: Any) -> None:
        for name, o in self.spec.flatten("obs", obs).items():
            if not self.spec.fields[name].stack:
                continue
            nx = self.spec.flatten("obs", next_obs)[name]
            if o.ndim >= 2 and not np.array_equal(np.asarray(nx)[:, :-1], np.asarray(o)[:, 1:]):
                raise ValidationError(
                    f"{name}: frame_stack={self.frame_stack} expects next_obs[:, :-1] == "
                    "obs[:, 1:] (a channel-first stack, newest frame last); got stacks that "
                    "do not shift by one frame")

    def _to_samples(self, b: dict[str, Any], env: Any,
                    rewards_normalized: bool = False) -> ExpstoreSamples:
        B = len(b["reward"])
        obs, nxt = self._batch_obs(b, "obs"), self._batch_obs(b, "next_obs")
        if self.spec.structure["action"]["kind"] == "single":
            act = b["action"].reshape(B, -1)
        else:
            act = np.concatenate([b[n].reshape(B, -1) for n in self.spec.action_names], axis=1)
        t = self._tensor
        disc = None
        if self.n_steps > 1:
            disc = t((self.gamma ** b["horizon"].astype(np.float64)).astype(np.float32)[:, None])
        reward = b["reward"].astype(np.float32, copy=False).reshape(B, 1)
        if not rewards_normalized:
            reward = self._normalize_reward(reward, env)
        weight = b.get("weight")
        return ExpstoreSamples(
            observations=_map(t, self._normalize_obs(obs, env)),
            actions=t(act),
            next_observations=_map(t, self._normalize_obs(nxt, env)),
            dones=t(b["terminated"].astype(np.float32).reshape(B, 1)),
            rewards=t(reward),
            discounts=disc,
            weights=(th.ones((B, 1), device=self.device) if weight is None
                     else t(weight.astype(np.float32, copy=False).reshape(B, 1))),
            index=b["index"],
            step_id=b["step_id"],
        )

    def _batch_obs(self, b: dict[str, np.ndarray], prefix: str) -> Any:
        st = self.spec.structure["obs"]
        if st["kind"] == "single":
            v = b[prefix]
            return v.reshape(len(v), *self.obs_shape)
        shapes = self.obs_shape if isinstance(self.obs_shape, dict) else {}
        return {k: (v := b[f"{prefix}.{k}"]).reshape(len(v), *shapes.get(k, v.shape[1:]))
                for k in st["keys"]}

    def _tensor(self, a: np.ndarray) -> th.Tensor:
        return th.as_tensor(np.ascontiguousarray(a), device=self.device)


def _map(fn: Any, x: Any) -> Any:
    return {k: fn(v) for k, v in x.items()} if isinstance(x, dict) else fn(x)
