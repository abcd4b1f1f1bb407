"""Helpers for expstore's reliability tests and soak scripts (not part of the public API).

``data``: deterministic row content derived from ``(lane, step, session)`` and checkers that
recompute every byte; ``crash``: a writer process that can be killed anywhere and a harness
that kills it and verifies what survived; ``concurrent``: reader processes (samplers,
DataLoader workers) checking every sample while a writer wraps the ring; ``episodes``:
episodes written into a store and a plain reference model of what samplers may return;
``backend``: the conformance suite every storage backend passes (:class:`BackendTests`);
``sampler``: the one every sampler passes (:class:`SamplerTests`, over ``SAMPLER_CASES``);
``s3``: a moto S3 server (:class:`MotoServer`) and a TCP proxy that cuts connections
(:class:`TcpProxy`); ``gcs``: local GCS servers (:class:`GCSEmulator`); ``azure``: azurite
(:class:`Azurite`).

The helper modules and their names below load on first use (``from expstore.testing import
EpisodeWriter``): importing this package imports neither the store nor pytest.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

#: helper modules (``from expstore.testing import crash, data``), loaded on first use
_MODULES = ("azure", "backend", "concurrent", "crash", "data", "episodes", "gcs", "s3",
            "sampler")
#: public name -> the helper module that defines it
_NAMES = {
    "BackendTests": "backend",
    **dict.fromkeys(("SAMPLER_CASES", "SamplerCase", "SamplerTests"), "sampler"),
    **dict.fromkeys(("LANE", "POS", "STEP", "UID", "EpisodeWriter", "Row", "ident_spec",
                     "ref_sequence", "ref_transition"), "episodes"),
    **dict.fromkeys(("MotoServer", "TcpProxy", "create_bucket", "free_port", "s3_options"),
                    "s3"),
    "GCSEmulator": "gcs",
    "Azurite": "azure",
}

__all__ = sorted(["scratch_dir", *_MODULES, *_NAMES])


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
