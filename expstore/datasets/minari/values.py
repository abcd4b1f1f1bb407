"""Nested values for Minari: trees of arrays (array, dict, tuple) and frame stacks.

A store keeps flat fields (``obs``, ``obs.<key>``, ...); Minari episodes hold nested
values shaped like their Gymnasium spaces. These helpers convert between the two.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...spec import Spec


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: tree_map(fn, v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(tree_map(fn, v) for v in tree)
    return fn(tree)


def tree_from_fields(spec: Spec, prefix: str, flat: dict[str, np.ndarray], space: Any) -> Any:
    """Nested value (array, dict, tuple) of ``prefix`` from flat field arrays, cast to the
    dtypes of ``space``'s leaves."""
    st = spec.structure.get(prefix, {"kind": "single"})

    def cast(arr: np.ndarray, sp: Any) -> np.ndarray:
        dt = np.dtype(sp.dtype) if sp.dtype is not None else arr.dtype
        return arr if arr.dtype == dt else arr.astype(dt)

    if st["kind"] == "single":
        return cast(flat[prefix], space)
    if type(space).__name__ == "Tuple":
        return tuple(cast(flat[f"{prefix}.{k}"], space.spaces[i])
                     for i, k in enumerate(st["keys"]))
    return {k: cast(flat[f"{prefix}.{k}"], space.spaces[k]) for k in st["keys"]}


def stack_frames(frames: np.ndarray, k: int, padding: str) -> np.ndarray:
    """``(n, *shape)`` frames of one episode -> ``(n, k, *shape)`` stacks, oldest first;
    before the episode start the first frame repeats (``"reset"``) or zeros (``"zero"``)."""
    n = len(frames)
    idx = np.arange(n)[:, None] - (k - 1) + np.arange(k)[None, :]
    out = frames[np.maximum(idx, 0)]
    if padding == "zero":
        out[idx < 0] = 0
    return out
