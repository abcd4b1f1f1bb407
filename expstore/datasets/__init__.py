"""Offline datasets <-> stores: D4RL, Minari, Dopamine (DQN Replay), npz, RLDS.

Every format is one module (or subpackage) with ``import_<fmt>(src, url, **options)`` and
``export_<fmt>(url_or_store, dst, **options)``, registered by name in
:mod:`~expstore.datasets.registry`. Those functions are names of this package too, loaded
with their module on first use (optional dependencies such as h5py and minari stay
optional): ``from expstore.datasets import import_d4rl``. The lanes and episodes of a store
as formats see them (:mod:`~expstore.datasets.episodes`) are names here too.
"""

from __future__ import annotations

from typing import Any

from .episodes import LaneRows, capacity_for, lane_rows, store_episodes
from .registry import FORMATS, Format, get_format, register
from .summary import ImportSummary

__all__ = ["FORMATS", "Format", "ImportSummary", "LaneRows", "capacity_for", "get_format",
           "lane_rows", "register", "store_episodes",
           *sorted(n for f in FORMATS.values() for n in (f.importer, f.exporter))]


def __getattr__(name: str) -> Any:
    for f in FORMATS.values():
        if name in (f.importer, f.exporter):
            import_fn, export_fn = f.functions()
            return import_fn if name == f.importer else export_fn
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
