"""expstore: disk-backed RL experience on zarr v3, a RAM priority index, DataLoader streaming.

>>> import expstore as es
>>> store = es.create("runs/demo.zarr", spec, capacity=1_000_000)
>>> store.add(obs=o, action=a, reward=r, next_obs=o2, terminated=t, truncated=u)
>>> batch = store.sample(32)
"""

from .api import create, open  # noqa: A004
from .errors import (
    ExpstoreError,
    LeaseUnsupportedError,
    NotEnoughData,
    ReadOnlyError,
    SpecError,
    StaleBatchError,
    StorageError,
    StoreCorruptError,
    StoreLockedError,
    StoreNotFoundError,
    ValidationError,
    WriteFailedError,
)
from .field import Field
from .sampling import (
    HERSampler,
    MixtureSampler,
    PrioritizedSampler,
    ReaderView,
    Sampler,
    SequenceSampler,
    UniformSampler,
)
from .spec import Spec
from .storage.format import round_capacity
from .store import Store

__version__ = "0.1.0"

__all__ = [
    "ExpstoreError",
    "LoaderStats",
    "StoreLoader",
    "make_loader",
    "Field",
    "NotEnoughData",
    "ReaderView",
    "StaleBatchError",
    "LeaseUnsupportedError",
    "ReadOnlyError",
    "Sampler",
    "Spec",
    "SpecError",
    "Store",
    "StoreCorruptError",
    "StoreLockedError",
    "StoreNotFoundError",
    "StorageError",
    "WriteFailedError",
    "UniformSampler",
    "PrioritizedSampler",
    "SequenceSampler",
    "HERSampler",
    "MixtureSampler",
    "Replay",
    "PrioritizedReplay",
    "OnPolicyReplay",
    "OnPolicyBatchReplay",
    "make_memory",
    "ValidationError",
    "create",
    "open",
    "round_capacity",
    "RecordToStore",
    "RecordVectorToStore",
]


_SLM_LAB = ("Replay", "PrioritizedReplay", "OnPolicyReplay", "OnPolicyBatchReplay",
            "make_memory")


def __getattr__(name: str):
    """``RecordToStore`` imports gymnasium, the loader imports torch, the SLM Lab memories
    load on use too."""
    if name in ("LoaderStats", "StoreLoader", "make_loader"):
        from .loading import loader as _loader

        return getattr(_loader, name)
    if name in _SLM_LAB:
        from .integrations import slm_lab as _slm_lab

        return getattr(_slm_lab, name)
    if name in ("RecordToStore", "RecordVectorToStore"):
        from .integrations import gym as _gym

        return getattr(_gym, name)
    raise AttributeError(f"module 'expstore' has no attribute {name!r}")
