"""Stable-Baselines3 integration: replay buffers on an expstore store, and prioritized DQN.

>>> from expstore.integrations.sb3 import ExpstoreReplayBuffer
>>> model = DQN("MlpPolicy", env, replay_buffer_class=ExpstoreReplayBuffer,
...             replay_buffer_kwargs={"url": "runs/dqn.zarr"})

Requires ``stable-baselines3`` (``pip install expstore[sb3]``).
"""

from .buffer import ExpstoreReplayBuffer
from .convert import ExpstoreSamples, sb3_spec
from .per import PrioritizedDQN, PrioritizedExpstoreReplayBuffer

__all__ = [
    "ExpstoreReplayBuffer",
    "ExpstoreSamples",
    "PrioritizedDQN",
    "PrioritizedExpstoreReplayBuffer",
    "sb3_spec",
]
