"""TensorDicts <-> store columns, for the TorchRL bridge (``torchrl.py``).

:class:`StepColumns` reads a collector batch (``[T]`` or ``[lanes, T]``) as the store's flat
fields, checked once for every lane: numpy views of the tensors (no copy where the dtype is
the field's), keys mapped once per spec. :func:`to_tensordict` builds TorchRL's layout
from an expstore batch around the batch's own arrays (``torch.from_numpy``, no copy).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from ..errors import ValidationError
from ..field import Field
from ..spec import BUILTIN, Spec
from ..validate import coerce

# -- names ------------------------------------------------------------------------------
_BATCH_KEYS = ("reward", "terminated", "truncated", "index", "step_id", "weight", "horizon",
               "discount")


def obs_key(name: str) -> str:
    """Store obs field -> TensorDict key: ``obs`` -> ``observation``, ``obs.<k>`` -> ``k``."""
    return "observation" if name == "obs" else name[4:]


def act_key(name: str) -> Any:
    """Store action field -> TensorDict key: ``action``, ``action.<k>`` -> ``("action", k)``."""
    return "action" if name == "action" else ("action", name[7:])


# -- expstore batch -> TensorDict ----------------------------------------------------------
def to_tensordict(batch: Mapping[str, np.ndarray], device: Any = None,
                  weights: bool = True) -> TensorDict:
    """An expstore batch (``store.sample``, ``sampler.sample``, a loader batch) in TorchRL's
    layout, batch size ``[B]``; the tensors share the batch's memory (no copy).

    ``observation`` (or one key per Dict-space key), ``action``, user fields,
    ``next: {observation, reward, done, terminated, truncated}`` (reward and flags with a
    trailing 1, as TorchRL envs emit them), plus ``index``, ``step_id`` and
    ``priority_weight`` (TorchRL losses weight by it); with n-step also ``next/discount``
    and ``next/horizon``.
    """
    B = len(batch["reward"])
    t = _tensor
    td: dict[str, Any] = {}
    nxt: dict[str, Any] = {}
    for name, v in batch.items():
        where, key = _route(name)
        if where == "td":
            td[key] = t(v)
        elif where == "next":
            nxt[key] = t(v)
        elif where == "action":
            td.setdefault("action", {})[key] = t(v)
    term = t(batch["terminated"]).reshape(B, 1)
    trunc = t(batch["truncated"]).reshape(B, 1)
    nxt.update(reward=t(batch["reward"]).reshape(B, 1), terminated=term, truncated=trunc,
               done=term | trunc)
    for extra in ("discount", "horizon"):
        if extra in batch:
            nxt[extra] = t(batch[extra]).reshape(B, 1)
    td["next"] = nxt
    for key in ("index", "step_id"):
        if key in batch:
            td[key] = t(batch[key])
    if weights and "weight" in batch:
        td["priority_weight"] = t(batch["weight"])
    if device is None and _NEW_UNSAFE is not None:  # every value is [B, ...]: unchecked
        return _NEW_UNSAFE(td, batch_size=torch.Size([B]))
    return TensorDict(td, batch_size=[B], device=device)


#: TensorDict's constructor without its per-value checks (TorchRL builds its batches so);
#: about 10 µs less per batch
_NEW_UNSAFE = getattr(TensorDict, "_new_unsafe", None)


@functools.lru_cache(maxsize=256)
def _route(name: str) -> tuple[str, Any]:
    """Where a batch key goes: ``("td", key)``, ``("next", key)``, ``("action", key)``
    (a Dict action's key), or ``("", None)`` (placed by :func:`to_tensordict` itself)."""
    if name == "obs" or name.startswith("obs."):
        return "td", obs_key(name)
    if name.startswith("next_obs"):
        return "next", obs_key(name[5:])
    if name.startswith("action."):
        return "action", name[7:]
    return ("", None) if name in _BATCH_KEYS else ("td", name)


def _tensor(a: Any) -> torch.Tensor:
    """``a`` as a tensor sharing its memory where numpy allows."""
    if type(a) is np.ndarray and a.flags.writeable and a.flags.c_contiguous:
        return torch.from_numpy(a)
    return torch.as_tensor(np.ascontiguousarray(a))


# -- collector TensorDict -> store columns ---------------------------------------------------
class StepColumns:
    """Collector TensorDicts -> the store's flat fields (``next_<obs field>`` too), made
    once per spec: ``observation`` (or one key per Dict-space key), ``action`` (or its
    keys), user fields by name, ``next: {observation..., reward, terminated (or done),
    truncated}``."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        f = spec.fields
        #: (store field, TensorDict key, Field), besides reward and the flags
        self.inputs = [(n, obs_key(n), f[n]) for n in spec.obs_names]
        self.inputs += [("next_" + n, ("next", obs_key(n)), f[n]) for n in spec.obs_names]
        self.inputs += [(n, act_key(n), f[n]) for n in spec.action_names]
        self.inputs += [(n, n, f[n]) for n in f if n not in spec.obs_names
                        and n not in spec.action_names and n not in BUILTIN]

    def __call__(self, td: TensorDictBase, lead: tuple[int, ...]) -> dict[str, np.ndarray]:
        """The store's flat fields (``next_<obs field>`` too) of a ``lead``-shaped batch:
        numpy views of the TensorDict's tensors where their dtype is the field's, checked
        and cast (:func:`~expstore.validate.coerce`); errors name the TensorDict key."""
        out = {name: self._check(key, name, field, _array(td, key, name), lead)
               for name, key, field in self.inputs}
        fields = self.spec.fields
        reward = _array(td, ("next", "reward"), "reward")
        want = lead + fields["reward"].shape
        if reward.size == int(np.prod(want)):  # TorchRL's trailing 1
            reward = reward.reshape(want)
        out["reward"] = self._check(("next", "reward"), "reward", fields["reward"], reward,
                                    lead)
        term = td.get(("next", "terminated"), None)
        done = td.get(("next", "done"), None)
        if term is None and done is None:
            raise ValidationError("terminated: neither ('next', 'terminated') nor "
                                  "('next', 'done') is in the TensorDict")
        key = ("next", "terminated") if term is not None else ("next", "done")
        out["terminated"] = self._flag(key, "terminated", term if term is not None else done,
                                       lead)
        trunc = td.get(("next", "truncated"), None)
        if trunc is not None:
            out["truncated"] = self._flag(("next", "truncated"), "truncated", trunc, lead)
        elif done is not None:
            out["truncated"] = self._flag(("next", "done"), "truncated", done, lead) \
                & ~out["terminated"]
        else:
            out["truncated"] = np.zeros(lead, bool)
        return out

    def _check(self, key: Any, name: str, field: Field, value: np.ndarray,
               lead: tuple[int, ...]) -> np.ndarray:
        """``value`` checked and cast for ``field`` (a ``ValidationError`` names ``key``)."""
        try:
            return coerce(name, field, value, lead, self.spec.reject_nonfinite)
        except ValidationError as e:
            raise ValidationError(f"TensorDict key {key!r}: {e}") from None

    def _flag(self, key: Any, name: str, value: Any, lead: tuple[int, ...]) -> np.ndarray:
        """A ``[..., T, 1]`` reward-like flag as the ``lead``-shaped bool column ``name``."""
        arr = _numpy(value, key, name)
        if arr.size == int(np.prod(lead)):  # TorchRL's trailing 1
            arr = arr.reshape(lead)
        return self._check(key, name, self.spec.fields[name], arr, lead)


def _array(td: TensorDictBase, key: Any, what: str) -> np.ndarray:
    """The tensor at ``key`` as a numpy array (a view on CPU)."""
    v = td.get(key, None)
    if v is None:
        raise ValidationError(f"{what}: key {key!r} missing from the TensorDict "
                              f"(keys: {sorted(map(str, td.keys(True, True)))})")
    return _numpy(v, key, what)


def _numpy(v: Any, key: Any, what: str) -> np.ndarray:
    """A tensor as a numpy array (a view on CPU); anything else is refused naming ``key``."""
    if not isinstance(v, torch.Tensor):
        raise ValidationError(f"{what}: TensorDict key {key!r} holds a "
                              f"{type(v).__name__}, expected a tensor")
    return v.detach().cpu().numpy()
