"""Checking and casting user values against fields before anything is stored."""

from __future__ import annotations

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
    _check_bounds(name, field, arr)
    return arr


def _cast(name: str, field: Field, arr: np.ndarray) -> np.ndarray:
    dst = field.dtype
    src = arr.dtype
    if src == dst:
        return arr
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


def _check_bounds(name: str, field: Field, arr: np.ndarray) -> None:
    checks = ((field.low, np.less, "below low"), (field.high, np.greater, "above high"))
    for bound, op, word in checks:
        if bound is None:
            continue
        bad = op(arr, bound)
        if np.any(bad):
            where = tuple(np.argwhere(bad)[0].tolist())
            b = np.broadcast_to(np.asarray(bound), field.shape)
            limit = b[where[len(where) - len(field.shape):]] if field.shape else b
            raise ValidationError(
                f"{name}: value {arr[where]} at {where} is {word} bound {limit} "
                f"(expected {field.low}..{field.high})"
            )


def validate_steps(spec: Spec, obs: Any, action: Any, reward: Any, next_obs: Any,
                   terminated: Any, truncated: Any, extras: dict[str, Any],
                   lead: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Steps given to ``add``/``extend`` as arrays of ``lead + field shape`` per field
    (``next_<obs>`` where an episode ends, ``next_<user field>`` where given), cast and
    checked; raises :class:`ValidationError` naming the field before anything is stored.
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
    done = out["terminated"] | out["truncated"]
    if np.any(done):
        if next_obs is None:
            raise ValidationError("next_obs: required for steps that end an episode "
                                  "(terminated or truncated)")
        for name, v in spec.flatten("obs", next_obs).items():
            out["next_" + name] = coerce("next_" + name, spec.fields[name], v, lead,
                                         nonfinite)
    return out
