"""Rows whose bytes are lost (found by ``verify``, marked by ``repair``): never sampled.

One small JSON object, ``_state/quarantine.json``: per lane, sorted disjoint ranges
``[start, stop)`` of lane steps. Lane steps are never reused, so the ranges stay right
across wrap-around (a row rewritten in a later lap has a new step and is fine) and ranges
below a lane's oldest intact step can be pruned. Only ``repair`` writes it (atomically,
with a checksum); a store reads it on open and on ``refresh()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...errors import StoreCorruptError
from ..backends import Backend
from .envelope import seal, unseal

QUARANTINE_KEY = "_state/quarantine.json"
QUARANTINE_VERSION = 1

Ranges = list[tuple[int, int]]


@dataclass
class Quarantine:
    """Lost lane steps: ``lanes[lane]`` = sorted, disjoint ``(start, stop)`` ranges."""

    lanes: dict[int, Ranges] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(self.lanes.values())

    def add(self, lane: int, start: int, stop: int) -> None:
        """Mark steps ``[start, stop)`` of ``lane`` lost (merged with what is there)."""
        if stop > start:
            self.lanes[lane] = _merge([*self.lanes.get(lane, []), (int(start), int(stop))])

    def release(self, lane: int, start: int, stop: int) -> None:
        """Steps ``[start, stop)`` of ``lane`` are no longer lost (found intact again)."""
        kept = []
        for a, b in self.lanes.get(lane, []):
            kept += [r for r in ((a, min(b, start)), (max(a, stop), b)) if r[1] > r[0]]
        if kept:
            self.lanes[lane] = kept
        else:
            self.lanes.pop(lane, None)

    def prune(self, lane: int, oldest: int) -> None:
        """Forget steps below ``oldest`` (overwritten anyway)."""
        self.release(lane, 0, oldest)

    def mask(self, lane: int, steps: np.ndarray) -> np.ndarray:
        """Which ``steps`` of ``lane`` are lost."""
        steps = np.asarray(steps, np.int64)
        out = np.zeros(steps.shape, bool)
        for a, b in self.lanes.get(lane, []):
            out |= (steps >= a) & (steps < b)
        return out

    def count(self, lane: int, lo: int, hi: int) -> int:
        """Lost steps of ``lane`` within ``[lo, hi)``."""
        return sum(max(0, min(b, hi) - max(a, lo)) for a, b in self.lanes.get(lane, []))

    def encode(self) -> bytes:
        return seal("quarantine", QUARANTINE_VERSION, {
            "lanes": {str(k): [list(r) for r in v] for k, v in sorted(self.lanes.items())}})

    @classmethod
    def decode(cls, raw: bytes, where: str) -> Quarantine:
        body = unseal(raw, "quarantine", QUARANTINE_VERSION, where, "quarantine file")
        try:
            lanes = {int(k): _merge([(int(a), int(b)) for a, b in v])
                     for k, v in body["lanes"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise StoreCorruptError(f"{where}: quarantine file is not valid ({e})") from e
        return cls({k: v for k, v in lanes.items() if v})


def _merge(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def read_quarantine(backend: Backend) -> Quarantine:
    """The store's quarantine (empty when there is none)."""
    raw = backend.get(QUARANTINE_KEY)
    if raw is None:
        return Quarantine()
    return Quarantine.decode(raw, f"{backend.url}/{QUARANTINE_KEY}")


def write_quarantine(backend: Backend, q: Quarantine) -> None:
    backend.put(QUARANTINE_KEY, q.encode())
