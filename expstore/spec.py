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
from .spaces import fields_from_space

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
    ) -> Spec:
        """Spec from Gymnasium spaces (Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple).

        With ``frame_stack=k`` an observation space of shape ``(k, H, W)`` (as produced by
        ``FrameStackObservation``) is stored one frame per row; other image-like Box spaces
        ``(H, W)``/``(H, W, C)`` get ``stack=k`` on their own shape.
        """
        obs = fields_from_space(
            observation_space, frame_stack=frame_stack, padding=padding, box_bounds=False
        )
        act = fields_from_space(action_space)
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
        """Human-readable differences, for errors on open with a mismatched spec."""
        a, b = self.to_json()["fields"], other.to_json()["fields"]
        out = [f"field {k!r} only in the store" for k in a if k not in b]
        out += [f"field {k!r} only in the given spec" for k in b if k not in a]
        for k in a:
            if k in b and a[k] != b[k]:
                keys = [x for x in a[k] if a[k][x] != b[k].get(x)]
                out += [f"field {k!r}: {x} is {a[k][x]!r} in the store, {b[k][x]!r} given"
                        for x in keys]
        return out


def _maybe_int(k: str) -> Any:
    return int(k) if k.isdigit() else k


def _space_kind(space: Any) -> str:
    return type(space).__name__
