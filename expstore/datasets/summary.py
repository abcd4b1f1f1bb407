"""What an import or export did: :class:`ImportSummary` (counts, time, notes)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ImportSummary:
    """What an import or export did (counts in rows / steps / episodes, time in s)."""

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

    def __str__(self) -> str:
        rate = self.steps / self.seconds if self.seconds else float("nan")
        lines = [f"{self.source} -> {self.target}: {self.steps:,} steps, {self.rows:,} rows, "
                 f"{self.episodes:,} episodes, {self.lanes} lane(s) in {self.seconds:.1f} s "
                 f"({rate:,.0f} steps/s)"]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)
