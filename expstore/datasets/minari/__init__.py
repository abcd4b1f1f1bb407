"""Minari offline-RL datasets <-> expstore stores (hdf5 and arrow data formats).

>>> from expstore.datasets.minari import export_minari, import_minari
>>> info = export_minari("runs/pong.zarr", "expstore/pong-v0")   # minari.load_dataset reads it
>>> store = import_minari("expstore/pong-v0", "runs/pong2.zarr")

How an episode of ``T`` steps maps (Minari's layout is observation-aligned, like rows):

* ``observations[0..T]`` are the ``obs`` fields of the episode's ``T + 1`` rows (row ``T``
  is the store's final row); ``actions``, ``rewards``, ``terminations``, ``truncations``
  ``[0..T-1]`` are rows ``0..T-1``.
* ``infos`` (``T + 1`` values per key, as ``DataCollector`` records them: the reset info,
  then each step's) are user fields ``info.<key>`` (nested dicts ``info.<a>.<b>``) on all
  ``T + 1`` rows. On export every user field becomes an info: an ``info.`` prefix is
  dropped and ``.`` nests (``logp`` -> ``infos["logp"]``).
* Frame stacks: a field with ``stack=k`` is exported one frame per observation (its
  stored form; lossless and ``k`` times smaller), or as ``(k, *shape)`` stacks with
  ``stacked=True`` (what ``FrameStackObservation`` returns). ``import_minari(...,
  frame_stack=k)`` stores stacked observations one frame per row after checking that
  every stack is the previous one shifted by a frame (else it refuses).
* Only complete episodes are exported (first row to final row intact in one lane), lane
  by lane in step order. Episode seeds/options are not kept by a store.

Pixels stay exact by default: the export writes chunked hdf5 datasets with the gzip
filter (or arrow with zstd buffer compression), which ``minari`` reads with no plugin;
``jpeg_encoding=True`` gives Minari's own lossy JPEG output instead.
"""

from ..episodes import store_episodes
from .export import MinariExport, export_minari
from .importer import import_minari

__all__ = ["MinariExport", "export_minari", "import_minari", "store_episodes"]
