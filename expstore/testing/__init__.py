"""Helpers for expstore's reliability tests and soak scripts (not part of the public API).

``data``: deterministic row content derived from ``(lane, step, session)`` and checkers that
recompute every byte; ``crash``: a writer process that can be killed anywhere and a harness
that kills it and verifies what survived; ``concurrent``: reader processes (samplers,
DataLoader workers) checking every sample while a writer wraps the ring.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def scratch_dir(fallback: str | None = None) -> Iterator[str]:
    """A temporary folder in RAM (``/dev/shm``) when there is one, else under ``fallback``.

    Process kills behave the same on tmpfs as on disk (the page cache survives them), and
    ``fsync`` costs nothing there, so crash and concurrency tests run many more rounds.
    """
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    path = tempfile.mkdtemp(prefix="expstore-", dir=base or fallback)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
