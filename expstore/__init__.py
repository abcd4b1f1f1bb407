"""expstore: disk-backed RL experience on zarr v3, a RAM priority index, DataLoader streaming.

>>> import expstore as es
>>> store = es.create("runs/demo.zarr", spec, capacity=1_000_000)
>>> store.add(obs=o, action=a, reward=r, next_obs=o2, terminated=t, truncated=u)
>>> batch = store.sample(32)
"""

from .errors import (
    ExpstoreError,
    ReadOnlyError,
    SpecError,
    StoreCorruptError,
    StoreLockedError,
    ValidationError,
)
from .loading.loader import LoaderStats, StoreLoader, make_loader
from .sampling import NotEnoughData, Sampler, UniformSampler
from .spec import Field, Spec
from .storage.layout import round_capacity
from .store import Store, create, open  # noqa: A004

__version__ = "0.1.0"

__all__ = [
    "ExpstoreError",
    "LoaderStats",
    "StoreLoader",
    "make_loader",
    "Field",
    "NotEnoughData",
    "ReadOnlyError",
    "Sampler",
    "Spec",
    "SpecError",
    "Store",
    "StoreCorruptError",
    "StoreLockedError",
    "UniformSampler",
    "ValidationError",
    "create",
    "open",
    "round_capacity",
]
