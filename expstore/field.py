"""One per-step array of a store: :class:`Field` (shape, dtype, bounds, stacking, codec)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import SpecError

#: lz4, not lz4hc: 4-8 µs to encode an 84x84 frame against 40-45 µs (the append path's
#: bottleneck), for ~25% more bytes (benchmarks/RESULTS.md, "Core store").
DEFAULT_IMAGE_CODEC: dict[str, Any] = {"name": "blosc", "cname": "lz4", "clevel": 5}
DEFAULT_SMALL_CODEC: dict[str, Any] = {"name": "blosc", "cname": "lz4", "clevel": 5}
#: what a write may do with a value outside a field's bounds (``Field.out_of_bounds``)
OUT_OF_BOUNDS = ("raise", "clip", "warn")


@dataclass(frozen=True)
class Field:
    """One per-step array: ``shape`` excludes the row axis.

    ``low``/``high`` are inclusive bounds checked on every write (scalars or arrays of
    ``shape``); ``stack=k`` stores one frame per row and returns ``(k, *shape)`` stacks
    padded at episode start with the first frame (``padding="reset"``) or zeros.
    ``codec`` is a numcodecs-style dict (``{"name": "blosc", "cname": "lz4hc", "clevel": 5}``
    or ``{"name": "zstd", "level": 1}``); ``chunk_rows`` is rows per inner chunk
    (default: 1 for image-sized fields, the whole shard for small ones).

    ``out_of_bounds``: what a write does with a value outside ``low``/``high``: ``"raise"``
    (the default: :class:`~expstore.errors.ValidationError`, nothing stored), ``"clip"``
    (stored clipped to the bounds, e.g. continuous actions a float epsilon outside a Box)
    or ``"warn"`` (a warning, once per field, then stored as given).
    """

    shape: tuple[int, ...] = ()
    dtype: Any = "float32"
    low: Any = None
    high: Any = None
    stack: int | None = None
    padding: str = "reset"
    codec: dict[str, Any] | None = None
    chunk_rows: int | None = None
    out_of_bounds: str = "raise"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        if self.stack is not None and (int(self.stack) < 1):
            raise SpecError(f"Field.stack: expected an int >= 1, got {self.stack!r}")
        if self.padding not in ("reset", "zero"):
            raise SpecError(f"Field.padding: expected 'reset' or 'zero', got {self.padding!r}")
        for name in ("low", "high"):
            v = getattr(self, name)
            if v is not None:
                arr = np.asarray(v)
                if arr.shape not in ((), self.shape):
                    raise SpecError(
                        f"Field.{name}: expected a scalar or shape {self.shape}, got {arr.shape}"
                    )
        if self.low is not None and self.high is not None:
            low, high = np.broadcast_arrays(np.asarray(self.low), np.asarray(self.high))
            bad = np.argwhere(low > high)
            if len(bad):
                at = tuple(bad[0].tolist())
                where = f" at {at}" if at else ""
                raise SpecError(f"Field.low/high: low {low[at]} is above high {high[at]}{where} "
                                "(expected low <= high)")
        if self.out_of_bounds not in OUT_OF_BOUNDS:
            raise SpecError(f"Field.out_of_bounds: expected one of {list(OUT_OF_BOUNDS)}, got "
                            f"{self.out_of_bounds!r}")

    @property
    def row_nbytes(self) -> int:
        """Bytes of one row, uncompressed."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def is_image(self) -> bool:
        """Large per-row payloads (>= 1 KiB) get one-row inner chunks and the image codec."""
        return self.row_nbytes >= 1024

    def resolved_codec(self) -> dict[str, Any]:
        return dict(self.codec or (DEFAULT_IMAGE_CODEC if self.is_image else DEFAULT_SMALL_CODEC))

    def to_json(self) -> dict[str, Any]:
        def b(v: Any) -> Any:
            if v is None:
                return None
            a = np.asarray(v, dtype=np.float64)
            return _json_float(a.tolist()) if a.ndim else _json_float(float(a))

        return {
            "shape": list(self.shape),
            "dtype": self.dtype.str,
            "low": b(self.low),
            "high": b(self.high),
            "stack": self.stack,
            "padding": self.padding,
            "codec": self.resolved_codec(),
            "chunk_rows": self.chunk_rows,
            "out_of_bounds": self.out_of_bounds,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Field:
        def b(v: Any) -> Any:
            return None if v is None else np.asarray(_unjson_float(v), dtype=np.float64)

        return cls(
            shape=tuple(d["shape"]),
            dtype=np.dtype(d["dtype"]),
            low=b(d.get("low")),
            high=b(d.get("high")),
            stack=d.get("stack"),
            padding=d.get("padding", "reset"),
            codec=d.get("codec"),
            chunk_rows=d.get("chunk_rows"),
            out_of_bounds=d.get("out_of_bounds", "raise"),  # stores made before the option
        )


def _json_float(v: Any) -> Any:
    if isinstance(v, list):
        return [_json_float(x) for x in v]
    if isinstance(v, float) and not np.isfinite(v):
        return "inf" if v > 0 else ("-inf" if v < 0 else "nan")
    return v


def _unjson_float(v: Any) -> Any:
    if isinstance(v, list):
        return [_unjson_float(x) for x in v]
    return float(v) if isinstance(v, str) else v
