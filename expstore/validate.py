"""Checking and casting user values against fields before anything is stored."""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import ValidationError
from .spec import Field


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
