"""The C kernel's plan of one store's per-step write path (``_step.c``).

:func:`build_plan` describes, once per store, what ``StepPlan.add`` needs to stage an env
step with one C call: each value field's dtype, shape, frame stack and the values the
Python checks (``expstore.step_check``) accept as they are, and the addresses of the
lanes' staging buffers (a :class:`~expstore.storage.write.lane_rows.LaneRows` table, which the
caller keeps current), the appender's episode positions and held ``next_obs`` and the
index's per-row arrays (given as arrays: storage does not know the index).

It returns ``None`` where the kernel was not built or the spec is not one it stages (a
structured obs or action, user fields, float16 or complex values, bounds an int64
comparison in float64 could get wrong): every step then takes the Python path, which
stores the same rows.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..native import step_kernel as native
from .lane_rows import LaneRows

VALUE_FIELDS = ("obs", "action", "reward", "terminated", "truncated")
_FLOAT_MAX = {4: 3.4028234663852886e38, 8: math.inf}
_FLOAT_EXACT_INT = {4: 2.0**24, 8: 2.0**53}
_META = {"_step_id": np.dtype(np.int64), "_episode_step": np.dtype(np.int32),
         "_flags": np.dtype(np.uint8)}


def _field(name: str, f: Any, index: int, reject_nonfinite: bool) -> tuple | None:
    """The kernel's description of value field ``f`` (``None``: not one it stages)."""
    dt = f.dtype
    if dt.byteorder == ">" or dt.kind not in "biuf" or (dt.kind == "f" and dt.itemsize not in
                                                        (4, 8)):
        return None
    if name in ("terminated", "truncated") and (dt.kind != "b" or f.shape != ()):
        return None
    elems = int(np.prod(f.shape, dtype=np.int64))
    lo = None if f.low is None else np.asarray(f.low, np.float64)
    hi = None if f.high is None else np.asarray(f.high, np.float64)
    for b in (lo, hi):  # compared in float64: exact only within 2**53
        if b is not None and dt.kind in "iu" and not (np.abs(b) < 2.0**53).all():
            return None
    alo = None if lo is None else np.array(np.broadcast_to(lo, f.shape).ravel())
    ahi = None if hi is None else np.array(np.broadcast_to(hi, f.shape).ravel())
    for b in (alo, ahi):
        if b is not None and len(b) != elems:
            return None
    ilo, ihi, flo, fhi, top, exact = 0, 0, -math.inf, math.inf, math.inf, 0.0
    if dt.kind in "iu":  # as step_check.check_int: the dtype's range within the bounds
        info = np.iinfo(dt)
        ilo = max(int(info.min), -(2**63))
        ihi = min(int(info.max), 2**63 - 1)
        if lo is not None:
            ilo = max(ilo, math.ceil(float(lo)) if lo.ndim == 0 else ilo)
        if hi is not None:
            ihi = min(ihi, math.floor(float(hi)) if hi.ndim == 0 else ihi)
        if f.shape == () and (lo is not None and lo.ndim or hi is not None and hi.ndim):
            return None
    elif dt.kind == "f":  # as step_check.check_float
        top, exact = _FLOAT_MAX[dt.itemsize], _FLOAT_EXACT_INT[dt.itemsize]
        if f.shape == ():
            if lo is not None and lo.ndim or hi is not None and hi.ndim:
                return None
            flo = -math.inf if lo is None else float(lo)
            fhi = math.inf if hi is None else float(hi)
    finite = int(reject_nonfinite and dt.kind == "f")
    return (index, dt.num, dt.kind, dt.itemsize, tuple(int(s) for s in f.shape),
            int(f.stack or 0), finite, ilo, ihi, flo, fhi, top, exact, alo, ahi)


def build_plan(spec: Any, table: LaneRows, open_step: np.ndarray, held_ok: np.ndarray,
               held_obs: np.ndarray, episode_step: np.ndarray, flags: np.ndarray,
               count: np.ndarray, valid_from: np.ndarray, committed: np.ndarray,
               lane_capacity: int, flag_bits: tuple[int, int, int, int]) -> Any:
    """A ``StepPlan`` of the store (see the module docstring), or ``None``.

    ``held_obs``: the held ``next_obs`` rows, ``(lanes, *obs shape)`` of the obs dtype;
    ``episode_step`` / ``flags`` / ``count`` / ``valid_from`` / ``committed``: the index's
    arrays; ``flag_bits``: FIRST, LAST, TERMINATED, TRUNCATED. The plan also keeps, per
    lane, what handing a full shard over touches (the writer's free and queued buffers,
    its thread's job ring and sleeping byte, the writer's gate byte), for ``hand_off`` in
    ``step_shards.h``.
    """
    if native is None:
        return None
    structure = {k: spec.structure.get(k, {"kind": "single"})["kind"] for k in ("obs", "action")}
    if set(structure.values()) != {"single"} or set(spec.fields) != set(VALUE_FIELDS):
        return None
    names = table.names
    if set(names) != set(VALUE_FIELDS) | set(_META):
        return None
    layout_fields = table.writers[next(j for j, w in enumerate(table.writers)
                                       if w is not None)].layout.fields
    if any(layout_fields[n].dtype != dt or layout_fields[n].shape != () for n, dt in
           _META.items()):
        return None
    fields = []
    for name in VALUE_FIELDS:
        d = _field(name, spec.fields[name], names.index(name), spec.reject_nonfinite)
        if d is None:
            return None
        fields.append(d)
    L = len(table.writers)
    held = held_obs.view(np.uint8).reshape(L, -1)
    arrays = (table.base, table.n, table.first, table.pub, open_step, count,
              held_ok, held, episode_step, flags, table.entered, valid_from, committed,
              table.rec)
    consts = (len(names), names.index("_step_id"), names.index("_episode_step"),
              names.index("_flags"), L, table.shard_rows, lane_capacity,
              *(int(b) for b in flag_bits))
    hands = tuple(None if w is None else (w._free, w.queued, w._worker.jobs.writers,
                                          w._worker.jobs.shards, w._worker.jobs.ends,
                                          w._worker.sleeping, w.gate) for w in table.writers)
    return native.StepPlan(arrays, tuple(fields), consts,
                           tuple(table.writers), table.curs, hands)
