"""Bridges to the libraries people train with: ``sb3`` (Stable-Baselines3 buffers and
prioritized DQN), ``gym`` (:class:`RecordToStore`), ``torchrl`` (storage / TensorDict).

Each submodule imports its library on import; this package imports none of them.
"""
