"""Gymnasium spaces <-> expstore fields, both directions.

* space -> fields: :func:`fields_from_space` (what ``Spec.from_spaces`` uses);
* spec -> space: :func:`space_from_spec` (what an export declares, e.g. to Minari);
* compact JSON of a space (:func:`space_to_json` / :func:`space_from_json`), so a store
  imported from a dataset remembers the dataset's own spaces (exact bounds);
* :func:`check_space`, :func:`same_layout`.

Spaces are matched like ``isinstance``: a subclass of ``gymnasium.spaces.Box`` is a Box
(:func:`space_kind` walks the class's bases, so gymnasium is imported only to build spaces).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from .errors import SpecError
from .field import Field

LEAF_SPACES = ("Box", "Discrete", "MultiDiscrete", "MultiBinary")
KNOWN_SPACES = (*LEAF_SPACES, "Dict", "Tuple")


def space_kind(space: Any) -> str:
    """The Gymnasium space class ``space`` is an instance of (``"Box"``, ``"Dict"``, ...):
    the first of its class and bases that is a gymnasium (or gym) space class; for other
    objects, their own class name."""
    for cls in type(space).__mro__:
        if cls.__name__ in KNOWN_SPACES and cls.__module__.split(".")[0] in ("gymnasium", "gym"):
            return cls.__name__
    return type(space).__name__


class SpecLike(Protocol):
    """What :func:`space_from_spec` reads of a :class:`~expstore.spec.Spec`."""

    @property
    def fields(self) -> Mapping[str, Field]: ...

    @property
    def structure(self) -> Mapping[str, Any]: ...


# -- space -> fields -----------------------------------------------------------------------
def fields_from_space(
    space: Any, frame_stack: int | None = None, padding: str = "reset", box_bounds: bool = True
) -> dict[str, Field]:
    """Flatten a space into ``{key: Field}``; a non-composite space gives ``{"": Field}``.

    ``box_bounds=False`` drops Box bounds (observation Boxes: real envs often leave them).
    """
    name = space_kind(space)
    if name == "Dict":
        out: dict[str, Field] = {}
        for k, sub in space.spaces.items():
            out[str(k)] = _leaf_field(sub, frame_stack, padding, box_bounds)
        return out
    if name == "Tuple":
        return {str(i): _leaf_field(sub, frame_stack, padding, box_bounds)
                for i, sub in enumerate(space.spaces)}
    return {"": _leaf_field(space, frame_stack, padding, box_bounds)}


def _leaf_field(space: Any, frame_stack: int | None, padding: str, box_bounds: bool) -> Field:
    name = space_kind(space)
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


# -- compact JSON (uniform Box bounds as scalars; inf as strings like Spec.to_json) --------
def space_to_json(space: Any) -> dict[str, Any]:
    """Compact, strict-JSON description of a Box/Discrete/Multi*/Dict/Tuple space."""
    kind = space_kind(space)
    if kind == "Dict":
        return {"type": "Dict", "spaces": {str(k): space_to_json(s)
                                           for k, s in space.spaces.items()}}
    if kind == "Tuple":
        return {"type": "Tuple", "spaces": [space_to_json(s) for s in space.spaces]}
    if kind == "Box":
        return {"type": "Box", "shape": list(space.shape), "dtype": np.dtype(space.dtype).str,
                "low": _bound(space.low), "high": _bound(space.high)}
    if kind == "Discrete":
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if kind == "MultiDiscrete":
        return {"type": "MultiDiscrete", "nvec": np.asarray(space.nvec).tolist(),
                "start": np.asarray(space.start).tolist(), "dtype": np.dtype(space.dtype).str}
    if kind == "MultiBinary":
        n = space.n
        return {"type": "MultiBinary", "n": int(n) if np.isscalar(n) else list(n)}
    raise SpecError(f"unsupported space {kind}: expected Box, Discrete, MultiDiscrete, "
                    "MultiBinary, Dict or Tuple")


def space_from_json(d: dict[str, Any]) -> Any:
    from gymnasium import spaces

    t = d["type"]
    if t == "Dict":
        return spaces.Dict({k: space_from_json(v) for k, v in d["spaces"].items()})
    if t == "Tuple":
        return spaces.Tuple([space_from_json(v) for v in d["spaces"]])
    if t == "Box":
        dt, shape = np.dtype(d["dtype"]), tuple(d["shape"])
        return spaces.Box(_unbound(d["low"], dt, shape), _unbound(d["high"], dt, shape),
                          shape, dt)
    if t == "Discrete":
        return spaces.Discrete(d["n"], start=d["start"])
    if t == "MultiDiscrete":
        return spaces.MultiDiscrete(d["nvec"], dtype=d["dtype"], start=d["start"])
    if t == "MultiBinary":
        return spaces.MultiBinary(d["n"])
    raise SpecError(f"unknown space type {t!r} in stored space description")


def _bound(a: np.ndarray) -> Any:
    a = np.asarray(a)
    vals = a.astype(np.float64) if a.dtype.kind == "f" else a
    flat = vals.flat[0] if a.size and np.all(vals == vals.flat[0]) else None
    if flat is not None:
        return _num(flat)
    return [_num(x) for x in vals.reshape(-1).tolist()]


def _num(x: Any) -> Any:
    x = x.item() if hasattr(x, "item") else x
    if isinstance(x, float) and not np.isfinite(x):
        return "inf" if x > 0 else ("-inf" if x < 0 else "nan")
    return x


def _unbound(v: Any, dt: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if isinstance(v, list):
        v = [float(x) if isinstance(x, str) else x for x in v]
    elif isinstance(v, str):
        v = float(v)
    a = np.asarray(v, dtype=np.float64 if dt.kind == "f" else dt).astype(dt)
    return np.array(np.broadcast_to(a.reshape(shape) if a.ndim else a, shape))


def check_space(space: Any, what: str) -> None:
    """Raise a clear SpecError unless ``space`` is a leaf or one level of Dict/Tuple."""
    kind = space_kind(space)
    subs = (list(space.spaces.items()) if kind == "Dict" else
            list(enumerate(space.spaces)) if kind == "Tuple" else None)
    if subs is None:
        if kind not in LEAF_SPACES:
            raise SpecError(f"{what}: space {kind} is not supported (expected Box, Discrete, "
                            "MultiDiscrete, MultiBinary, or a Dict/Tuple of those)")
        return
    for k, sub in subs:
        sk = space_kind(sub)
        if sk not in LEAF_SPACES:
            raise SpecError(f"{what}: {kind} entry {k!r} is a {sk}; expstore stores one level "
                            "of Dict/Tuple whose entries are Box, Discrete, MultiDiscrete or "
                            "MultiBinary")


# -- spec -> spaces --------------------------------------------------------------------
def space_from_spec(spec: SpecLike, prefix: str, stacked: bool = False) -> Any:
    """Gymnasium space of ``obs``/``action`` as an export writes it.

    Stacked fields give one frame (``stacked=False``) or ``(k, *shape)`` stacks. When the
    spec remembers the space it was imported from and that space has the same layout,
    it is returned instead (exact bounds, Discrete ``start``).
    """
    from gymnasium import spaces

    st = spec.structure.get(prefix, {"kind": "single"})
    if st["kind"] == "single":
        derived = _leaf_space(spec.fields[prefix], st.get("space"), stacked)
    else:
        subs = {k: _leaf_space(spec.fields[f"{prefix}.{k}"], None, stacked)
                for k in st["keys"]}
        if st.get("space") == "Tuple" and list(subs) == [str(i) for i in range(len(subs))]:
            derived = spaces.Tuple(list(subs.values()))
        else:
            derived = spaces.Dict(subs)
    saved = st.get("gym")
    if saved is not None:
        orig = space_from_json(saved)
        if same_layout(orig, derived):
            return orig
    return derived


def _leaf_space(f: Field, hint: str | None, stacked: bool) -> Any:
    from gymnasium import spaces

    stack = bool(stacked and f.stack)
    shape = ((f.stack,) + f.shape) if stack else f.shape
    dt = f.dtype
    lo, hi = f.low, f.high
    if not stack and dt.kind in "iu" and lo is not None and hi is not None and hint != "Box":
        lo_a, hi_a = np.asarray(lo), np.asarray(hi)
        if f.shape == () and hint in (None, "Discrete"):
            return spaces.Discrete(int(hi_a) - int(lo_a) + 1, start=int(lo_a))
        if f.shape and dt == np.int8 and np.all(lo_a == 0) and np.all(hi_a == 1) \
                and hint in (None, "MultiBinary"):
            return spaces.MultiBinary(list(f.shape) if len(f.shape) > 1 else f.shape[0])
        if f.shape and hint in (None, "MultiDiscrete"):
            lo_i = np.broadcast_to(lo_a.astype(np.int64), f.shape)
            hi_i = np.broadcast_to(hi_a.astype(np.int64), f.shape)
            return spaces.MultiDiscrete(hi_i - lo_i + 1, dtype=dt, start=lo_i)
    if dt.kind == "f":
        low = -np.inf if lo is None else lo
        high = np.inf if hi is None else hi
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        low = info.min if lo is None else lo
        high = info.max if hi is None else hi
    elif dt.kind == "b":
        low, high = False, True
    else:
        raise SpecError(f"a field of dtype {dt} has no Gymnasium space")
    low = np.broadcast_to(np.broadcast_to(np.asarray(low).astype(dt), f.shape), shape)
    high = np.broadcast_to(np.broadcast_to(np.asarray(high).astype(dt), f.shape), shape)
    return spaces.Box(np.array(low), np.array(high), shape, dt)


def same_layout(a: Any, b: Any) -> bool:
    """Same space types, keys, shapes and dtypes (bounds may differ)."""
    ka, kb = space_kind(a), space_kind(b)
    if ka != kb:
        return False
    if ka == "Dict":
        return list(a.spaces) == list(b.spaces) and all(
            same_layout(a.spaces[k], b.spaces[k]) for k in a.spaces)
    if ka == "Tuple":
        return len(a.spaces) == len(b.spaces) and all(
            same_layout(x, y) for x, y in zip(a.spaces, b.spaces, strict=True))
    if ka == "Discrete":
        return int(a.n) == int(b.n)
    return tuple(a.shape) == tuple(b.shape) and np.dtype(a.dtype) == np.dtype(b.dtype)
