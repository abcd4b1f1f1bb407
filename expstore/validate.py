"""Checking and casting user values against fields before anything is stored."""

from __future__ import annotations

import sys
import warnings
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import ValidationError
from .field import Field
from .spec import BUILTIN, Spec


def coerce(name: str, field: Field, value: Any, lead: tuple[int, ...],
           nonfinite: bool) -> np.ndarray:
    """Return ``value`` as an array of shape ``lead + stored_shape`` and the field's dtype.

    ``lead`` is the leading batch shape (``()`` for one step, ``(T,)`` or ``(num_envs,)``).
    A stacked field accepts either one frame or a full ``(k, *shape)`` stack (its newest
    frame is stored). Raises :class:`ValidationError` naming the field, expected and got.
    """
    if value is None:
        raise ValidationError(f"{name}: missing value; expected shape {lead + field.shape} "
                              f"of dtype {field.dtype}")
    arr = np.asarray(value)
    want = lead + field.shape
    if field.stack and arr.shape == lead + (field.stack,) + field.shape:
        arr = arr[(slice(None),) * len(lead) + (-1,)]
    if arr.shape != want:
        if arr.size == int(np.prod(want)) and arr.ndim == 0 and want == ():
            pass
        else:
            extra = f" or {lead + (field.stack,) + field.shape}" if field.stack else ""
            raise ValidationError(f"{name}: expected shape {want}{extra}, got {arr.shape}")
    arr = _cast(name, field, arr)
    if nonfinite and field.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0].tolist()
        raise ValidationError(f"{name}: expected finite values, got {arr[tuple(bad)]} at "
                              f"{tuple(bad)} (reject_nonfinite=True)")
    return _check_bounds(name, field, arr)


def _cast(name: str, field: Field, arr: np.ndarray) -> np.ndarray:
    dst = field.dtype
    src = arr.dtype
    if src == dst:
        return arr
    if src.kind in "iu" and dst.kind == "f":
        return _int_to_float(name, arr, dst)
    if np.can_cast(src, dst, "safe"):
        return arr.astype(dst)
    if src.kind == dst.kind == "f":  # float64 -> float32: allowed, precision loss only
        return arr.astype(dst)
    if src.kind in "iub" and dst.kind in "iu":
        info = np.iinfo(dst)
        if arr.size == 0 or (arr.min() >= info.min and arr.max() <= info.max):
            return arr.astype(dst)
        raise ValidationError(f"{name}: value(s) {arr.min()}..{arr.max()} do not fit dtype {dst}")
    if src.kind in "iu" and dst.kind == "b":
        if np.all((arr == 0) | (arr == 1)):
            return arr.astype(dst)
    if src.kind == "f" and dst.kind in "iu" and np.all(np.mod(arr, 1) == 0):
        return _cast(name, field, arr.astype(np.int64))
    raise ValidationError(f"{name}: dtype {src} cannot be cast safely to {dst}")


def _int_to_float(name: str, arr: np.ndarray, dst: np.dtype) -> np.ndarray:
    """Integers into a float field: accepted when every value is held exactly (python and
    numpy ints: FrozenLake rewards, integer observations), refused naming a value that
    would change (int64 ``2**40 + 1`` into float32)."""
    src = arr.dtype
    with np.errstate(invalid="ignore", over="ignore"):
        out = arr.astype(dst)
    bits = src.itemsize * 8 - (src.kind == "i")  # magnitude bits of the integer type
    if bits <= np.finfo(dst).nmant + 1 or arr.size == 0:  # every value fits exactly
        return out
    top = 2.0 ** bits
    with np.errstate(invalid="ignore", over="ignore"):
        fits = np.isfinite(out) & (out < top) & (out >= (-top if src.kind == "i" else 0.0))
        exact = fits & (np.where(fits, out, 0).astype(src) == arr)
    if exact.all():
        return out
    at = tuple(np.argwhere(~exact)[0].tolist())
    where = f" at {at}" if at else ""
    raise ValidationError(
        f"{name}: {src} value {arr[at]}{where} cannot be stored exactly as {dst} (it would "
        f"become {out[at].item()!r}); give the field a dtype that holds it (e.g. int64 or float64) "
        "or convert the value before adding it")


#: fields that already warned about a value outside their bounds (``out_of_bounds="warn"``)
_WARNED: dict[int, weakref.ref[Field]] = {}


