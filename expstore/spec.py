"""What a store holds: named fields with shapes, dtypes, bounds, frame stacking and codecs.

A :class:`Spec` is a flat mapping ``name -> Field``. Observation fields are named ``obs``
(one observation) or ``obs.<key>`` (Dict / Tuple observations); action fields likewise
``action`` or ``action.<key>``. ``reward``, ``terminated`` and ``truncated`` always exist.
Any other name is a user field stored per step (e.g. ``goal``, ``log_prob``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .errors import SpecError, ValidationError
from .field import Field
from .spaces import fields_from_space, space_kind

#: Names the store reserves for its own per-row metadata arrays.
RESERVED = ("_step_id", "_episode_step", "_flags", "index", "weight", "step_id")
BUILTIN = ("reward", "terminated", "truncated")


@dataclass(frozen=True)
class Spec:
    """Fields of a store by name. Build with :meth:`create` or :meth:`from_spaces`."""

    fields: dict[str, Field] = field(default_factory=dict)
    #: how ``obs``/``action`` were flattened: ``{"obs": "box"|"dict"|"tuple", ...}``
    structure: dict[str, Any] = field(default_factory=dict)
    #: reject NaN/inf in float fields on write (``False`` stores them as they are)
    reject_nonfinite: bool = True

    def __post_init__(self) -> None:
        for name in self.fields:
            if name in RESERVED or name.startswith("_") or "/" in name or not name:
                raise SpecError(f"field name {name!r} is reserved or invalid")
            if name.startswith("next_obs"):
                raise SpecError(f"field name {name!r}: next observations are derived, not stored")
        for name in BUILTIN:
            if name not in self.fields:
                raise SpecError(f"Spec is missing the builtin field {name!r}")
        if not self.obs_names:
            raise SpecError("Spec needs at least one observation field ('obs' or 'obs.<key>')")

    # -- construction -------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        obs: Field | Mapping[str, Field],
        action: Field | Mapping[str, Field],
        reward: Field | None = None,
        extras: Mapping[str, Field] | None = None,
        reject_nonfinite: bool = True,
    ) -> Spec:
        """Spec from observation/action fields (one Field, or a mapping for Dict spaces)."""
        for arg, value in (("obs", obs), ("action", action)):
            if not isinstance(value, Field):
                _check_fields(arg, value)
        if reward is not None and not isinstance(reward, Field):
            _check_fields("reward", reward, mapping=False)
        if extras is not None:
            _check_fields("extras", extras, allow_single=False)
        fields: dict[str, Field] = {}
        structure: dict[str, Any] = {}
        for prefix, value in (("obs", obs), ("action", action)):
            if isinstance(value, Field):
                fields[prefix] = value
                structure[prefix] = {"kind": "single"}
            else:
                keys = list(value)
                for k in keys:
                    fields[f"{prefix}.{k}"] = value[k]
                structure[prefix] = {"kind": "dict", "keys": [str(k) for k in keys]}
        fields["reward"] = reward or Field((), np.float32)
        fields["terminated"] = Field((), np.bool_)
        fields["truncated"] = Field((), np.bool_)
        for k, f in (extras or {}).items():
            if k in fields:
                raise SpecError(f"extra field {k!r} clashes with a builtin field")
            fields[k] = f
        return cls(fields, structure, reject_nonfinite)

    @classmethod
    def from_spaces(
        cls,
        observation_space: Any,
        action_space: Any,
        frame_stack: int | None = None,
        extras: Mapping[str, Field] | None = None,
        padding: str = "reset",
        out_of_bounds: str = "raise",
    ) -> Spec:
        """Spec from Gymnasium spaces (Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple).

        With ``frame_stack=k`` an observation space of shape ``(k, H, W)`` (as produced by
        ``FrameStackObservation``) is stored one frame per row; other image-like Box spaces
        ``(H, W)``/``(H, W, C)`` get ``stack=k`` on their own shape. ``out_of_bounds``
        (``"raise"``, ``"clip"`` or ``"warn"``) is given to the action's Box fields: what a
        write does with an action outside the Box (see :class:`Field`).

        The spaces of one env: for a Gymnasium vector env pass ``env.single_observation_space``
        and ``env.single_action_space`` (its ``observation_space`` is batched, one entry per
        env; that is refused) and create the store with ``lanes=env.num_envs``.
        """
        _refuse_vector_spaces(observation_space, action_space)
        obs = fields_from_space(
            observation_space, frame_stack=frame_stack, padding=padding, box_bounds=False
        )
        act = fields_from_space(action_space)
        if out_of_bounds != "raise":
            act = {k: replace(f, out_of_bounds=out_of_bounds) if
                   _space_kind(_leaf(action_space, k)) == "Box" else f for k, f in act.items()}
        spec = cls.create(
            obs if set(obs) != {""} else obs[""],
            act if set(act) != {""} else act[""],
            extras=extras,
        )
        kinds = {"obs": _space_kind(observation_space), "action": _space_kind(action_space)}
        structure = {k: {**spec.structure[k], "space": kinds[k]} for k in ("obs", "action")}
        return replace(spec, structure=structure)

    # -- views -------------------------------------------------------------------------
    @property
    def obs_names(self) -> list[str]:
        return [n for n in self.fields if n == "obs" or n.startswith("obs.")]

    @property
    def action_names(self) -> list[str]:
        return [n for n in self.fields if n == "action" or n.startswith("action.")]

    def flatten(self, prefix: str, value: Any) -> dict[str, Any]:
        """Turn a user's ``obs``/``action`` (array, dict or tuple) into ``{field: array}``."""
        st = self.structure.get(prefix, {"kind": "single"})
        if st["kind"] == "single":
            return {prefix: value}
        keys = st["keys"]
        if isinstance(value, Mapping):
            missing = [k for k in keys if k not in value and _maybe_int(k) not in value]
            if missing:
                raise ValidationError(
                    f"{prefix}: missing key(s) {missing}; expected keys {keys}, "
                    f"got {list(value)}"
                )
            return {f"{prefix}.{k}": value[k] if k in value else value[_maybe_int(k)] for k in keys}
        if isinstance(value, (tuple, list)) and len(value) == len(keys):
            return {f"{prefix}.{k}": v for k, v in zip(keys, value)}
        raise ValidationError(
            f"{prefix}: expected a dict with keys {keys} or a tuple of {len(keys)}, "
            f"got {type(value).__name__}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "fields": {k: f.to_json() for k, f in self.fields.items()},
            "structure": self.structure,
            "reject_nonfinite": self.reject_nonfinite,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Spec:
        return cls(
            {k: Field.from_json(v) for k, v in d["fields"].items()},
            dict(d.get("structure", {})),
            bool(d.get("reject_nonfinite", True)),
        )

    def same_as(self, other: Spec) -> bool:
        return json.dumps(self.to_json(), sort_keys=True) == json.dumps(
            other.to_json(), sort_keys=True
        )

    def diff(self, other: Spec) -> list[str]:
        """Every difference, human-readable, for errors on open with a mismatched spec
        (fields and their settings, how obs/action were flattened, ``reject_nonfinite``);
        empty exactly when :meth:`same_as`."""
        ja, jb = self.to_json(), other.to_json()
        a, b = ja.pop("fields"), jb.pop("fields")
        out = [f"field {k!r} only in the store" for k in a if k not in b]
        out += [f"field {k!r} only in the given spec" for k in b if k not in a]
        for k in a:
            if k in b and a[k] != b[k]:
                out += [f"field {k!r}: {x} is {a[k].get(x)!r} in the store, {b[k].get(x)!r} "
                        "given" for x in _union(a[k], b[k]) if a[k].get(x) != b[k].get(x)]
        sa, sb = ja.pop("structure", {}), jb.pop("structure", {})
        out += [f"structure of {k!r}: {sa.get(k)!r} in the store, {sb.get(k)!r} given"
                for k in _union(sa, sb) if sa.get(k) != sb.get(k)]
        out += [f"{k}: {ja.get(k)!r} in the store, {jb.get(k)!r} given"
                for k in _union(ja, jb) if ja.get(k) != jb.get(k)]
        if not out and not self.same_as(other):  # e.g. the same fields in another order
            out.append(f"spec JSON differs: {json.dumps(self.to_json(), sort_keys=True)} in "
                       f"the store, {json.dumps(other.to_json(), sort_keys=True)} given")
        return out


def _maybe_int(k: str) -> Any:
    return int(k) if k.isdigit() else k


def _union(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    return list(a) + [k for k in b if k not in a]


def _what(value: Any) -> str:
    t = type(value)
    return f"{t.__module__}.{t.__qualname__} {value!r}"[:200]


def _is_space(value: Any) -> bool:
    return type(value).__module__.split(".")[0] in ("gymnasium", "gym") or (
        hasattr(value, "sample") and hasattr(value, "contains") and hasattr(value, "shape"))


def _check_fields(arg: str, value: Any, mapping: bool = True,
                  allow_single: bool = True) -> None:
    """``value`` must be a Field (``allow_single``) or a mapping of Fields (``mapping``)."""
    want = " or ".join(w for w, ok in (("a Field", allow_single),
                                       ("a mapping of name -> Field", mapping)) if ok)
    got = value
    if mapping and isinstance(value, Mapping) and not _is_space(value):
        bad = [(k, v) for k, v in value.items() if not isinstance(v, Field)]
        if not bad:
            return
        key, got = bad[0]
        arg, want = f"{arg}[{key!r}]", "a Field"
    hint = ("; for Gymnasium spaces use Spec.from_spaces(observation_space, action_space)"
            if _is_space(got) else "")
    raise SpecError(f"{arg}: expected {want}, got {_what(got)}{hint}")


def _leaf(space: Any, key: str) -> Any:
    """The sub-space of a Dict/Tuple space behind a field key of ``fields_from_space``."""
    if key == "":
        return space
    subs = space.spaces
    return subs[int(key)] if _space_kind(space) == "Tuple" else subs[key]


def _batched(space: Any, leaf_ndim: int) -> int | None:
    """``N`` when ``space`` looks like Gymnasium's ``batch_space(single, N)`` (a vector
    env's space: the same sub-space ``N >= 2`` times along a new leading axis), else None.
    ``leaf_ndim``: dimensions a batched Box must have at least."""
    kind = _space_kind(space)
    if kind in ("Dict", "Tuple"):
        subs = list(space.spaces.values() if kind == "Dict" else space.spaces)
        ns = {_batched(s, leaf_ndim) for s in subs}
        return ns.pop() if len(ns) == 1 and subs else None
    if kind == "MultiDiscrete":
        nvec = np.asarray(space.nvec)
        start = np.asarray(getattr(space, "start", np.zeros_like(nvec)))
        if nvec.ndim == 1 and len(nvec) >= 2 and (nvec == nvec[0]).all() and (
                start == start[0]).all():
            return len(nvec)
        return None
    shape = tuple(getattr(space, "shape", None) or ())
    if kind == "MultiBinary" and len(shape) >= 2 and shape[0] >= 2:
        return shape[0]
    if kind == "Box" and len(shape) >= leaf_ndim and shape[0] >= 2:
        low, high = np.asarray(space.low), np.asarray(space.high)
        if low.shape == shape and (low == low[:1]).all() and (high == high[:1]).all():
            return shape[0]
    return None


def _brief(space: Any) -> str:
    if _space_kind(space) == "Box":
        return f"Box(shape={tuple(space.shape)}, {np.dtype(space.dtype)})"
    text = repr(space)
    return text if len(text) <= 120 else text[:117] + "..."


def _refuse_vector_spaces(observation_space: Any, action_space: Any) -> None:
    """Refuse a vector env's batched spaces: both have the same leading ``num_envs`` axis
    (a Discrete action batched into MultiDiscrete ``[n] * num_envs``)."""
    n = _batched(observation_space, 2)
    if n is None or _batched(action_space, 2) != n:
        return
    raise SpecError(
        f"observation_space {_brief(observation_space)} and action_space "
        f"{_brief(action_space)} look like the "
        f"batched spaces of a Gymnasium vector env with {n} envs (num_envs={n} along a leading "
        "axis). Pass env.single_observation_space and env.single_action_space, and create the "
        f"store with lanes=num_envs (es.create(..., lanes={n})) so each env writes its own "
        "lane. If one step really holds these shapes, build the spec with Spec.create and "
        "Fields of those shapes")


def _space_kind(space: Any) -> str:
    return space_kind(space)
