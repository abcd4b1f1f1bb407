"""LeRobot v3.0 datasets (Parquet + MP4, ``meta/info.json``) <-> expstore.

:func:`import_lerobot` streams a dataset root (local or any fsspec URL) into a store, one
frame a step; :func:`export_lerobot` writes a store as a dataset root that LeRobot's own
``LeRobotDataset(repo_id, root=...)`` loads, cameras as PNG in parquet (lossless, default)
or MP4 (``video=True``, lossy). The layout is described in :mod:`.layout`, the field
mapping in :mod:`.mapping`.
"""

from __future__ import annotations

from .export import export_lerobot
from .importer import import_lerobot

__all__ = ["export_lerobot", "import_lerobot"]
