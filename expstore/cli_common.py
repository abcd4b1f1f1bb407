"""What the ``expstore`` commands share (``cli.py``): bad-usage errors (exit code 2), the
``KEY=VALUE`` options of ``-o``/``-S``, byte counts for people, the progress bar, exit codes.
"""

from __future__ import annotations

import json
import sys
from typing import Any

EXIT_INTERRUPTED = 130


def usage_error(msg: str) -> None:
    """Bad usage: the message on stderr, exit code 2 (as argparse does)."""
    print(f"expstore: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def parse_kv(items: list[str] | None, flag: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            usage_error(f"{flag} {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def human(n: float) -> str:
    from .datasets.summary import human_bytes

    return human_bytes(n)


class ProgressBar:
    """A progress bar (rows, total set once known, ETA; plain lines when stderr is not a
    terminal), or nothing when ``quiet``."""

    def __init__(self, desc: str, quiet: bool) -> None:
        self._bar = None
        if not quiet:
            from .datasets.progress import progress_bar

            self._bar = progress_bar(desc)

    def total(self, n: int) -> None:
        if self._bar is not None:
            self._bar.total = n
            self._bar.refresh()

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()
