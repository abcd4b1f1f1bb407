"""What an import or export did: :class:`ImportSummary` (counts, bytes, time, notes), printed
in one style for every format, and :func:`human_bytes` (decimal units: 1 MB = 10**6 bytes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..storage import backend_for

_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def human_bytes(n: float) -> str:
    """``n`` bytes in decimal (SI) units: ``"999 B"``, ``"18.4 MB"`` (1 MB = 10**6 B)."""
    n = float(n)
    for unit in _UNITS:
        if abs(n) < 1000 or unit == _UNITS[-1]:
            return f"{int(n):,} B" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    raise AssertionError  # pragma: no cover


def store_bytes(url: Any, storage_options: Any = None) -> int:
    """Bytes the store at ``url`` takes on its storage (blocks allocated, on local disk)."""
    backend = backend_for(os.fspath(url), storage_options, fsync=False)
    try:
        return int(backend.total_bytes())
    finally:
        backend.close()


@dataclass
class ImportSummary:
    """What an import or export did: counts in rows / steps / episodes, sizes in bytes,
    time in s. ``notes`` say what was left out or changed, and why."""

    source: str
    target: str
    rows: int = 0  # store rows written (steps + final rows) or file rows written
    steps: int = 0  # env steps (transitions incl. the open ones)
    episodes: int = 0  # finished episodes
    lanes: int = 0
    seconds: float = 0.0
    bytes_in: int = 0  # raw (decompressed) bytes read from the source
    notes: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    kind: str = ""  # what ran, e.g. "d4rl import", "npz export"
    bytes_out: int = 0  # bytes written (on disk / storage; 0 when unknown)

    @property
    def rate(self) -> float:
        """Steps per second (NaN when no time passed)."""
        return self.steps / self.seconds if self.seconds > 0 else float("nan")

    def __str__(self) -> str:
        head = f"{self.kind}: " if self.kind else ""
        lines = [f"{head}{self.source} -> {self.target}",
                 f"  {self.steps:,} steps, {self.rows:,} rows, {self.episodes:,} episodes, "
                 f"{self.lanes} lane(s)"]
        sizes = []
        if self.bytes_in:
            sizes.append(f"{human_bytes(self.bytes_in)} raw")
        if self.bytes_out:
            sizes.append(f"{human_bytes(self.bytes_out)} written")
        speed = f"{self.rate:,.0f} steps/s" if self.seconds > 0 else "-"
        if self.seconds > 0 and self.bytes_in:
            speed += f", {human_bytes(self.bytes_in / self.seconds)}/s"
        lines.append(f"  {', '.join(sizes) + ' ' if sizes else ''}in {self.seconds:.1f} s "
                     f"({speed})")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)
