"""Gymnasium spaces -> :class:`~expstore.spec.Field` mappings (used by ``Spec.from_spaces``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import SpecError
from .spec import Field


def fields_from_space(
    space: Any, frame_stack: int | None = None, padding: str = "reset", box_bounds: bool = True
) -> dict[str, Field]:
    """Flatten a space into ``{key: Field}``; a non-composite space gives ``{"": Field}``.

    ``box_bounds=False`` drops Box bounds (observation Boxes: real envs often leave them).
    """
    name = type(space).__name__
    if name == "Dict":
        out: dict[str, Field] = {}
        for k, sub in space.spaces.items():
            out[str(k)] = _leaf(sub, frame_stack, padding, box_bounds)
        return out
    if name == "Tuple":
        return {str(i): _leaf(sub, frame_stack, padding, box_bounds)
                for i, sub in enumerate(space.spaces)}
    return {"": _leaf(space, frame_stack, padding, box_bounds)}


def _leaf(space: Any, frame_stack: int | None, padding: str, box_bounds: bool) -> Field:
    name = type(space).__name__
    if name == "Discrete":
        start = int(getattr(space, "start", 0))
        return Field((), np.int64, low=start, high=start + int(space.n) - 1)
    if name == "MultiDiscrete":
        nvec = np.asarray(space.nvec)
        start = np.asarray(getattr(space, "start", np.zeros_like(nvec)))
        return Field(nvec.shape, np.int64, low=start, high=start + nvec - 1)
    if name == "MultiBinary":
        shape = (int(space.n),) if np.isscalar(space.n) else tuple(space.n)
        return Field(shape, np.int8, low=0, high=1)
    if name == "Box":
        shape = tuple(space.shape)
        dtype = np.dtype(space.dtype)
        low, high = np.asarray(space.low), np.asarray(space.high)
        is_image = dtype == np.uint8 and len(shape) >= 2
        if frame_stack and is_image:
            if len(shape) == 3 and shape[0] == frame_stack:
                shape, low, high = shape[1:], low[0], high[0]
            return Field(shape, dtype, stack=frame_stack, padding=padding)
        if is_image:
            return Field(shape, dtype)
        if box_bounds and np.all(np.isfinite(low)) and np.all(np.isfinite(high)):
            return Field(shape, dtype, low=_compact(low), high=_compact(high))
        return Field(shape, dtype)
    raise SpecError(f"unsupported space {name}: expected Box, Discrete, MultiDiscrete, "
                    "MultiBinary, Dict or Tuple")


def _compact(a: np.ndarray) -> Any:
    a = np.asarray(a, dtype=np.float64)
    return float(a.flat[0]) if a.size and np.all(a == a.flat[0]) else a