def _check_bounds(name: str, field: Field, arr: np.ndarray) -> np.ndarray:
    """``arr`` when it lies within the field's bounds; otherwise what the field's
    ``out_of_bounds`` says: raise (naming the value), clip to the bounds, or warn."""
    checks = ((field.low, np.less, "below low"), (field.high, np.greater, "above high"))
    for bound, op, word in checks:
        if bound is None:
            continue
        bad = op(arr, bound)
        if not np.any(bad):
            continue
        if field.out_of_bounds == "clip":
            return _clip(field, arr)
        where = tuple(np.argwhere(bad)[0].tolist())
        b = np.broadcast_to(np.asarray(bound), field.shape)
        limit = b[where[len(where) - len(field.shape):]] if field.shape else b
        what = (f"{name}: value {arr[where]} at {where} is {word} bound {limit} "
                f"(expected {field.low}..{field.high})")
        if field.out_of_bounds == "warn":
            ref = _WARNED.get(id(field))
            if ref is None or ref() is not field:
                _WARNED[id(field)] = weakref.ref(field)
                warnings.warn(f"{what}; stored as given (out_of_bounds='warn': this field "
                              "warns once)", stacklevel=_caller_level())
            return arr
        raise ValidationError(
            f"{what}. To store such values clipped to the bounds, pass "
            "Field(..., out_of_bounds='clip') (or 'warn' to store them as given), or "
            "Spec.from_spaces(..., out_of_bounds='clip') for Box actions")
    return arr


def _caller_level() -> int:
    """``stacklevel`` of the first frame outside expstore (the user's ``add``/``extend``)."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("expstore."):
        level, frame = level + 1, frame.f_back
    return level


def _clip(field: Field, arr: np.ndarray) -> np.ndarray:
    low, high = field.low, field.high
    if field.dtype.kind in "iu":  # inclusive bounds of an integer field: whole numbers
        low = None if low is None else np.ceil(low)
        high = None if high is None else np.floor(high)
    return np.clip(arr, low, high).astype(field.dtype, copy=False)


def validate_steps(spec: Spec, obs: Any, action: Any, reward: Any, next_obs: Any,
                   terminated: Any, truncated: Any, extras: dict[str, Any],
                   lead: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Steps given to ``add``/``extend`` as arrays of ``lead + field shape`` per field
    (``next_<obs field>`` when ``next_obs`` is given: required where an episode ends;
    ``next_<user field>`` where given), cast and checked; raises :class:`ValidationError`
    naming the field before anything is stored.
    """
    nonfinite = spec.reject_nonfinite
    out: dict[str, np.ndarray] = {}
    given = {**spec.flatten("obs", obs), **spec.flatten("action", action),
             "reward": reward, "terminated": terminated, "truncated": truncated}
    # ``next_<user field>``: the field's value at the next row, kept for final rows
    nxt = {k: v for k, v in extras.items() if k not in spec.fields
           and k.startswith("next_") and k[5:] in spec.fields and k[5:] not in BUILTIN
           and k[5:] not in spec.obs_names and k[5:] not in spec.action_names}
    extras = {k: v for k, v in extras.items() if k not in nxt}
    unknown = [k for k in extras if k not in spec.fields]
    if unknown:
        raise ValidationError(f"unknown field(s) {unknown}; the spec has "
                              f"{list(spec.fields)}")
    given.update(extras)
    for name, f in spec.fields.items():
        out[name] = coerce(name, f, given.get(name), lead, nonfinite)
    for k, v in nxt.items():
        out[k] = coerce(k, spec.fields[k[5:]], v, lead, nonfinite)
    if next_obs is None:
        if np.any(out["terminated"] | out["truncated"]):
            raise ValidationError("next_obs: required for steps that end an episode "
                                  "(terminated or truncated)")
    else:
        for name, v in spec.flatten("obs", next_obs).items():
            out["next_" + name] = coerce("next_" + name, spec.fields[name], v, lead,
                                         nonfinite)
    return out


STEP_KEYS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
STEP_FORM = ("add(obs=..., action=..., reward=..., next_obs=..., terminated=..., "
              "truncated=...) or add({'obs': ..., 'action': ..., 'reward': ..., ...})")


