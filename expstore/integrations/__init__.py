"""Bridges to the libraries people train with: ``sb3`` (Stable-Baselines3 buffers and
prioritized DQN), ``gym`` (:class:`RecordToStore`), ``torchrl`` (storage / TensorDict),
``slm_lab`` (SLM Lab memories); ``step_writer`` is what they share.

Each bridge imports its library on import; this package imports none of them: the names
below load their submodule on first use (``from expstore.integrations import
RecordToStore`` imports gymnasium then).
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> submodule that defines it
_NAMES = {
    **dict.fromkeys(("RecordToStore", "RecordVectorToStore"), "gym"),
    **dict.fromkeys(("ExpstoreReplayBuffer", "ExpstoreSamples", "PrioritizedDQN",
                     "PrioritizedExpstoreReplayBuffer", "sb3_spec"), "sb3"),
    **dict.fromkeys(("ExpstoreSampler", "ExpstoreStorage", "ExpstoreWriter", "replay_buffer",
                     "spec_from_env", "to_tensordict"), "torchrl"),
    **dict.fromkeys(("Replay", "PrioritizedReplay", "OnPolicyReplay", "OnPolicyBatchReplay",
                     "make_memory"), "slm_lab"),
    **dict.fromkeys(("StepWriter", "open_or_create"), "step_writer"),
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
