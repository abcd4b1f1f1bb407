"""Dataset formats by name, for the CLI and ``expstore.datasets.get_format``.

Each format names a module and its ``import_<fmt>(src, url, **options)`` /
``export_<fmt>(url_or_store, dst, **options)`` functions; modules are imported only when a
format is used, so optional dependencies (h5py, minari) stay optional. Register more with
:func:`register`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Format:
    name: str
    module: str
    importer: str
    exporter: str
    help: str = ""

    def functions(self) -> tuple[Callable, Callable]:
        """``(import_fn, export_fn)``; a clear ``ImportError`` if the module is missing."""
        try:
            mod = importlib.import_module(self.module)
        except ModuleNotFoundError as e:
            if e.name and self.module.startswith(e.name):
                raise ImportError(f"format {self.name!r}: module {self.module} is not "
                                  "available in this expstore") from e
            raise ImportError(f"format {self.name!r} needs {e.name} (not installed)") from e
        return getattr(mod, self.importer), getattr(mod, self.exporter)


FORMATS: dict[str, Format] = {}


def register(name: str, module: str, importer: str, exporter: str, help: str = "") -> None:
    """Add (or replace) a format."""
    FORMATS[name] = Format(name, module, importer, exporter, help)


def get_format(name: str) -> Format:
    if name not in FORMATS:
        raise KeyError(f"unknown dataset format {name!r}; known: {', '.join(sorted(FORMATS))}")
    return FORMATS[name]


register("dopamine", "expstore.datasets.dopamine", "import_dopamine", "export_dopamine",
         "Dopamine replay checkpoints / DQN Replay Dataset (folder of *_ckpt.N.gz)")
register("d4rl", "expstore.datasets.d4rl", "import_d4rl", "export_d4rl",
         "D4RL HDF5 file (observations, actions, rewards, terminals, timeouts, ...)")
register("npz", "expstore.datasets.npz", "import_npz", "export_npz",
         "one .npz file with every row (small data)")
register("minari", "expstore.datasets.minari", "import_minari", "export_minari",
         "Minari dataset (id or directory)")