def step_from_mapping(step: Any, next_obs: Any, terminated: Any, truncated: Any,
                  extras: dict[str, Any]) -> tuple[Any, ...]:
    """``add``'s arguments from a step given as one mapping (clear errors for neither form,
    both forms, or missing keys)."""
    others = [k for k, v in (("next_obs", next_obs), ("terminated", terminated),
                             ("truncated", truncated)) if v is not None] + list(extras)
    if step is None:
        got = f" (got only {others})" if others else ""
        raise ValidationError(f"add: no step given{got}; expected {STEP_FORM}")
    if not isinstance(step, Mapping):
        raise ValidationError(f"add: action and reward are missing; expected {STEP_FORM}")
    if others:
        raise ValidationError(f"add: give the step either as one mapping or as keywords, "
                              f"not both (got a mapping and {others})")
    missing = [k for k in ("obs", "action", "reward", "terminated", "truncated")
               if k not in step]
    if missing:
        raise ValidationError(f"add: the step mapping lacks key(s) {missing} (got keys "
                              f"{list(step)}); expected {STEP_FORM}")
    rest = {k: v for k, v in step.items() if k not in STEP_KEYS}
    return (step["obs"], step["action"], step["reward"], step.get("next_obs"),
            step["terminated"], step["truncated"], rest)


def extend_batch(batch: Mapping[str, Any] | None, fields: dict[str, Any]) -> Mapping[str, Any]:
    """``extend``'s steps, given as one mapping (``batch``) or as keywords (``fields``),
    never both."""
    if batch is None:
        if not fields:
            raise ValidationError("extend: no steps given; expected a mapping "
                                  "extend({'obs': ..., 'action': ..., ...}) or keywords "
                                  "extend(obs=..., action=..., ...)")
        return fields
    if fields:
        raise ValidationError(f"extend: give the steps either as one mapping or as "
                              f"keywords, not both (got a mapping and {sorted(fields)})")
    return batch


def validate_batch(spec: Spec, batch: Any) -> dict[str, np.ndarray]:
    """``extend``'s ``T`` steps (field -> values with leading axis ``T``), checked and cast
    (:func:`validate_steps`); ``ValidationError`` naming what is wrong."""
    try:
        b = dict(batch)
    except (TypeError, ValueError) as e:
        raise ValidationError(f"extend: expected a mapping of field -> values with "
                              f"leading axis T, got {type(batch).__name__}") from e
    missing = [k for k in ("obs", "action", "reward", "terminated", "truncated")
               if k not in b]
    if missing:
        raise ValidationError(f"extend: missing key(s) {missing}")
    try:
        T = len(b["reward"])
    except TypeError as e:
        raise ValidationError("reward: expected an array with leading axis T") from e
    known = {"obs", "action", "reward", "terminated", "truncated", "next_obs"}
    extras = {k: v for k, v in b.items() if k not in known}
    return validate_steps(spec, b["obs"], b["action"], b["reward"], b.get("next_obs"),
                          b["terminated"], b["truncated"], extras, (T,))


def refuse_many_steps(spec: Spec, reward: np.ndarray, lane: int, lanes: int,
                      writable: int) -> None:
    """Raise when ``reward`` holds ``N >= 2`` steps (a vector env's ``num_envs`` axis)
    for a call that writes one step into one ``lane`` (of ``lanes``; ``writable`` lanes
    open for writing here)."""
    n = len(reward)
    if n < 2 or reward.shape != (n, *spec.fields["reward"].shape):
        return  # not N steps: the field checks report what is wrong
    why = ("the store has 1 lane" if lanes == 1 else
           f"this Store writes lane {lane} only" if writable == 1 else
           f"lane={lane} was given")
    raise ValidationError(
        f"add: reward has shape {reward.shape}: {n} steps at once, as a vector env of {n} "
        f"envs gives, but this call writes one step into lane {lane} ({why}). Create the "
        f"store with lanes=num_envs (es.create(..., lanes={n})) and call add(...) without "
        "lane= to write one step per lane, or add each env's step with lane=i")


def check_bytes(name: str, value: Any) -> None:
    """A ValueError naming ``name`` unless ``value`` is None or an int >= 0 (bytes)."""
    if value is not None and (isinstance(value, bool) or
                              not isinstance(value, (int, np.integer)) or value < 0):
        raise ValueError(f"{name}: expected an int >= 0 (bytes), got {value!r}")

