"""Per-step value checks compiled once per spec: the cheap path of ``Store.add``.

:func:`coerce` (``validate.py``) handles any value: nested lists, casts, frame stacks given
whole. Most steps of a training loop are simpler: a python or numpy scalar for each scalar
field, an array of exactly the field's dtype and shape for the others. A
:class:`StepCheck` tests for exactly that with a few type and comparison checks (no numpy
reductions for fields without bounds) and hands anything else to :func:`coerce`, which
accepts or rejects it with its error message. Both paths store the same values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .field import Field
from .validate import coerce

Check = Callable[[Any], Any]  # value -> value ready to write into a row (or raises)

_FLOAT_MAX = {np.dtype(np.float16): 65504.0, np.dtype(np.float32): 3.4028234663852886e38,
              np.dtype(np.float64): math.inf}
_FLOAT_EXACT_INT = {np.dtype(np.float16): 2**11, np.dtype(np.float32): 2**24,
                    np.dtype(np.float64): 2**53}


def field_check(name: str, field: Field, nonfinite: bool) -> Check:
    """A check of one value of ``field`` for one step (see the module docstring)."""

    def slow(v: Any) -> Any:
        return coerce(name, field, v, (), nonfinite)

    dtype, shape = field.dtype, field.shape
    if shape != ():
        return _array_check(field, nonfinite, slow)
    kind = dtype.kind
    lo = None if field.low is None else float(np.asarray(field.low))
    hi = None if field.high is None else float(np.asarray(field.high))
    if kind == "b":
        def check_bool(v: Any) -> Any:
            return v if v is True or v is False or type(v) is np.bool_ else slow(v)
        return check_bool
    if kind in "iu":
        info = np.iinfo(dtype)
        low = info.min if lo is None else max(info.min, math.ceil(lo))
        high = info.max if hi is None else min(info.max, math.floor(hi))

        def check_int(v: Any) -> Any:
            if (type(v) is int or isinstance(v, np.integer)) and low <= v <= high:
                return v
            return slow(v)
        return check_int
    if kind == "f":
        top = _FLOAT_MAX[dtype]
        exact = _FLOAT_EXACT_INT[dtype]
        low_f = -math.inf if lo is None else lo
        high_f = math.inf if hi is None else hi

        def check_float(v: Any) -> Any:
            t = type(v)
            if t is float or t is np.float64 or t is np.float32:
                if not -top <= v <= top:  # nan, inf or beyond the dtype: the general path
                    return slow(v)
            elif not (t is int and -exact <= v <= exact):
                return slow(v)
            return v if low_f <= v <= high_f else slow(v)
        return check_float
    return slow


def _array_check(field: Field, nonfinite: bool, slow: Check) -> Check:
    dtype, shape = field.dtype, field.shape
    finite = nonfinite and dtype.kind == "f"
    lo = None if field.low is None else np.asarray(field.low)
    hi = None if field.high is None else np.asarray(field.high)

    stacked = (field.stack, *shape) if field.stack else None
    # a few values: their sum as python floats (cheaper than a numpy call; a nan or inf
    # makes it non-finite, finite float32 values cannot overflow it); more: a dot product
    small = int(np.prod(shape, dtype=np.int64)) <= 64

    def check_array(v: Any) -> Any:
        if type(v) is not np.ndarray or v.dtype != dtype:
            return slow(v)
        if v.shape != shape:
            if v.shape != stacked:
                return slow(v)
            v = v[-1]  # a whole frame stack given: its newest frame is stored
        if finite and not math.isfinite(sum(v.ravel().tolist()) if small
                                        else float(v.ravel().dot(v.ravel()))):
            return slow(v)  # a nan or inf, or a sum beyond the dtype: checked exactly
        if lo is not None and (v < lo).any() or hi is not None and (v > hi).any():
            return slow(v)
        return v
    return check_array


class StepCheck:
    """The checks of every field of a spec, for one step: ``check[name](value)``; the
    observation fields' checks for a ``next_obs`` (named so in errors): ``check.next[name]``."""

    def __init__(self, spec: Any) -> None:
        nonfinite = spec.reject_nonfinite
        self.checks: dict[str, Check] = {name: field_check(name, f, nonfinite)
                                         for name, f in spec.fields.items()}
        self.next: dict[str, Check] = {name: field_check("next_" + name, spec.fields[name],
                                                         nonfinite)
                                       for name in spec.obs_names}

    def __getitem__(self, name: str) -> Check:
        return self.checks[name]


class LanesCheck:
    """The checks of one step per lane (values with leading axis ``lanes``) for the common
    case: a single obs and action field, no user fields, every value an array of exactly
    the field's dtype (floats: any float dtype, cast as :func:`coerce` casts them) and shape
    ``(lanes, *shape)`` (a stacked field's whole stacks accepted: their newest frames are
    kept), finite and within bounds. ``check(...)`` returns ``validate_steps``' arrays for
    such a step, else ``None``: the caller then runs ``validate_steps``, which handles any
    value and names the error. Both give the same arrays.
    """

    def __init__(self, spec: Any, lanes: int) -> None:
        fields = spec.fields
        kinds = {spec.structure.get(k, {"kind": "single"})["kind"] for k in ("obs", "action")}
        user = [n for n in fields if n not in ("obs", "action", "reward", "terminated",
                                               "truncated")]
        self.usable = kinds == {"single"} and not user
        self.fields = {}
        for name in ("obs", "action", "reward", "terminated", "truncated"):
            if name not in fields:
                self.usable = False
                continue
            f = fields[name]
            self.fields[name] = (
                f.dtype, (lanes, *f.shape), (lanes, f.stack, *f.shape) if f.stack else None,
                spec.reject_nonfinite and f.dtype.kind == "f",
                None if f.low is None else np.asarray(f.low),
                None if f.high is None else np.asarray(f.high))

    def check(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any,
              truncated: Any, extras: dict[str, Any]) -> dict[str, np.ndarray] | None:
        if not self.usable or extras:
            return None
        out = {}
        for name, v in (("obs", obs), ("action", action), ("reward", reward),
                        ("terminated", terminated), ("truncated", truncated)):
            v = self._value(name, v)
            if v is None:
                return None
            out[name] = v
        if next_obs is None:
            return None  # (required where an episode ends: validate_steps says so)
        v = self._value("obs", next_obs)
        if v is None:
            return None
        out["next_obs"] = v
        return out

    def _value(self, name: str, v: Any) -> np.ndarray | None:
        dtype, want, stacked, finite, lo, hi = self.fields[name]
        if type(v) is not np.ndarray:
            return None
        if v.dtype != dtype:
            if not (v.dtype.kind == "f" and dtype.kind == "f"):
                return None
            v = v.astype(dtype)  # as coerce casts floats (precision only)
        if v.shape != want:
            if v.shape != stacked:
                return None
            v = v[:, -1]  # whole frame stacks given: their newest frames are stored
        if finite:
            r = v.ravel()
            if not math.isfinite(float(r.dot(r))):  # a nan or inf (or squares beyond the
                return None  # dtype): the general path checks it exactly
        if lo is not None and (v < lo).any() or hi is not None and (v > hi).any():
            return None
        return v
